"""Span agreement with fp32 of xformopt's INT8 QA artifact and of optimum's own dynamic INT8, same rows.

Runs ``xformopt optimize`` (export -> fuse -> dynamic INT8, target avx512_vnni) on MODEL, quantizes
optimum's own ONNX export with ``ORTQuantizer`` + ``AutoQuantizationConfig.avx512_vnni(is_static=False)``,
then predicts answer spans for every row of DATA (SQuAD formats, see xformopt/tasks/qa_data.py) with
the PyTorch fp32 model and both INT8 graphs, through the same windowing and span decoding:

    python benchmarks/qa_agreement.py MODEL_DIR squad-dev.json --limit 500

Prints one JSON object: per variant the fraction of rows whose span equals fp32's (Wilson 95% CI),
the character-overlap span F1 with fp32, and EM/F1 where the rows are answered.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path


def xformopt_int8(model: Path, data: Path, work: Path, limit: int | None) -> tuple[Path, dict]:
    from xformopt.cli.app import main

    recipe = work / "qa.yaml"
    recipe.write_text("name: qa-bench\ntarget: avx512_vnni\npasses:\n  - export\n  - fuse\n  - quantize: {mode: dynamic}\n"
                      f"evaluation:\n  data: {data}\n  limit: {limit or 'null'}\n  latency_rounds: 5\n  warmup: 1\n  repeats: 1\n")
    out = work / "xformopt-int8"
    with contextlib.redirect_stdout(sys.stderr):  # its summary table; stdout is this script's JSON
        try:
            main(["optimize", str(model), "--recipe", str(recipe), "-o", str(out), "--quiet"])
        except SystemExit as exc:
            if exc.code:
                raise
    return out, json.loads((out / "manifest.json").read_text())


def first(tree, key: str):
    """The first value stored under ``key`` anywhere in a JSON tree (the quantize pass's formats)."""
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        tree = list(tree.values())
    if isinstance(tree, list):
        for item in tree:
            found = first(item, key)
            if found is not None:
                return found
    return None


def main() -> None:
    from xformopt.benchmarking.optimum_reference import optimum_dynamic_int8

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="a ...ForQuestionAnswering checkpoint folder")
    parser.add_argument("data", type=Path, help="SQuAD rows: official JSON, .jsonl, or a datasets folder")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    from xformopt.runtime.encoder import OrtPredictor, TorchPredictor
    from xformopt.sources import resolve

    spec = resolve(str(args.model))
    task = spec.task_def
    data = task.load(args.data, label2id=None, limit=args.limit, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        artifact, manifest = xformopt_int8(args.model, args.data, work, args.limit)
        theirs = optimum_dynamic_int8(Path(args.model), work / "optimum-int8", spec, "avx512_vnni")
        fp32 = TorchPredictor(spec, args.model, threads=args.threads).predict_data(data)
        variants = {
            "xformopt_int8": OrtPredictor(spec, artifact, threads=args.threads).predict_data(data),
            "optimum_int8_avx512_vnni": OrtPredictor(spec, theirs, threads=args.threads).predict_data(data),
        }
        from xformopt.tasks.question_answering import same_span

        ours, theirs_out = (same_span(v, fp32) for v in variants.values())
        result = {
            "model": str(args.model), "data": data.source, "rows": len(data), "threads": args.threads,
            "fp32": {k: v for k, v in task.score(fp32, fp32, data).items() if k in ("exact_match", "f1")},
            "variants": {name: task.score(out, fp32, data) for name, out in variants.items()},
            # paired: rows where only one of the two INT8 graphs moved the answer off fp32's span
            "paired": {"both_same_as_fp32": int((ours & theirs_out).sum()), "only_xformopt_differs": int((~ours & theirs_out).sum()),
                       "only_optimum_differs": int((ours & ~theirs_out).sum()), "both_differ": int((~ours & ~theirs_out).sum())},
            "xformopt_int8_formats": first(manifest, "formats"),
            "optimum_config": "AutoQuantizationConfig.avx512_vnni(is_static=False): QOperator, u8/s8, per-channel",
        }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
