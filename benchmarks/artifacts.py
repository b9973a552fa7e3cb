"""Several finished artifacts against each other: accuracy on the held-out rows, batch-1 latency in one
interleaved run on real held-out texts (tokenization included; ``--model-only``: the model call alone); ratios against the first artifact.

    python benchmarks/artifacts.py examples/sentiment/model out/int8 out/prune-distill-int8 --rounds 600

The first positional argument is the original model (it gives the task, labels and the PyTorch
baseline accuracy); each further argument is an artifact directory holding model.onnx. With
``--optimum DIR``, optimum's own dynamic-INT8 artifact of the model (xformopt/benchmarking/optimum_reference.py,
built in DIR or reused) is added first, so the ratios are against it. Never run as a test: speed
claims live here and in `xformopt bench`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads; see docs/guides/optimize.md, "How latency is measured"
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="the original Hugging Face model (baseline and labels)")
    parser.add_argument("artifacts", nargs="+", type=Path, help="artifact directories (model.onnx inside)")
    parser.add_argument("--limit", type=int, default=None, help="held-out rows scored (default: all)")
    parser.add_argument("--split", choices=("test", "validation"), default="test",
                        help="vendored split scored (validation: the rows `xformopt search` scores its front on)")
    parser.add_argument("--data", type=Path, default=None, metavar="FILE",
                        help="held-out rows of another task (CSV/TSV/JSONL) instead of a vendored split")
    parser.add_argument("--timing-rows", type=int, default=500, help="held-out texts cycled through when timing")
    parser.add_argument("--rounds", type=int, default=600, help="interleaved batch-1 rounds")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--model-only", action="store_true",
                        help="time the model call alone (texts tokenized beforehand), not tokenization + model")
    parser.add_argument("--no-pytorch", action="store_true", help="leave the PyTorch baseline out of the timing")
    parser.add_argument("--optimum", type=Path, default=None, metavar="DIR",
                        help="build (or reuse) optimum's dynamic-INT8 artifact in DIR and compare against it")
    args = parser.parse_args()

    import numpy as np

    from xformopt import sources, targets
    from xformopt.measure.host import effective_cpu_flags, host_info, usable_cpus
    from xformopt.measure.modes import model_call, real
    from xformopt.runtime.encoder import OrtPredictor, TorchPredictor

    spec = sources.resolve(args.model)
    task = spec.task_def
    if args.optimum is not None:
        from xformopt.benchmarking.optimum_reference import NAME, optimum_dynamic_int8

        target = targets.detect(effective_cpu_flags()).name
        print(f"{NAME} ({target}) in {args.optimum}", file=sys.stderr)
        args.artifacts.insert(0, optimum_dynamic_int8(Path(args.model), args.optimum, spec, target))
    threads = args.threads or usable_cpus()
    source = args.data or task.default_data(args.split)
    heldout = task.load(source, label2id=spec.label2id or None, limit=args.limit, seed=0)
    predictors = {"pytorch": TorchPredictor(spec, threads=threads)}
    for path in args.artifacts:
        name = path.name
        while name in predictors:
            name += "'"
        predictors[name] = OrtPredictor(spec, path, threads=threads)

    print(f"scoring {len(heldout)} rows of {source}", file=sys.stderr)
    baseline = predictors["pytorch"].predict_data(heldout)
    metric = task.report_headline(task.score(baseline, baseline, heldout))
    scores = {name: task.score(baseline if name == "pytorch" else p.predict_data(heldout), baseline, heldout)[metric]["value"]
              for name, p in predictors.items()}

    timed = {k: v for k, v in predictors.items() if not (args.no_pytorch and k == "pytorch")}
    rng = np.random.default_rng(0)
    rows = rng.choice(len(heldout), size=min(args.timing_rows, len(heldout)), replace=False)
    texts, pairs = task.timing_inputs(heldout.subset(rows))
    print(f"timing {len(timed)} variants, {args.rounds} interleaved rounds", file=sys.stderr)
    stats = (model_call if args.model_only else real)(timed, texts, pairs, rounds=args.rounds, warmup=20)

    host = host_info()
    first = args.artifacts[0].name
    print(f"{spec.source} ({spec.task}) on {host['cpu_model']} (target {targets.detect(effective_cpu_flags()).name}, "
          f"load {os.getloadavg()[0]:.1f}), {threads} threads; {len(heldout)} rows of {source} scored; "
          f"batch 1, {len(texts)} real held-out texts cycled, {args.rounds} interleaved rounds, "
          f"{'model call only' if args.model_only else 'tokenization included'}")
    print(f"{'variant':<28} {metric:>10} {'p50 ms':>8} {'p90 ms':>8} {f'speed-up vs {first}':>24}")
    for name, value in scores.items():
        lat = stats.get(name)
        if lat is None:
            print(f"{name:<28} {value:>10.4f} {'-':>8} {'-':>8} {'-':>24}")
            continue
        ratio = stats[first].median_ms / lat.median_ms if first in stats else float("nan")
        print(f"{name:<28} {value:>10.4f} {lat.median_ms:>8.2f} {lat.p90_ms:>8.2f} {ratio:>23.2f}x")


if __name__ == "__main__":
    main()
