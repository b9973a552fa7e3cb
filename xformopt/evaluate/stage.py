"""Score one stage on the held-out set against the PyTorch baseline's outputs."""

from __future__ import annotations

import numpy as np

from xformopt.evaluate.metrics import accuracy, cosine_to_baseline, macro_f1, proportion


def headline(task: str) -> str:
    """The metric a report leads with for a task."""
    if task == "text-generation":
        return "perplexity"
    return "accuracy" if task == "text-classification" else "cosine_to_baseline"


def score(task: str, outputs: np.ndarray, baseline: np.ndarray, labels: list[int] | None, probe=None) -> dict:
    """Metrics for ``outputs`` (logits or embeddings); ``baseline`` is the PyTorch fp32 model's.

    ``probe`` (feature extraction with labels) adds the accuracy of a linear probe fitted on the
    baseline's embeddings."""
    if task == "text-classification":
        pred, base_pred = outputs.argmax(-1), baseline.argmax(-1)
        metrics = {"agreement_with_baseline": proportion(pred == base_pred)}
        if labels is not None:
            y = np.asarray(labels)
            metrics = {"accuracy": accuracy(pred, y), "macro_f1": macro_f1(pred, y), **metrics}
        return metrics
    metrics = {"cosine_to_baseline": cosine_to_baseline(outputs, baseline)}
    if probe is not None:
        metrics["probe_accuracy"] = probe.score(outputs)
    return metrics
