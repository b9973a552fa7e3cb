"""Which distillation terms pay: one pruned student, distilled once per variant with the same budget,
each scored on held-out rows with 95% bootstrap CIs, and the difference to the plain variant paired
row by row (same rows, same student before distillation).

    python benchmarks/distill_ablation.py TEACHER --train train.jsonl --validation validation.jsonl \\
        --test test.jsonl --shape 3,8,512 --epochs 3 -o ablation/

Variants (``--variants``, comma-separated): ``base`` (KL + cross-entropy, the shipped recipe's terms
without QAT), ``hidden`` (+ hidden-state MSE, weight 1), ``relation`` (+ MiniLM relation KL, weight 1),
``attention`` (+ attention-map MSE, weight 1), ``augment`` (+ one teacher-labelled augmented copy of
each training text), ``augment4`` (+ four), ``unlabeled`` (+ the texts of ``--unlabeled FILE``,
teacher-labelled), ``select_kl`` (best checkpoint by KL to the teacher, not accuracy), ``patience4``
(early stopping after 4 evaluations without improvement; every other variant trains all planned steps),
``last`` (the last step's weights, not the best evaluation's: the validation rows then choose nothing),
``lr3e-4`` and ``kd_only`` (``last`` with a 3x learning rate, or with the soft-target term alone: alpha 1),
``qat`` (one quantization-aware epoch after the same epochs as ``base``: with no time budget the runs are
deterministic, so qat's student before its QAT epoch is base's student, bit for bit). Every variant's
student is also exported and quantized (dynamic INT8, the target's formats, no budget) and scored in ONNX
Runtime: ``base`` INT8 is post-training quantization of the student that ``qat`` then trains
quantization-aware. Writes ``ablation.json`` and ``ablation.md`` into -o. Never run as a test: it trains
for minutes per variant.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

VARIANTS = {
    "base": {},
    "hidden": {"hidden_weight": 1.0},
    "relation": {"relation_weight": 1.0},
    "attention": {"attention_weight": 1.0},
    "augment": {"augment": 1},
    "augment4": {"augment": 4},
    "unlabeled": {},  # unlabeled_data: --unlabeled FILE
    "select_kl": {"select": "kl_to_teacher"},
    "patience4": {"patience": 4},
    "last": {"keep": "last"},
    "lr3e-4": {"keep": "last", "lr": 3e-4},
    "kd_only": {"keep": "last", "alpha": 1.0},
    "qat": {"qat": True, "qat_epochs": 1.0},
}
BASE = dict(temperature=2.0, alpha=0.5, lr=1e-4, batch_size=32)


def bootstrap(correct, base, resamples: int = 2000, seed: int = 0):
    """(accuracy, its 95% CI, difference to base, its paired 95% CI), in points."""
    from xformopt.scoring.metrics import mean_with_bootstrap

    acc, diff = (mean_with_bootstrap(v, seed, resamples) for v in (correct, correct - base))
    return (100 * acc["value"], [100 * c for c in acc["ci95"]], 100 * diff["value"], [100 * c for c in diff["ci95"]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("teacher", type=Path)
    parser.add_argument("--train", type=Path, required=True)
    parser.add_argument("--validation", type=Path, required=True)
    parser.add_argument("--test", type=Path, required=True)
    parser.add_argument("--shape", default="3,8,512", help="layers,heads_per_layer,ffn_dim")
    parser.add_argument("--minutes", type=float, default=None,
                        help="distill time budget per variant (default: none, --epochs decide: deterministic, "
                             "so base and qat train the very same student before qat's QAT epoch)")
    parser.add_argument("--epochs", type=float, default=3.0, help="distillation epochs per variant (qat: then 1 more, QAT)")
    parser.add_argument("--variants", default="base,hidden,relation,attention,augment,qat")
    parser.add_argument("--unlabeled", type=Path, default=None, help="texts for the unlabeled variant (one per line)")
    parser.add_argument("-o", "--out", type=Path, required=True)
    args = parser.parse_args()

    import numpy as np

    from xformopt import api, sources, targets
    from xformopt.measure.host import effective_cpu_flags, host_info, usable_cpus
    from xformopt.runtime.encoder import OrtPredictor, TorchPredictor

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or "base" not in variants:
        sys.exit(f"error: --variants takes {', '.join(VARIANTS)} and must include base (got {args.variants})")
    if "unlabeled" in variants and args.unlabeled is None:
        sys.exit("error: the unlabeled variant needs --unlabeled FILE")
    options_of = {**VARIANTS, "unlabeled": {"unlabeled_data": str(args.unlabeled)} if args.unlabeled else {}}
    layers, heads, ffn = (int(x) for x in args.shape.split(","))
    target = targets.detect(effective_cpu_flags()).name
    args.out.mkdir(parents=True, exist_ok=True)
    spec = sources.resolve(str(args.teacher))
    task = spec.task_def
    test = task.load(str(args.test), label2id=spec.label2id or None, limit=None, seed=0)
    gold = np.asarray(test.labels)
    threads = usable_cpus()
    teacher_pred = TorchPredictor(spec, threads=threads).predict_data(test).argmax(-1)
    pruned = args.out / "pruned"
    if not pruned.exists():
        api.run_pass("prune", args.teacher, pruned, target=target, data=str(args.train), layers=layers,
                     heads_per_layer=heads, ffn_dim=ffn, measure_latency=False)
    results, correct = {}, {}
    for name in variants:
        student = args.out / name
        if not student.exists():
            print(f"distilling: {name}", file=sys.stderr)
            options = {"max_minutes": args.minutes, "epochs": args.epochs, "patience": 0, "checkpoint_every": 0,
                       "resume": False, **BASE, **options_of[name]}
            api.run_pass("distill", pruned, student, target=target, data=str(args.test), teacher=str(args.teacher),
                         train_data=str(args.train), eval_data=str(args.validation), **options)
        onnx_dir, int8_dir = args.out / f"{name}-onnx", args.out / f"{name}-int8"
        if not int8_dir.exists():
            api.run_pass("export", student, onnx_dir, target=target, data=str(args.test))
            api.run_pass("quantize", onnx_dir, int8_dir, target=target, data=str(args.test), mode="dynamic")
        sspec = sources.resolve(str(student))  # the student itself (stage_spec keeps the teacher's path)
        float_pred = TorchPredictor(sspec, threads=threads).predict_data(test).argmax(-1)
        int8_pred = OrtPredictor(spec, Path(int8_dir), threads=threads).predict_data(test).argmax(-1)
        correct[name] = {"float": (float_pred == gold).astype(float), "int8": (int8_pred == gold).astype(float)}
        record = json.loads((student / "manifest.json").read_text())["passes"][-1]["record"]
        results[name] = {"options": options_of[name], "steps": record["training"]["steps"],
                         "validation_float_pt": round(100 * record["quality"]["after"]["accuracy"], 2),
                         "epochs": record["training"]["epochs"], "seconds": record["pass_seconds"],
                         "qat": {k: record["qat"][k] for k in ("ptq_on_eval_rows", "qat_on_eval_rows")}
                         if record.get("qat") else None}
    for name in variants:
        for kind in ("float", "int8"):
            acc, ci, diff, dci = bootstrap(correct[name][kind], correct["base"][kind])
            results[name][kind] = {"accuracy_pt": round(acc, 2), "ci95": [round(c, 2) for c in ci],
                                   "vs_base_pt": round(diff, 2), "vs_base_ci95": [round(c, 2) for c in dci]}
    host = host_info()
    doc = {"teacher": str(args.teacher), "test": str(args.test), "rows": len(test), "shape": [layers, heads, ffn],
           "minutes_per_variant": args.minutes, "epochs": args.epochs, "target": target,
           "teacher_accuracy_pt": round(float((teacher_pred == gold).mean() * 100), 2),
           "host": {k: host.get(k) for k in ("cpu_model", "cores_usable")}, "load": os.getloadavg()[0],
           "variants": results}
    (args.out / "ablation.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"PyTorch fp32 teacher {doc['teacher_accuracy_pt']:.2f}% on {len(test)} rows; student "
             f"{layers}x{heads}x{ffn}, {args.epochs:g} epochs each" + (f" within {args.minutes:g} min" if args.minutes else "")
             + " (qat: then 1 QAT epoch); 95% bootstrap CIs, differences paired per row", "",
             "| variant | steps | validation float | float acc (CI) | vs base | INT8 acc (CI) | vs base |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        f, q = r["float"], r["int8"]
        lines.append(f"| {name} | {r['steps']} | {r['validation_float_pt']:.2f} | {f['accuracy_pt']:.2f} ({f['ci95'][0]:.2f}–{f['ci95'][1]:.2f}) | "
                     f"{f['vs_base_pt']:+.2f} ({f['vs_base_ci95'][0]:+.2f}, {f['vs_base_ci95'][1]:+.2f}) | "
                     f"{q['accuracy_pt']:.2f} ({q['ci95'][0]:.2f}–{q['ci95'][1]:.2f}) | "
                     f"{q['vs_base_pt']:+.2f} ({q['vs_base_ci95'][0]:+.2f}, {q['vs_base_ci95'][1]:+.2f}) |")
    (args.out / "ablation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
