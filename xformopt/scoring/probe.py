"""A linear probe, so that damage to embeddings shows up as damage to a task.

Cosine similarity to the fp32 embeddings says *that* vectors moved; a logistic-regression probe
fitted once on the baseline's embeddings and scored on every stage's embeddings of held-out rows
says whether the move costs task accuracy.
"""

from __future__ import annotations

import numpy as np

from xformopt.scoring.metrics import accuracy


class Probe:
    def __init__(self, baseline_embeddings: np.ndarray, labels: list[int], seed: int = 0, train_fraction: float = 0.5):
        from sklearn.linear_model import LogisticRegression
        from sklearn.model_selection import train_test_split

        y = np.asarray(labels)
        # Stratified: each class is split in the same proportion, so both halves hold every class
        # (``usable`` guarantees every class has rows for both).
        train, test = train_test_split(np.arange(len(y)), train_size=train_fraction, random_state=seed, stratify=y)
        self.train_idx, self.test_idx = np.sort(train), np.sort(test)
        self.labels = y
        self.classifier = LogisticRegression(max_iter=2000).fit(baseline_embeddings[self.train_idx], y[self.train_idx])

    def score(self, embeddings: np.ndarray) -> dict:
        pred = self.classifier.predict(embeddings[self.test_idx])
        return {**accuracy(pred, self.labels[self.test_idx]), "train_rows": len(self.train_idx)}

    @staticmethod
    def usable(labels: list[int] | None) -> bool:
        """A probe needs labels with at least two classes and a few rows of each."""
        if labels is None:
            return False
        _, counts = np.unique(labels, return_counts=True)
        return len(counts) >= 2 and counts.min() >= 4
