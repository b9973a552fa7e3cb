"""Sentence embeddings as sentence-transformers computes them: the masked mean of token states.

One function for numpy arrays and torch tensors alike (the evaluator pools numpy outputs, prune and
distill pool torch tensors inside autograd), so every stage pools identically."""

from __future__ import annotations


def mean_pool(hidden, mask):
    """``hidden`` (batch, tokens, width) and ``mask`` (batch, tokens) -> (batch, width)."""
    if hasattr(hidden, "detach"):  # torch: stays in the graph for gradients
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    import numpy as np

    weights = mask[..., None].astype(hidden.dtype)
    return (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
