"""The dynamo exporter vs the TorchScript one on one model: export -> fuse (all) -> dynamic INT8 by each,
then batch-1 latency on real held-out texts, both artifacts interleaved in one run.

    python benchmarks/dynamo_export.py minilm --task feature-extraction --rounds 300 --json out.json

Prints, per exporter, the fused-op counts after ``fuse``, the INT8 ops after ``quantize``, the
median/p90 latency with n, and the dynamo/TorchScript median ratio; cosine of each INT8 artifact's
outputs to the PyTorch fp32 model on the same texts.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path


def build(spec, ctx, exporter: str, root: Path) -> tuple[Path, dict]:
    from xformopt.passes import get_pass

    facts: dict = {}
    src = spec.path
    for name, options in (("export", {"exporter": exporter}), ("fuse", {"select": "all"}), ("quantize", {})):
        cls = get_pass(name)
        dst = root / exporter / name
        dst.mkdir(parents=True, exist_ok=True)
        record = cls().run(ctx, src, dst, cls.Options.model_validate(options))
        if name == "export":
            facts["parity"] = record["parity"]
        if name == "fuse":
            facts["fused"] = {k: v for k, v in record["fused_kept"].items() if v}
            facts["fusion_route"] = record["fusion_route"]
        src = dst
    from xformopt.onnx_graph import load_graph, op_counts

    counts = op_counts(load_graph(src / "model.onnx"))
    facts["int8_ops"] = {op: counts[op] for op in ("QAttention", "MatMulInteger", "DynamicQuantizeMatMul", "Attention",
                                                   "MultiHeadAttention", "MatMul") if counts.get(op)}
    return src, facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a model path or alias, e.g. minilm")
    parser.add_argument("--task", default=None)
    parser.add_argument("--rounds", type=int, default=300, help="interleaved batch-1 calls per artifact")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--keep", type=Path, default=None, help="write the stages here (default: a temp dir)")
    args = parser.parse_args()

    from xformopt import pipeline, sources, targets
    from xformopt.measure import host
    from xformopt.measure.modes import real
    from xformopt.runtime.encoder import OrtPredictor, TorchPredictor
    from xformopt.scoring.metrics import row_cosine

    spec = sources.resolve(args.model, args.task)
    target = targets.detect()
    ctx = pipeline.verification_context(spec, target, None, None, args.threads, host.effective_cpu_flags(),
                                        lambda m: print(m, flush=True))
    texts = list(ctx.sample_texts)
    result: dict = {"model": args.model, "task": spec.task, "target": target.name, "threads": args.threads,
                    "texts": len(texts), "exporters": {}}
    with tempfile.TemporaryDirectory() as tmp:
        if args.keep:
            tmp = args.keep
        stages = {}
        for exporter in ("torchscript", "dynamo"):
            stages[exporter], result["exporters"][exporter] = build(spec, ctx, exporter, Path(tmp))
        reference = TorchPredictor(spec, spec.path, threads=args.threads).predict(texts)
        predictors = {name: OrtPredictor(spec, stage, threads=args.threads) for name, stage in stages.items()}
        for name, predictor in predictors.items():
            cos = row_cosine(reference, predictor.predict(texts))
            result["exporters"][name]["cosine_to_fp32"] = {"mean": round(float(cos.mean()), 5),
                                                           "min": round(float(cos.min()), 5), "n": len(texts)}
        stats = real(predictors, texts, None, rounds=args.rounds, warmup=20)
    for name, st in stats.items():
        result["exporters"][name]["latency_ms"] = {"median": round(st.median_ms, 3), "p90": round(st.p90_ms, 3),
                                                   "n": st.n}
    result["dynamo_over_torchscript_median"] = round(stats["dynamo"].median_ms / stats["torchscript"].median_ms, 3)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
