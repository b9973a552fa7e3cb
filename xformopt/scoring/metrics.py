"""Task metrics, each with its sample count and an uncertainty (CI or standard error).

A 0.4-point accuracy drop on 500 rows is noise; a report that does not say so invites bad calls.
"""

from __future__ import annotations

import math

import numpy as np


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a proportion (well-behaved near 0 and 1, unlike the normal one)."""
    if n == 0:
        return (0.0, 0.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def proportion(hits: np.ndarray) -> dict:
    hits = np.asarray(hits, dtype=bool)
    n, k = int(hits.size), int(hits.sum())
    lo, hi = wilson_interval(k, n)
    return {"value": k / n if n else float("nan"), "n": n, "ci95": [lo, hi]}


def mean_with_bootstrap(values: np.ndarray, seed: int, resamples: int = 1000) -> dict:
    """Mean with a seeded percentile-bootstrap 95% interval (per-row F1 or a paired
    difference of per-row correctness is far from normal: mostly 0 or ±1)."""
    values = np.asarray(values, dtype=np.float64)
    n = len(values)
    if n == 0:
        return {"value": float("nan"), "n": 0, "ci95": [float("nan"), float("nan")]}
    rng = np.random.default_rng(seed)
    means = np.concatenate([values[rng.integers(0, n, (min(100, resamples - k), n))].mean(1)
                            for k in range(0, resamples, 100)])
    return {"value": float(values.mean()), "n": n,
            "ci95": [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]}


def accuracy(pred: np.ndarray, labels: np.ndarray) -> dict:
    return proportion(np.asarray(pred) == np.asarray(labels))


def macro_f1_value(pred: np.ndarray, labels: np.ndarray) -> float:
    """Unweighted mean of per-class F1 over the classes present in labels or predictions (a class
    never predicted, or predicted but absent, scores 0)."""
    from sklearn.metrics import f1_score

    classes = np.union1d(pred, labels)
    return float(f1_score(labels, pred, labels=classes, average="macro", zero_division=0.0))


def macro_f1_resampled(pred: np.ndarray, labels: np.ndarray, picks: np.ndarray) -> np.ndarray:
    """``macro_f1_value(pred[idx], labels[idx])`` for every row ``idx`` of ``picks`` (resamples x n), at once:
    per-class counts by one bincount, F1 = 2 tp / (predicted + true) per class as scikit-learn computes it,
    averaged over the classes present in that resample's labels or predictions."""
    pred, labels, picks = np.asarray(pred), np.asarray(labels), np.atleast_2d(np.asarray(picks))
    classes, codes = np.unique(np.concatenate([pred, labels]), return_inverse=True)
    c, r = len(classes), len(picks)
    p, t = codes[: len(pred)][picks], codes[len(pred):][picks]  # resamples x n class codes
    offset = np.arange(r)[:, None] * c
    predicted = np.bincount((offset + p).ravel(), minlength=r * c).reshape(r, c)
    true = np.bincount((offset + t).ravel(), minlength=r * c).reshape(r, c)
    tp = np.bincount((offset + p)[p == t], minlength=r * c).reshape(r, c)
    present = (predicted + true) > 0
    f1 = 2.0 * tp / np.where(present, predicted + true, 1)
    return np.array([float(np.mean(row[mask])) for row, mask in zip(f1, present)])


def macro_f1(pred: np.ndarray, labels: np.ndarray, resamples: int = 200, seed: int = 0) -> dict:
    """Macro-F1 with a seeded percentile-bootstrap 95% interval."""
    pred, labels = np.asarray(pred), np.asarray(labels)
    rng = np.random.default_rng(seed)
    n = len(pred)
    boot = macro_f1_resampled(pred, labels, np.array([rng.integers(0, n, n) for _ in range(resamples)]))
    return {"value": macro_f1_value(pred, labels), "n": n, "ci95": [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))]}


def row_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.reshape(len(a), -1).astype(np.float64)
    b = b.reshape(len(b), -1).astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)


def cosine_to_baseline(embeddings: np.ndarray, baseline: np.ndarray) -> dict:
    cos = row_cosine(embeddings, baseline)
    n = len(cos)
    mean = float(cos.mean())
    stderr = float(cos.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0
    return {
        "value": mean,
        "n": n,
        "stderr": stderr,
        "ci95": [max(-1.0, mean - 1.96 * stderr), min(1.0, mean + 1.96 * stderr)],  # normal interval of the mean
        "p1": float(np.percentile(cos, 1)),  # the worst rows: 1% of them are below this
    }
