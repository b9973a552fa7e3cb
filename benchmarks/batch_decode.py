"""Continuous batching's engine: aggregate decode tokens/s against the number of sequences per call.

    python benchmarks/batch_decode.py /work/art/smol-int4                       # rows 1,2,4,8,16
    python benchmarks/batch_decode.py ART --rows 1,8 --prompt 128 --steps 64 --rounds 3 --json out.json

For each row count R: R sequences of different prompt lengths (P +- 25%, real text from the vendored
test split) are read into their own KV rows (xformopt.runtime.batch_decoder.BatchDecoder, one prompt
call each), then ``--steps`` decode steps run all R rows in one GroupQueryAttention call each (a plain
dynamo export, e.g. Qwen3.5: left-padded rows, xformopt.runtime.padded_batch_decoder, as serve picks). Timed:
each decode step; reported: the median step time, R / median = aggregate decode tokens/s, and the
ratio to one row. Row counts are interleaved within each round (rounds alternate the order), so drift
on a shared host hits all alike. Also checked every round: the batched greedy tokens equal each
sequence decoded alone (batch 1), so the speed is of the same answers. Never run as a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def prompts(tokenizer, count: int, length: int) -> list[list[int]]:
    from xformopt.resources import vader_split_path

    texts = [json.loads(line)["text"] for line in vader_split_path("test").read_text().splitlines() if line.strip()]
    stream = [t for text in texts for t in tokenizer(" " + text)["input_ids"]]
    rng = np.random.default_rng(0)
    out, at = [], 0
    for _ in range(count):
        n = int(length * rng.uniform(0.75, 1.25))
        out.append(stream[at: at + n])
        at += n
    return out


def one_round(engine, seqs: list[list[int]], steps: int) -> tuple[list[float], list[list[int]]]:
    slots, tokens = [], []
    for ids in seqs:
        slot = engine.open(len(ids) + steps + 1)
        logits = engine.prefill(slot, ids)
        engine.start_decoding(slot)
        slots.append(slot)
        tokens.append([int(np.argmax(logits))])
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        logits = engine.decode([t[-1] for t in tokens])
        times.append(time.perf_counter() - started)
        for t, row in zip(tokens, logits):
            t.append(int(np.argmax(row)))
    for slot in slots:
        engine.close(slot)
    return times, tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--rows", default="1,2,4,8,16")
    parser.add_argument("--prompt", type=int, default=128, help="mean prompt tokens")
    parser.add_argument("--steps", type=int, default=64, help="decode steps timed per row count and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from xformopt.measure.host import usable_cpus
    from xformopt.models import load_tokenizer
    from xformopt.runtime.batch_decoder import BatchDecoder, unbatchable_reason
    from xformopt.runtime.padded_batch_decoder import PaddedBatchDecoder

    rows = [int(r) for r in args.rows.split(",")]
    threads = args.threads or usable_cpus()
    # serve's choice: the shared GroupQueryAttention buffer, else left-padded rows (the plain dynamo export)
    engine_class = BatchDecoder if unbatchable_reason(args.artifact) is None else PaddedBatchDecoder
    engine = engine_class(args.artifact, threads=threads, max_kv_tokens=max(rows) * (2 * args.prompt + args.steps + 8),
                          max_rows=max(rows))
    seqs = prompts(load_tokenizer(args.artifact), max(rows), args.prompt)
    alone = {}
    for i, ids in enumerate(seqs):  # each sequence decoded alone: the reference for every batch
        alone[i] = one_round(engine, [ids], args.steps)[1][0]
    one_round(engine, seqs[: max(rows)], 2)  # warm-up at the largest batch
    load_before = os.getloadavg()
    steps: dict[int, list[float]] = {r: [] for r in rows}
    equal = True
    for k in range(args.rounds):
        for r in (rows if k % 2 == 0 else rows[::-1]):
            times, tokens = one_round(engine, seqs[:r], args.steps)
            steps[r] += times
            equal &= all(tokens[i] == alone[i] for i in range(r))
            log(f"round {k + 1}, {r} rows: median step {1000 * np.median(times):.1f} ms")
    base = 1 / float(np.median(steps[rows[0]])) if rows[0] == 1 else None
    results = []
    for r in rows:
        med = float(np.median(steps[r]))
        results.append({"rows": r, "median_step_ms": round(1000 * med, 2), "p90_step_ms": round(1000 * float(
            np.percentile(steps[r], 90)), 2), "aggregate_tokens_per_s": round(r / med, 1),
            "over_one_row": round((r / med) / base, 2) if base else None})
    detect = subprocess.run([sys.executable, "-m", "xformopt.cli.app", "targets", "detect"], capture_output=True,
                            text=True).stdout.strip().splitlines()
    document = {"artifact": str(args.artifact), "threads": threads, "prompt_tokens_mean": args.prompt,
                "prompt_lengths": [len(s) for s in seqs], "decode_steps": args.steps, "rounds": args.rounds,
                "engine": engine_class.__name__,
                "last_position_logits": getattr(engine, "last_position_logits", False), "batched_equals_alone": equal,
                "load_average": {"before": [round(x, 2) for x in load_before],
                                 "after": [round(x, 2) for x in os.getloadavg()]},
                "targets_detect": detect[:3], "results": results}
    print("| rows | median step ms | p90 step ms | aggregate decode tok/s | over 1 row |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['rows']} | {r['median_step_ms']} | {r['p90_step_ms']} | {r['aggregate_tokens_per_s']} | "
              f"{r['over_one_row']} |")
    print(f"batched greedy tokens equal each sequence alone: {equal}; load {document['load_average']}")
    if args.json:
        args.json.write_text(json.dumps(document, indent=2))
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
