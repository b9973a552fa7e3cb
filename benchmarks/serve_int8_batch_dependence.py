"""How a served dynamic-INT8 artifact's answers depend on their batch mates, and what each way of
removing that costs: the graph as exported (one activation scale per tensor), per-token scales with
the fused attention's QKV projection in per-token INT8 (MultiHeadAttention after it), and per-token
scales with the QKV weights dequantized to float (the float Attention op).

For each mode: every held-out text alone vs in the server's batches (random arrivals of --batch
texts cut into the scheduler's length groups): label flips (classifiers) or cosine (embedders); the
same against the artifact as exported, each text alone (its "unbatched" answer); held-out accuracy
where the rows have labels; and speed, rows/s at batch 1 and at --batch (length-sorted groups),
the modes interleaved round by round, medians.

    python benchmarks/serve_int8_batch_dependence.py ARTIFACT [--rows 512] [--batch 32] [--rounds 5] [-o FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import numpy as np

MODES = {"per-tensor (as exported)": ("per-tensor", "per-token"),
         "per-token, INT8 QKV + MultiHeadAttention": ("per-token", "per-token"),
         "per-token, float QKV + Attention": ("per-token", "float")}


def _batched(predictor, prepared, batch: int, seed: int = 0) -> dict:
    from xformopt.serve.scheduler import length_groups

    order = list(range(len(prepared)))
    random.Random(seed).shuffle(order)
    out: dict[int, np.ndarray] = {}
    for start in range(0, len(order), batch):
        arrivals = order[start:start + batch]
        for group in length_groups([prepared[i].rows[0].length for i in arrivals], batch, 0.25):
            rows = [arrivals[g] for g in group]
            out.update(zip(rows, predictor.run_rows([prepared[i].rows[0] for i in rows])))
    return out


def _compare(predictor, prepared, a: list, b: list) -> dict:
    if predictor.task == "text-classification":
        la, lb = np.array([x.argmax() for x in a]), np.array([x.argmax() for x in b])
        return {"label_agreement": round(float((la == lb).mean()), 5), "flips": int((la != lb).sum()),
                "max_logit_diff": float(max(np.abs(x - y).max() for x, y in zip(a, b)))}
    ea = np.stack([predictor.finish(p, [o]) for p, o in zip(prepared, a)])
    eb = np.stack([predictor.finish(p, [o]) for p, o in zip(prepared, b)])
    cos = (ea * eb).sum(1) / np.linalg.norm(ea, axis=1) / np.linalg.norm(eb, axis=1)
    return {"cosine_min": float(cos.min()), "cosine_mean": float(cos.mean()), "below_0999": int((cos < 0.999).sum())}


def _fp32_reference(artifact: str, rows: int):
    """The PyTorch fp32 outputs `xformopt optimize` kept for the held-out rows (reference/), when they are
    the first ``rows`` rows of the vendored test split in order; else None."""
    folder = os.path.join(artifact, "reference")
    try:
        ids = json.load(open(os.path.join(folder, "rows.json"), encoding="utf-8"))["row_ids"]
        outputs = np.load(os.path.join(folder, "baseline_outputs.npy"))
    except (OSError, KeyError, ValueError):
        return None
    return outputs[:rows] if list(ids[:rows]) == list(range(rows)) else None


def _rows_per_s(predictor, rows, batch: int) -> float:
    rows = sorted(rows, key=lambda r: r.length)
    started = time.perf_counter()
    for i in range(0, len(rows), batch):
        predictor.run_rows(rows[i:i + batch])
    return len(rows) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("artifact")
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved speed rounds")
    parser.add_argument("--speed-rows", type=int, default=256)
    parser.add_argument("-o", "--out", help="also write the JSON here")
    args = parser.parse_args()

    from xformopt.measure.host import cpu_model
    from xformopt.resources import vader_split_path
    from xformopt.runtime.predictor import load_predictor

    records = [json.loads(line) for line in vader_split_path("test").read_text(encoding="utf-8").splitlines()]
    records = records[:args.rows]
    texts = [r["text"] for r in records]
    load_before = os.getloadavg()
    predictors = {name: load_predictor(args.artifact, args.threads, scales, attention)
                  for name, (scales, attention) in MODES.items()}
    reference = predictors["per-tensor (as exported)"]
    ref_prepared = reference.prepare(texts)
    exported_alone = [reference.run_rows(p.rows)[0] for p in ref_prepared]
    result = {"artifact": os.path.abspath(args.artifact), "rows": len(texts), "batch": args.batch,
              "threads": args.threads, "cpu": cpu_model(), "modes": {}}
    speed_rows = {}
    for name, predictor in predictors.items():
        prepared = predictor.prepare(texts)
        alone = [predictor.run_rows(p.rows)[0] for p in prepared]
        batched = _batched(predictor, prepared, args.batch)
        entry = {"batched_vs_alone": _compare(predictor, prepared, alone, [batched[i] for i in range(len(texts))]),
                 "alone_vs_exported_alone": _compare(predictor, prepared, alone, exported_alone)}
        if predictor.task == "text-classification" and "label" in records[0]:
            names = predictor.labels
            correct = [names.get(int(o.argmax())) == r["label"] for o, r in zip(alone, records)]
            entry["accuracy"] = round(float(np.mean(correct)), 4)
        fp32 = _fp32_reference(args.artifact, len(texts))
        if fp32 is not None and predictor.task == "text-classification":
            same = np.array([int(o.argmax()) == int(f.argmax()) for o, f in zip(alone, fp32)])
            entry["alone_vs_pytorch_fp32"] = {"label_agreement": round(float(same.mean()), 5),
                                              "flips": int((~same).sum())}
        result["modes"][name] = entry
        speed_rows[name] = [p.rows[0] for p in prepared[:args.speed_rows]]
    timings: dict[str, dict[int, list[float]]] = {name: {1: [], args.batch: []} for name in predictors}
    for round_ in range(args.rounds):
        names = list(predictors) if round_ % 2 == 0 else list(predictors)[::-1]
        for name in names:
            for batch in (1, args.batch):
                timings[name][batch].append(_rows_per_s(predictors[name], speed_rows[name], batch))
    for name in predictors:
        result["modes"][name]["rows_per_s"] = {f"batch_{b}": round(statistics.median(v), 1)
                                               for b, v in timings[name].items()}
    result["load_average"] = {"before": [round(x, 2) for x in load_before],
                              "after": [round(x, 2) for x in os.getloadavg()]}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
