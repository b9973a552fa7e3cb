"""Loading a checkpoint without the libraries' chatter: transformers 5 draws a "Loading weights" bar for
every checkpoint, and exporters log per node; xformopt's own log says what happens instead, so stderr
keeps one line per event (an error is one line)."""

from __future__ import annotations

import logging
import os


class quiet_loggers:
    """Silence chatty library loggers during export; our own log says what happens."""

    def __init__(self, *names: str):
        self.loggers = [logging.getLogger(n) for n in names]
        self.levels: list[int] = []

    def __enter__(self):
        self.levels = [lg.level for lg in self.loggers]
        for lg in self.loggers:
            lg.setLevel(logging.ERROR)
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

    def __exit__(self, *exc):
        for lg, level in zip(self.loggers, self.levels):
            lg.setLevel(level)


def load_quietly(load, *args, **kwargs):
    """``load(*args, **kwargs)`` (a transformers ``from_pretrained``) without transformers 5's "Loading weights"
    bar on stderr, which it draws for every checkpoint: xformopt's own log says what is loading, and stderr keeps
    one line per event (an error is one line). The bar setting is put back as it was."""
    from transformers.utils import logging as transformers_logging

    shown = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        return load(*args, **kwargs)
    finally:
        if shown:
            transformers_logging.enable_progress_bar()
