"""Word-level arg-max agreement with the PyTorch fp32 model of two INT8 paths for a token-classification
model, on the same held-out sentences in one run: xformopt's (export -> fuse -> quantize, the default
recipe's passes) and optimum's own dynamic INT8 (ORTQuantizer on the optimum-exported graph).

    python benchmarks/token_classification_agreement.py MODEL_DIR DATA [--target avx512_vnni] [--limit N]

DATA: any file the token-classification task reads (CoNLL, JSONL/CSV tokens+tags, datasets dir).
Prints one JSON object: per path, agreement_with_baseline (words), token_accuracy and entity_f1 where
the sentences are tagged, and the INT8 op counts. Never run as a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def xformopt_int8(spec, model_dir: Path, work: Path, texts, target: str) -> tuple[Path, dict]:
    from xformopt import targets
    from xformopt.passes import get_pass
    from xformopt.passes.base import PassContext

    ctx = PassContext(spec, targets.PROFILES[target], list(texts), 2, set(), print)
    src, records = model_dir, {}
    for name, options in (("export", {}), ("fuse", {"select": "all"}), ("quantize", {})):
        cls = get_pass(name)
        dst = work / f"xformopt-{name}"
        dst.mkdir()
        records[name] = cls().run(ctx, src, dst, cls.Options.model_validate(options))
        src = dst
    return src, records["quantize"]


def int8_ops(model_dir: Path) -> dict:
    import onnx

    counts = Counter(n.op_type for n in onnx.load(str(model_dir / "model.onnx"), load_external_data=False).graph.node)
    return {op: c for op, c in sorted(counts.items()) if "Integer" in op or op.startswith(("Q", "DynamicQuant"))}


def main() -> None:
    from xformopt.benchmarking.optimum_reference import optimum_dynamic_int8

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path, help="a ...ForTokenClassification Hugging Face directory")
    parser.add_argument("data", help="held-out sentences (CoNLL, JSONL/CSV tokens+tags, datasets dir)")
    parser.add_argument("--target", default="avx512_vnni", choices=["avx2", "avx512", "avx512_vnni"])
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args()

    from xformopt import sources
    from xformopt.runtime.encoder import OrtPredictor, TorchPredictor

    spec = sources.resolve(str(args.model))
    task = spec.task_def
    data = task.load(args.data, label2id=spec.label2id or None, limit=args.limit, seed=0)
    baseline = TorchPredictor(spec, threads=2).predict_data(data)
    result = {"model": str(args.model), "data": data.source, "sentences": len(data), "target": args.target}
    with tempfile.TemporaryDirectory(prefix="tok-agreement-") as tmp:
        work = Path(tmp)
        ours, record = xformopt_int8(spec, args.model, work, data.texts[:200], args.target)
        theirs = optimum_dynamic_int8(Path(args.model), work / "optimum-int8", spec, args.target)
        for name, directory in (("xformopt_int8", ours), ("optimum_dynamic_int8", theirs)):
            outputs = OrtPredictor(spec, directory, threads=2).predict_data(data)
            metrics = task.score(outputs, baseline, data)
            result[name] = {
                **{k: round(v["value"], 6) for k, v in metrics.items()},
                "words_compared": metrics["agreement_with_baseline"]["n"],
                "mean_row_agreement": round(float(task.agreement(outputs, baseline).mean()), 6),
                "int8_ops": int8_ops(directory),
            }
        result["xformopt_int8"]["formats"] = record["formats"]
        result["baseline"] = {k: round(v["value"], 6) for k, v in task.score(baseline, baseline, data).items()}
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
