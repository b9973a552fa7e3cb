"""benchmarks/artifacts.py's agreement with more digits: each artifact's task score against the PyTorch
baseline on the same held-out rows (same loader, limit and seed, batches of 32), and the largest
difference of each artifact's outputs from the first's (0: the same outputs).

    python agreement_digits.py MODEL DATA LIMIT ARTIFACT...
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    import numpy as np

    from xformopt import sources
    from xformopt.runtime.encoder import OrtPredictor, TorchPredictor

    model, data, limit = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    spec = sources.resolve(model)
    task = spec.task_def
    held = task.load(data, label2id=spec.label2id or None, limit=limit, seed=0)
    base = TorchPredictor(spec, threads=2).predict_data(held)
    metric = task.report_headline(task.score(base, base, held))
    outs = {}
    for artifact in map(Path, sys.argv[4:]):
        outs[artifact.name] = OrtPredictor(spec, artifact, threads=2).predict_data(held)
        print(f"{artifact.name:16s} {metric} {task.score(outs[artifact.name], base, held)[metric]['value']:.6f}")
    first, *rest = outs
    for name in rest:
        print(f"max |{name} - {first}| = {np.abs(outs[name] - outs[first]).max():.3g}")


if __name__ == "__main__":
    main()
