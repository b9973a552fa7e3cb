import collections
import json
import os
import sys
from pathlib import Path

import numpy as np

import xformopt  # noqa
from xformopt.runtime.decoder import OrtDecoder
from xformopt.runtime.session import DECODER_SPIN_US, ort_session

prompt = list(np.random.default_rng(0).integers(100, 20000, size=128))
THREADS = [int(t) for t in os.environ.get("THREADS", "1,2").split(",")]
rounds = int(sys.argv[1])
dirs = sys.argv[2:]
res = collections.defaultdict(list)
for r in range(rounds):
    for t in THREADS:
        for d in dirs:
            run = OrtDecoder(Path(d), threads=t)
            run.session = ort_session(
                Path(d) / "model.onnx", t, spinning=True, spin_us=DECODER_SPIN_US, profile_prefix=f"/tmp/pp_{t}"
            )
            logits, state = run.forward(np.asarray([prompt], dtype=np.int64))
            tok = int(logits[0, -1].argmax())
            for _ in range(64):
                logits, state = run.forward(np.asarray([[tok]], dtype=np.int64), state)
                tok = int(logits[0, -1].argmax())
            ev = json.load(open(run.session.end_profiling()))
            runs = sorted([e for e in ev if e.get("name") == "model_run"], key=lambda e: e["ts"])[1:]
            first_end = min(e["ts"] for e in runs)
            per = collections.defaultdict(list)
            for e in ev:
                if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= first_end:
                    per[e["name"]].append(e["dur"])
            node_p10 = sum(np.percentile(v, 10) for v in per.values())
            res[(d, t)].append((np.percentile([e["dur"] for e in runs], 10), node_p10))
for (d, t), v in res.items():
    whole, nodes = np.median([a for a, _ in v]) / 1000, np.median([b for _, b in v]) / 1000
    shown = [(round(a / 1000, 2), round(b / 1000, 2)) for a, b in v]
    print(f"{d:10s} threads {t}: model_run p10 {whole:.2f} ms  sum of per-node p10 {nodes:.2f} ms  rounds {shown}")
