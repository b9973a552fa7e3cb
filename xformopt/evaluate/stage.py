"""Score one stage on the held-out set against the PyTorch baseline's outputs (the task decides how)."""

from __future__ import annotations

import numpy as np

from xformopt import tasks


def headline(task: str) -> str:
    """The metric a report leads with for a task."""
    return tasks.get(task).headline


def score(task: str, outputs: np.ndarray, baseline: np.ndarray, data, seed: int = 0) -> dict:
    """Metrics for ``outputs`` on ``data`` (a TextDataset); ``baseline`` is the PyTorch fp32 model's."""
    return tasks.get(task).score(outputs, baseline, data, seed)
