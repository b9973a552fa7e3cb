"""What passes fall back to when the user names no data of their own, and when that is not allowed.

The vendored VADER movie-review splits can feed any model as plain text (calibration, unlabeled
distillation, embeddings), but their labels (negative, positive) can only score a classifier with
exactly those classes: a 3-class tweet model or a LABEL_0/LABEL_1 checkpoint would be pruned,
distilled or budgeted against labels that say nothing about it. Such a run is refused up front: each
pass declares which of its options fall back to labelled rows (``Pass.labelled_fallbacks``).
"""

from __future__ import annotations

VADER_LABELS = ("negative", "positive")


def labels_cover_vendored(label2id: dict) -> bool:
    return sorted(name.casefold() for name in label2id) == list(VADER_LABELS)
