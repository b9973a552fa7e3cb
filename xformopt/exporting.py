"""What both exporters (optimum's for encoders, xformopt.passes.export.decoder for KV-cache decoders) share:
the texts parity is checked on, the comparison, and quiet library loggers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xformopt.errors import InputError
from xformopt.scoring.metrics import row_cosine


def parity_texts(texts, tokenizer, count: int = 4) -> list[str]:
    """Real texts spanning distinct token lengths (shortest, longest and between)."""
    texts = list(texts)
    return [texts[i] for i in spread_by_length([len(tokenizer(t)["input_ids"]) for t in texts], count)]


def spread_by_length(lengths: Sequence[int], count: int = 4, what: str = "texts") -> list[int]:
    """Indices of rows at distinct ``lengths`` (token counts as the model receives each row): the
    shortest, the longest and evenly between, the first row of each length. Fewer than 3 distinct
    lengths cannot show a length-dependent divergence, so that is refused."""
    by_length: dict[int, int] = {}
    for i, n in enumerate(lengths):
        by_length.setdefault(int(n), i)
    ordered = sorted(by_length)
    if len(ordered) < 3:
        seen = ", ".join(map(str, ordered))
        raise InputError(
            f"export parity needs held-out {what} of at least 3 different token lengths (got {len(lengths)} "
            f"{what}, token length(s) {seen}); pass a larger or more varied --data"
        )
    picks = np.linspace(0, len(ordered) - 1, num=min(count, len(ordered))).round().astype(int)
    return [by_length[ordered[i]] for i in sorted(set(picks))]


def compare(reference: np.ndarray, candidate: np.ndarray, mask: np.ndarray | None) -> dict:
    """Max abs diff over real (unpadded) positions, and the smallest row-wise cosine."""
    if mask is not None and reference.ndim == 3:  # token states: ignore padding positions
        keep = mask.astype(bool)
        reference, candidate = reference[keep], candidate[keep]
    cos = row_cosine(reference, candidate)
    return {"max_abs_diff": float(np.abs(reference - candidate).max()), "min_cosine": float(cos.min())}
