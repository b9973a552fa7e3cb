"""Where things go: results on stdout (rich for people, one JSON document with --json), logs and
progress on stderr (live bars when stderr is a terminal, periodic plain lines otherwise), errors
as one line + exit code."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from contextlib import contextmanager, nullcontext

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from xformopt import progress

stdout = Console(soft_wrap=True)
stderr = Console(stderr=True, soft_wrap=True)

_quiet = False


def set_quiet(value: bool) -> None:
    """-q: our log lines and bars, and also the bars huggingface_hub (hub downloads) and transformers
    (checkpoint shards) draw on stderr by themselves."""
    global _quiet
    _quiet = value
    _library_bars(enabled=not value)


_BARS_ENV = "HF_HUB_DISABLE_PROGRESS_BARS"
_bars_off_by_us: str | None = None  # how -q turned them off ("env" or "call"), to undo exactly that


def _library_bars(enabled: bool) -> None:
    """huggingface_hub reads HF_HUB_DISABLE_PROGRESS_BARS when imported (transformers follows its
    state); once imported, only its disable/enable calls count. huggingface_hub is not imported here
    just for this (seconds on a loaded host): the environment variable covers a later import."""
    global _bars_off_by_us
    if not enabled and _bars_off_by_us is None:
        if os.environ.get(_BARS_ENV) is not None:  # the user's own choice (1: already off; 0: hub refuses to)
            return
        if "huggingface_hub" not in sys.modules:
            os.environ[_BARS_ENV] = "1"
            _bars_off_by_us = "env"
            return
        from huggingface_hub.utils import (
            are_progress_bars_disabled,
            disable_progress_bars,
        )

        if are_progress_bars_disabled():
            return
        disable_progress_bars()
        if "transformers" in sys.modules:
            sys.modules["transformers"].utils.logging.disable_progress_bar()
        _bars_off_by_us = "call"
    elif enabled and _bars_off_by_us is not None:
        if _bars_off_by_us == "env":
            os.environ.pop(_BARS_ENV, None)
        if "huggingface_hub" in sys.modules:  # imported (off) since, or turned off by the call above
            from huggingface_hub.utils import enable_progress_bars

            if _bars_off_by_us == "env":  # it read our variable at import, into these two modules
                for name in ("huggingface_hub.constants", "huggingface_hub.utils.tqdm"):
                    if name in sys.modules:
                        sys.modules[name].HF_HUB_DISABLE_PROGRESS_BARS = None
            enable_progress_bars()
        if "transformers" in sys.modules:
            sys.modules["transformers"].utils.logging.enable_progress_bar()
        _bars_off_by_us = None


def log(message: str) -> None:
    if not _quiet:
        stderr.print(f"[dim]xformopt:[/dim] {message}", highlight=False, markup=True)


class _LogLines(logging.Handler):
    """Records of the ``xformopt`` logger (every module below the CLI logs there) as the CLI's own log
    lines, so -q silences them too; warnings say so."""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        log(f"warning: {message}" if record.levelno >= logging.WARNING else message)


def install_log_handler() -> None:
    """Route the ``xformopt`` logger to stderr through :func:`log` (once per process)."""
    logger = logging.getLogger("xformopt")
    if not any(isinstance(h, _LogLines) for h in logger.handlers):
        logger.addHandler(_LogLines())
        logger.setLevel(logging.INFO)
        logger.propagate = False


def error(message: str) -> None:
    """One line on stderr; the message is printed verbatim (no rich markup: paths may hold brackets)."""
    stderr.print("[bold red]error:[/bold red] ", end="", highlight=False)
    stderr.print(message, highlight=False, markup=False)


def emit_json(data: dict) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


class BarSink(progress.Sink):
    """Live rich bars with ETA on a terminal; started at the first report, stopped when no step is
    running, so log lines and results print normally in between."""

    interactive = True

    def __init__(self, console: Console):
        self.console, self.bars, self.tasks = console, None, {}

    def update(self, label: str, done: int, total: int | None, info: str = "") -> None:
        if _quiet:
            return
        if self.bars is None:
            self.bars = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=self.console,
                transient=True, redirect_stdout=False,
            )
            self.bars.start()
        if label not in self.tasks:
            self.tasks[label] = self.bars.add_task(label, total=total, info=info)
        self.bars.update(self.tasks[label], completed=done, total=total, info=info)
        if total is not None and done >= total:
            self.bars.remove_task(self.tasks.pop(label))
            if not self.tasks:
                self.close()

    def close(self) -> None:
        if self.bars is not None:
            self.bars.stop()
            self.bars, self.tasks = None, {}


class LineSink(progress.Sink):
    """Not a terminal (CI logs, pipes): one plain line per step every ``every`` seconds, so a long
    step is never silent, and none for a step that ends sooner."""

    def __init__(self, every: float):
        self.every = every
        self.started: dict[str, float] = {}
        self.last: dict[str, float] = {}

    def update(self, label: str, done: int, total: int | None, info: str = "") -> None:
        now = clock()
        start = self.started.setdefault(label, now)
        finished = total is not None and done >= total
        due = now - self.last.get(label, start) >= self.every
        if finished:  # a closing line only for a step that already printed one
            self.started.pop(label, None)
            if self.last.pop(label, None) is None:
                return
        elif not due:
            return
        else:
            self.last[label] = now
        parts = [f"{done}/{total} ({done / total:.0%})" if total else str(done)]
        if info:
            parts.append(info)
        if finished:
            parts.append(f"done in {progress.fmt_eta(now - start)}")
        elif total and done:
            parts.append(f"ETA {progress.fmt_eta((now - start) / done * (total - done))}")
        log(f"{label}: {', '.join(parts)}")


# Seconds between plain progress lines when stderr is not a terminal (XFORMOPT_PROGRESS_EVERY).
LINE_EVERY_S = 15.0
clock = time.monotonic


@contextmanager
def progress_display(every: float | None = None):
    """Listen to xformopt.progress for the command's duration: bars on a terminal, else a line every
    EVERY seconds [default: $XFORMOPT_PROGRESS_EVERY, else LINE_EVERY_S]."""
    every = every or float(os.environ.get("XFORMOPT_PROGRESS_EVERY") or LINE_EVERY_S)
    sink = BarSink(stderr) if stderr.is_terminal else LineSink(every)
    with progress.listening(sink):
        try:
            yield sink
        finally:
            if isinstance(sink, BarSink):
                sink.close()


def progress_bars():
    """The (label, done, total) callback shape pipeline.run takes, reporting to xformopt.progress."""
    return nullcontext(progress.report)
