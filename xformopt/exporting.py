"""What both exporters (optimum's for encoders, xformopt.decoder.export for KV-cache decoders) share:
the texts parity is checked on, the comparison, and quiet library loggers."""

from __future__ import annotations

import logging
import os

import numpy as np

from xformopt.errors import InputError
from xformopt.scoring.metrics import row_cosine


def parity_texts(texts, tokenizer, count: int = 4) -> list[str]:
    """Real texts spanning distinct token lengths (shortest, longest and between)."""
    by_length: dict[int, str] = {}
    for text in texts:
        by_length.setdefault(len(tokenizer(text)["input_ids"]), text)
    lengths = sorted(by_length)
    if len(lengths) < 3:
        raise InputError(
            f"export parity needs held-out texts of at least 3 different token lengths (got {len(texts)} texts); "
            "raise --limit or pass a larger --data"
        )
    picks = np.linspace(0, len(lengths) - 1, num=min(count, len(lengths))).round().astype(int)
    return [by_length[lengths[i]] for i in sorted(set(picks))]


def compare(reference: np.ndarray, candidate: np.ndarray, mask: np.ndarray | None) -> dict:
    """Max abs diff over real (unpadded) positions, and the smallest row-wise cosine."""
    if mask is not None and reference.ndim == 3:  # token states: ignore padding positions
        keep = mask.astype(bool)
        reference, candidate = reference[keep], candidate[keep]
    cos = row_cosine(reference, candidate)
    return {"max_abs_diff": float(np.abs(reference - candidate).max()), "min_cosine": float(cos.min())}


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
