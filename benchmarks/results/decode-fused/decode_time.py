"""Rough interleaved decode timing of xformopt artifacts (and an optional per-op profile)."""

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import xformopt  # noqa
from xformopt.runtime.decoder import OrtDecoder
from xformopt.runtime.session import DECODER_SPIN_US, ort_session

ap = argparse.ArgumentParser()
ap.add_argument("dirs", nargs="+")
ap.add_argument("--threads", default="1,2")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--prompt", type=int, default=128)
ap.add_argument("--new", type=int, default=128)
ap.add_argument("--profile", action="store_true")
a = ap.parse_args()
prompt = list(np.random.default_rng(0).integers(100, 20000, size=a.prompt))


def decode(runner, n):
    logits, state = runner.forward(np.asarray([prompt], dtype=np.int64))
    tok = int(logits[0, -1].argmax())
    toks = [tok]
    t0 = time.perf_counter()
    c0 = time.process_time()
    for _ in range(n - 1):
        s0 = time.perf_counter()
        logits, state = runner.forward(np.asarray([[tok]], dtype=np.int64), state)
        tok = int(logits[0, -1].argmax())
        toks.append(tok)
        steps.setdefault(id(runner), []).append(time.perf_counter() - s0)
    cpu.setdefault(id(runner), []).append((time.process_time() - c0) / (n - 1) * 1000)
    return (n - 1) / (time.perf_counter() - t0), toks


cpu = {}
steps = {}

if a.profile:
    for d in a.dirs:
        for t in [int(x) for x in a.threads.split(",")]:
            r = OrtDecoder(Path(d), threads=t)
            r.session = ort_session(
                Path(d) / "model.onnx", t, spinning=True, spin_us=DECODER_SPIN_US, profile_prefix=f"/tmp/prof_{t}"
            )
            decode(r, 33)
            f = r.session.end_profiling()
            ev = json.load(open(f))
            by = collections.defaultdict(float)
            cnt = collections.Counter()
            runs_ev = sorted(
                [e for e in ev if e.get("cat") == "Session" and e["name"] == "model_run"], key=lambda e: e["ts"]
            )
            after = runs_ev[0]["ts"] + runs_ev[0]["dur"]
            steps_wall = [e["dur"] for e in runs_ev[1:]]
            print("model_run us per decode step (median):", statistics.median(steps_wall))
            for e in [e for e in ev if e["ts"] > after]:
                if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                    op = e["args"].get("op_name")
                    by[op] += e["dur"]
                    cnt[op] += 1
            runs = cnt.get("GroupQueryAttention", 1) / 30
            print(d, "threads", t, "steps", runs, "nodes/step", sum(cnt.values()) / runs)
            for op, us in sorted(by.items(), key=lambda kv: -kv[1]):
                print(f"  {op:28s} {us / runs:9.1f} us/step  {cnt[op] / runs:6.1f} nodes/step")
    sys.exit()

cells = [(d, int(t)) for d in a.dirs for t in a.threads.split(",")]
runners = {c: OrtDecoder(Path(c[0]), threads=c[1]) for c in cells}
res = collections.defaultdict(list)
toks = {}
for r in range(a.rounds):
    order = cells[r % len(cells) :] + cells[: r % len(cells)]
    for c in order:
        tps, tk = decode(runners[c], a.new)
        res[c].append(tps)
        toks[c] = tk
base = toks[cells[0]]
for c in cells:
    same = toks[c] == (base if c[1] == cells[0][1] else toks[(cells[0][0], c[1])])
    cpu_ms = statistics.median(cpu[id(runners[c])])
    p10 = 1 / np.percentile(steps[id(runners[c])], 10)
    print(f"{c[0]:45s} threads {c[1]}  decode {statistics.median(res[c]):7.1f} tok/s  cpu ms/token {cpu_ms:6.2f}  "
          f"p10-step tok/s {p10:6.1f}  rounds {[round(x, 1) for x in res[c]]}  same tokens as first: {same}")
