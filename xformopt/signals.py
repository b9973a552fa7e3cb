"""SIGTERM and SIGINT end a run like any failure: the exception unwinds every ``with`` block, so temp
folders, cache builds and output locks are cleaned up, and the CLI prints one line and exits
128 + the signal number (143 for SIGTERM, what ``timeout``, CI cancellation and ``docker stop`` send).
"""

from __future__ import annotations

import signal
import sys
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

    # A signal can land while a finalizer runs (``__del__``, a weakref callback, often inside the garbage
    # collector): Python cannot raise from there, so it prints "Exception ignored" with a traceback and the
    # run went on to exit 0. Such an Interrupted is delivered again instead, at the next bytecode outside
    # the finalizer, where it unwinds the run as any other signal does.
    unraisable = sys.unraisablehook

    def redeliver(info):
        if not isinstance(info.exc_value, Interrupted):
            unraisable(info)
            return
        # Sent from another thread a moment later: raising it here (or signalling this thread, which
        # Python checks at once) would raise inside this hook, which is as unraisable as the finalizer.
        _received.clear()
        main = threading.main_thread().ident
        threading.Timer(0.05, signal.pthread_kill, (main, info.exc_value.signum)).start()

    previous = {sig: signal.signal(sig, handler) for sig in HANDLED}
    sys.unraisablehook = redeliver
    try:
        yield
    finally:
        sys.unraisablehook = unraisable
        for sig, old in previous.items():
            signal.signal(sig, old)
