"""Where things go: results on stdout (rich for people, one JSON document with --json), logs and
progress on stderr (progress bars only when stderr is a terminal), errors as one line + exit code."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

stdout = Console(soft_wrap=True)
stderr = Console(stderr=True, soft_wrap=True)

_quiet = False


def set_quiet(value: bool) -> None:
    global _quiet
    _quiet = value


def log(message: str) -> None:
    if not _quiet:
        stderr.print(f"[dim]xformopt:[/dim] {message}", highlight=False, markup=True)


def error(message: str) -> None:
    """One line on stderr; the message is printed verbatim (no rich markup: paths may hold brackets)."""
    stderr.print("[bold red]error:[/bold red] ", end="", highlight=False)
    stderr.print(message, highlight=False, markup=False)


def emit_json(data: dict) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


@contextmanager
def progress_bars():
    """A progress callback (label, done, total) drawn on stderr when it is a terminal, else a no-op."""
    if _quiet or not stderr.is_terminal:
        yield lambda label, done, total: None
        return
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeRemainingColumn(), console=stderr, transient=True,
    ) as bars:
        tasks: dict[str, int] = {}

        def update(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = bars.add_task(label, total=total or None)
            bars.update(tasks[label], completed=done)

        yield update

