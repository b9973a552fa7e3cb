"""SIGTERM and SIGINT end a run like any failure: the exception unwinds every ``with`` block, so temp
folders, cache builds and output locks are cleaned up, and the CLI prints one line and exits
128 + the signal number (143 for SIGTERM, what ``timeout``, CI cancellation and ``docker stop`` send).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Interrupted(BaseException):
    """Raised in the main thread when a handled signal arrives (BaseException, like
    KeyboardInterrupt, so the ``except Exception`` around library calls does not swallow it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


HANDLED = (signal.SIGTERM, signal.SIGINT)

_received: list[int] = []


def received() -> Interrupted | None:
    """The signal that interrupted this block, if one did. The exception a signal raises can be
    replaced on its way up (it may land inside an import or a library's cleanup, which then fails
    with an error of its own): whatever ends the run after a signal is reported as the signal."""
    return Interrupted(_received[-1]) if _received else None


@contextmanager
def interruptible() -> Iterator[None]:
    """Turn SIGTERM/SIGINT into ``Interrupted`` for the duration; later signals are ignored so the
    cleanup the first one started can finish. Previous handlers are restored afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()

    def handler(signum, frame):
        if _received:
            return
        _received.append(signum)
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in HANDLED}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
