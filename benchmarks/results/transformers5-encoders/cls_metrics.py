"""All of the classification task's metrics (accuracy, macro-F1, label agreement with the PyTorch baseline)
on the rows agreement_digits.py scores.   python cls_metrics.py MODEL DATA LIMIT ARTIFACT..."""
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from xformopt import sources
from xformopt.runtime.encoder import OrtPredictor, TorchPredictor

model, data, limit = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
spec = sources.resolve(model); task = spec.task_def
held = task.load(data, label2id=spec.label2id or None, limit=limit, seed=0)
base = TorchPredictor(spec, threads=2).predict_data(held)
def show(name, m):
    print(f"{name:16s} " + "  ".join(f"{k} {v['value']:.6f}" if isinstance(v, dict) else f"{k} {v}" for k, v in m.items()))
show("pytorch", task.score(base, base, held))
for a in map(Path, sys.argv[4:]):
    out = OrtPredictor(spec, a, threads=2).predict_data(held)
    show(a.name, task.score(out, base, held))
    print(f"{'':16s} rows whose label differs from pytorch's: {int((out.argmax(-1) != base.argmax(-1)).sum())} of {len(base)}")
