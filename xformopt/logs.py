"""The package's log lines go through the standard ``logging`` module: every module logs to its own
``logging.getLogger(__name__)`` under the one ``xformopt`` logger, and whoever runs the work decides
where lines go (the CLI installs a handler writing them to stderr; a library user configures ``logging``
or hands the API a ``log=`` callable, forwarded here for the length of the call).

Nothing is printed by default: the ``xformopt`` logger has a ``NullHandler``, as the logging HOWTO asks of
libraries.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

ROOT = "xformopt"

logging.getLogger(ROOT).addHandler(logging.NullHandler())


class _Forward(logging.Handler):
    def __init__(self, callback: Callable[[str], None]):
        super().__init__(logging.INFO)
        self.callback = callback

    def emit(self, record: logging.LogRecord) -> None:
        self.callback(record.getMessage())


@contextmanager
def forwarded_to(callback: Callable[[str], None] | None) -> Iterator[None]:
    """While the block runs, hand every line of the ``xformopt`` logger at INFO or above to ``callback``
    (the API's ``log=``); None forwards nothing."""
    if callback is None:
        yield
        return
    logger = logging.getLogger(ROOT)
    handler = _Forward(callback)
    level = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
