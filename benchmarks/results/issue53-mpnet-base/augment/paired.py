"""Usage: python paired.py [--data TEST.jsonl] OUT_DIR [OUT_DIR ...] (artifacts of `xformopt optimize`).

Paired bootstrap of (student INT8 correct - teacher fp32 correct) over the test rows (the vendored sentiment
split's 2,014, or --data's: text, label negative/positive), for the artifacts given; the teacher's outputs are the
report's reference/baseline_outputs.npy (PyTorch fp32, the same rows in the same order)."""
import json
import sys
from pathlib import Path

import numpy as np

import xformopt
from xformopt.runtime.encoder import OrtPredictor
from xformopt.runtime.predictor import artifact_spec
from xformopt.scoring.metrics import mean_with_bootstrap

args = sys.argv[1:]
TEST = Path(xformopt.__file__).parent / "resources" / "vader_movie" / "test.jsonl"
if args[:1] == ["--data"]:
    TEST, args = Path(args[1]), args[2:]
rows = [json.loads(line) for line in TEST.open()]
texts = [r["text"] for r in rows]
labels = np.array([{"negative": 0, "positive": 1}[r["label"]] for r in rows])
out = {}
for art in args:
    art = Path(art)
    teacher = np.load(art / "reference" / "baseline_outputs.npy")
    student = OrtPredictor(artifact_spec(art), art, threads=2).predict(texts)
    s_pred = student.argmax(-1) if student.ndim == 2 else student
    t_pred = teacher.argmax(-1)
    diff = (s_pred == labels).astype(float) - (t_pred == labels).astype(float)
    boot = mean_with_bootstrap(diff, seed=0, resamples=2000)
    out[str(art)] = {"teacher_acc": float((t_pred == labels).mean()), "student_acc": float((s_pred == labels).mean()),
                     "diff_points": 100 * boot["value"], "ci95_points": [100 * x for x in boot["ci95"]],
                     "agreement": float((s_pred == t_pred).mean())}
    print(json.dumps(out[str(art)]))
