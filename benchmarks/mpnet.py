"""all-mpnet-base-v2 at batch 1: xformopt's INT8 artifact against optimum's dynamic-INT8 artifact.

    python benchmarks/mpnet.py /tmp/mpnet-model/all-mpnet-base-v2 --work /tmp/mpnet-bench --rounds 300 --json mpnet.json

MODEL is the sentence-transformers folder (the `mpnet` alias assembles it from PyPI). Builds, or reuses
under --work:

- ``xformopt-int8``: xformopt's passes, export -> fuse (select all: MPNet's attention in
  MultiHeadAttention, xformopt/fusions/mpnet.py) -> quantize (dynamic INT8 for this host's target, the
  family's outlier rules: FFN inputs smoothed, FFN output projections split, xformopt/passes/quantize/outliers.py);
- ``xformopt-int8-plain`` (``--plain``): the same quantize with ``outlier_rules: false`` (and
  ``min_agreement: 0``: the pass refuses it otherwise, its cosine to float being far below 0.99);
- ``optimum-int8``: optimum's ORTModelForFeatureExtraction export + ORTQuantizer with
  AutoQuantizationConfig for this host (avx512_vnni, or avx2 without VNNI), is_static=False,
  per_channel=False: optimum's documented dynamic recipe.

Then, in one process: mean cosine of each artifact's mean-pooled embeddings to PyTorch fp32 on the
held-out texts (the vendored test split), and batch-1 latency on those texts at their real lengths,
tokenization included, all variants interleaved round by round (xformopt/measure/modes.py ``real``);
medians, p90 and the ratio to optimum's artifact. Never run as a test: speed claims live here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads; see docs/guides/optimize.md, "How latency is measured"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def xformopt_artifact(model: Path, work: Path, plain: bool = False) -> tuple[Path, dict]:
    from xformopt.pipeline import run_single

    int8 = work / ("int8-plain" if plain else "int8")
    chain = [("export", model, work / "export", {}), ("fuse", work / "export", work / "fused", {"select": "all"}),
             ("quantize", work / "fused", int8, {"mode": "dynamic", "outlier_rules": not plain,
                                                 # plain: built for the comparison though the pass would refuse it
                                                 **({"min_agreement": 0.0} if plain else {})})]
    records = {}
    for name, src, dst, options in chain:
        manifest = dst / "manifest.json"
        stored = json.loads(manifest.read_text())["passes"][-1] if manifest.is_file() else None
        if stored is not None and all(stored.get("options", {}).get(k) == v for k, v in options.items()):
            log(f"{name}: reusing {dst}")
            records[name] = stored.get("record", {})
            continue
        shutil.rmtree(dst, ignore_errors=True)
        started = time.perf_counter()
        records[name] = run_single(name, str(src), dst, options, task="feature-extraction")["record"]
        log(f"{name}: {time.perf_counter() - started:.0f}s")
    return int8, records


def mean_cosine(a, b) -> dict:
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    half = 1.96 * cos.std(ddof=1) / np.sqrt(len(cos)) if len(cos) > 1 else 0.0
    return {"mean": float(cos.mean()), "min": float(cos.min()), "ci95": [float(cos.mean() - half), float(cos.mean() + half)],
            "n": len(cos)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path, help="the sentence-transformers all-mpnet-base-v2 folder")
    parser.add_argument("--work", type=Path, default=Path("/tmp/mpnet-bench"), help="stages are built (or reused) here")
    parser.add_argument("--rounds", type=int, default=300, help="interleaved batch-1 rounds")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--timing-rows", type=int, default=500, help="held-out texts cycled through when timing")
    parser.add_argument("--cosine-rows", type=int, default=None, help="held-out texts for the cosine (default: all)")
    parser.add_argument("--fp32", action="store_true",
                        help="also time xformopt's fused fp32 stage and its unfused export (optimum's exporter)")
    parser.add_argument("--plain", action="store_true",
                        help="also time xformopt's INT8 without the family's outlier rules (outlier_rules: false)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import numpy as np

    from xformopt import sources, targets
    from xformopt.benchmarking.optimum_reference import optimum_dynamic_int8
    from xformopt.data import load_text_dataset
    from xformopt.measure.host import effective_cpu_flags, host_info, usable_cpus
    from xformopt.measure.modes import real
    from xformopt.resources import vader_split_path
    from xformopt.runtime.encoder import OrtPredictor, TorchPredictor

    args.work.mkdir(parents=True, exist_ok=True)
    target = targets.detect(effective_cpu_flags())
    log(f"host target: {target.name}")
    ours, records = xformopt_artifact(args.model, args.work)
    spec = sources.resolve(str(args.model), task="feature-extraction")
    theirs = optimum_dynamic_int8(args.model, args.work / "optimum-int8", spec, target.name)
    threads = args.threads or usable_cpus()
    heldout = load_text_dataset(vader_split_path("test"), limit=args.cosine_rows, seed=0)
    texts = list(heldout.texts)
    paths = {"xformopt-int8": ours, "optimum-int8": theirs}
    if args.plain:
        paths["xformopt-int8-plain"] = xformopt_artifact(args.model, args.work, plain=True)[0]
    if args.fp32:
        paths.update({"xformopt-fused-fp32": args.work / "fused", "xformopt-export-fp32": args.work / "export"})
    predictors = {name: OrtPredictor(spec, path, threads=threads, tokenizer_dir=args.model) for name, path in paths.items()}
    for name, p in predictors.items():
        log(f"{name}: inputs {p.input_names}")

    log(f"PyTorch fp32 embeddings of {len(texts)} held-out texts")
    baseline = TorchPredictor(spec, threads=threads).predict(texts)
    cosine = {name: mean_cosine(p.predict(texts), baseline) for name, p in predictors.items()}
    for name, c in cosine.items():
        log(f"cosine to PyTorch fp32, {name}: mean {c['mean']:.5f} (min {c['min']:.4f}, n {c['n']})")

    timing_texts = texts[: args.timing_rows]
    lengths = [len(predictors["optimum-int8"].tokenizer(t)["input_ids"]) for t in timing_texts]
    log(f"timing {', '.join(predictors)} at batch 1, {args.rounds} interleaved rounds over {len(timing_texts)} texts "
        f"(tokens: median {int(np.median(lengths))}, max {max(lengths)}), {threads} threads")
    load_before = os.getloadavg()
    stats = real(predictors, timing_texts, None, rounds=args.rounds, warmup=args.warmup, seed=0)
    load_after = os.getloadavg()
    reference = stats["optimum-int8"].median_ms
    rows = {name: {"median_ms": s.median_ms, "p90_ms": s.p90_ms, "n": s.n,
                   "speedup_vs_optimum_int8": reference / s.median_ms} for name, s in stats.items()}
    fused = records["fuse"].get("fused_kept", {})
    result = {
        "model": str(args.model), "host": host_info(), "target": target.name, "threads": threads,
        "loadavg_before": load_before, "loadavg_after": load_after, "rounds": args.rounds,
        "token_lengths": {"median": float(np.median(lengths)), "max": int(max(lengths)), "n": len(lengths)},
        "fused_attention_blocks": fused.get("MultiHeadAttention", 0), "fuse_record": {k: records["fuse"].get(k) for k in (
            "fused_possible", "fused_kept", "expected", "kept", "reason")},
        "quantize_coverage": records["quantize"].get("coverage"),
        "quantize_agreement_to_float": records["quantize"].get("agreement"),
        "outliers": {k: v for k, v in (records["quantize"].get("outliers") or {}).items() if k != "nodes"},
        "cosine_to_pytorch_fp32": cosine, "latency": rows,
    }
    print(f"\nall-mpnet-base-v2, batch 1, {args.rounds} interleaved rounds, {threads} threads, load "
          f"{load_before[0]:.1f}->{load_after[0]:.1f}; attention blocks fused: {result['fused_attention_blocks']}/12")
    print(f"{'artifact':22} {'median ms':>10} {'p90 ms':>8} {'vs optimum-int8':>16} {'cosine':>8}")
    for name, row in rows.items():
        print(f"{name:22} {row['median_ms']:10.2f} {row['p90_ms']:8.2f} {row['speedup_vs_optimum_int8']:15.2f}x "
              f"{cosine[name]['mean']:8.4f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    from xformopt.logs import forwarded_to

    with forwarded_to(log):  # xformopt's own log lines, in this script's format
        main()
