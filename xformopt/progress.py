"""Progress of long steps: any layer reports it, whoever listens draws it.

Passes, evaluation and the bench call :func:`report` (or use :func:`tracker`); they never import
the CLI. The CLI installs a sink with :func:`listening` (cli/output.py: a rich bar with ETA when
stderr is a terminal, a plain line every few seconds otherwise). With no sink (library use,
tests) reporting costs one attribute lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Sink:
    """What a listener implements. ``interactive``: it draws live bars (a terminal)."""

    interactive = False

    def update(self, label: str, done: int, total: int | None, info: str = "") -> None:  # pragma: no cover
        raise NotImplementedError


_sink: Sink | None = None


@contextmanager
def listening(sink: Sink | None) -> Iterator[Sink | None]:
    """Route every report made inside the block to SINK (None: drop them)."""
    global _sink
    previous, _sink = _sink, sink
    try:
        yield sink
    finally:
        _sink = previous


def interactive() -> bool:
    """True when a live display listens (callers then need no log lines of their own)."""
    return _sink is not None and _sink.interactive


def report(label: str, done: int, total: int | None, info: str = "") -> None:
    """Step LABEL has done DONE of TOTAL units (TOTAL None or 0: unknown); INFO is shown beside it."""
    if _sink is not None:
        _sink.update(label, done, total or None, info)


def tracker(label: str, total: int | None = None) -> Callable[..., None]:
    """A ``progress(done, total)`` callback (the shape bench.latency takes) reporting under LABEL;
    TOTAL, when given, overrides the one the caller passes."""
    return lambda done, given=None: report(label, done, total or given)


def fmt_eta(seconds: float) -> str:
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        return "?"
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
