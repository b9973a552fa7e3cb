"""PyTorch eager fp32 vs ONNX fp32 vs fused vs INT8, in one interleaved run; prints the ratios.

    python benchmarks/stages.py examples/sentiment/model --rounds 300

Passes come from xformopt's cache when they were already built (run `xformopt optimize` first to
avoid paying for export here). Never run as a test: speed claims live here and in `xformopt bench`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads; see docs/guides/optimize.md, "How latency is measured"
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="examples/sentiment/model")
    parser.add_argument("--target", default="auto")
    parser.add_argument("--recipe", default="default")
    parser.add_argument("--limit", type=int, default=500, help="held-out rows scored and cycled through")
    parser.add_argument("--rounds", type=int, default=300, help="interleaved batch-1 rounds")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()

    from xformopt import recipe, sources, targets
    from xformopt.evaluate.run import evaluate_stages
    from xformopt.logs import forwarded_to
    from xformopt.measure.host import effective_cpu_flags, host_info, usable_cpus
    from xformopt.pipeline import load_heldout, run_passes, verification_context

    r = recipe.load(args.recipe)
    r = recipe.validate({**r.to_dict(), "target": args.target, "evaluation": {
        **r.evaluation.model_dump(), "limit": args.limit, "latency_rounds": args.rounds, "repeats": 1}})
    spec = sources.resolve(args.model)
    heldout = load_heldout(r, spec)
    threads = args.threads or usable_cpus()
    ctx = verification_context(spec, targets.resolve(r.target), r.evaluation.data, r.evaluation.text_column, threads,
                               effective_cpu_flags(), reported_texts=heldout.texts)
    with tempfile.TemporaryDirectory() as work, forwarded_to(lambda m: print(f"  {m}", file=sys.stderr)):
        stages, _ = run_passes(r, ctx, True, Path(work))
        result = evaluate_stages(stages, spec, heldout, r.evaluation, threads)

    host = host_info()
    metric = spec.task_def.report_headline(result["artifact"]["metrics"])
    print(f"{spec.source} ({spec.task}) on {host['cpu_model']}, {threads} threads, target {ctx.target.name}")
    print(f"batch 1, {len(heldout)} real held-out texts cycled, {args.rounds} interleaved rounds, tokenization included\n")
    print(f"{'stage':<10} {metric:>20} {'p50 ms':>8} {'p90 ms':>8} {'vs pytorch':>11} {'vs onnx fp32':>13}")
    rows = result["stages"]
    export_p50 = rows["export"]["latency"]["median_ms"] if "export" in rows else None
    for name, row in rows.items():
        m = row["metrics"][metric]
        lat = row["latency"]
        vs_export = f"{export_p50 / lat['median_ms']:.2f}x" if export_p50 else "-"
        print(f"{name:<10} {m['value']:>20.4f} {lat['median_ms']:>8.2f} {lat['p90_ms']:>8.2f} "
              f"{row['speedup']:>10.2f}x {vs_export:>13}")


if __name__ == "__main__":
    main()
