"""The trained tiny T5's INT8 artifact with and without xformopt/seq2seq/slim.py's decoder rewrites, against
CTranslate2's INT8, in one interleaved run (issue 55).

Per round each engine translates the same ``--per-round`` sources one at a time (batch 1), engines in a shuffled
order; a round's ratio is one engine's tokens/s over another's. A cell (threads x beams) reports each engine's
median tokens/s and the median per-round ratios with bootstrap 95% intervals. Both xformopt artifacts decode as
served (the BeamSearch op's ``generate.onnx`` for one-row calls).

Run (artifacts built with ``xformopt export/fuse/quantize``, CTranslate2's with its converter; see
benchmarks/seq2seq_ctranslate2.py, whose engines this reuses):
  OMP_WAIT_POLICY=PASSIVE python benchmarks/seq2seq_slim.py --src HF --before INT8_BEFORE --after INT8_AFTER \
      --ct2 CT2_DIR --out benchmarks/results/seq2seq-slim
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seq2seq_ctranslate2 import bootstrap_median, engines  # noqa: E402


def cell(fns: dict, texts: list[str], rounds: int, per_round: int, seed: int) -> dict:
    for fn in fns.values():  # warm-up
        fn(texts[:2])
    rates = {name: [] for name in fns}
    order, rng = list(fns), random.Random(seed)
    for r in range(rounds):
        chunk = [texts[(r * per_round + i) % len(texts)] for i in range(per_round)]
        rng.shuffle(order)
        for name in order:
            started = time.perf_counter()
            count = sum(sum(fns[name]([t])) for t in chunk)
            rates[name].append(count / (time.perf_counter() - started))
    out = {f"{name} tokens/s median": float(np.median(v)) for name, v in rates.items()}
    for num, den in (("after", "ctranslate2"), ("before", "ctranslate2"), ("after", "before")):
        ratio = np.asarray(rates[num]) / np.asarray(rates[den])
        out[f"{num}/{den}"] = [float(np.median(ratio)), *bootstrap_median(ratio)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("src", "before", "after", "ct2", "out"):
        parser.add_argument(f"--{name}", type=Path, required=True)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    from xformopt.resources import word_seq2seq_path

    rows = [json.loads(line) for line in word_seq2seq_path("reverse", "test").read_text().splitlines()]
    texts = [r["source"] for r in rows]
    cells = []
    for threads in (int(t) for t in args.threads.split(",")):
        for beams in (int(b) for b in args.beams.split(",")):
            before, loop = engines(args.src, args.before, args.ct2, threads, beams, args.tokens, fixed=False)
            after, _ = engines(args.src, args.after, args.ct2, threads, beams, args.tokens, fixed=False)
            fns = {"before": before["xformopt int8"], "after": after["xformopt int8"],
                   "ctranslate2": before["ctranslate2 int8"]}
            row = {"threads": threads, "beams": beams, "decode_loop": loop(1),
                   **cell(fns, texts, args.rounds, args.per_round, seed=threads * 10 + beams)}
            cells.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"rounds": args.rounds, "per_round": args.per_round,
                                                       "cells": cells}, indent=1) + "\n")
    lines = ["| threads | beams | loop | before tokens/s | after tokens/s | CT2 tokens/s | after / CT2 (95% CI) | "
             "before / CT2 (95% CI) | after / before (95% CI) |", "|---|---|---|---|---|---|---|---|---|"]
    fmt = "{:.2f} ({:.2f}-{:.2f})".format
    for c in cells:
        lines.append(f"| {c['threads']} | {c['beams']} | {c['decode_loop']} | {c['before tokens/s median']:.0f} | "
                     f"{c['after tokens/s median']:.0f} | {c['ctranslate2 tokens/s median']:.0f} | "
                     f"{fmt(*c['after/ctranslate2'])} | {fmt(*c['before/ctranslate2'])} | {fmt(*c['after/before'])} |")
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
