"""INT8 on encoder-decoder graphs, measured on T5 built in code (tests/tiny_seq2seq.py; no checkpoint is
reachable offline).

(a) modes: the tiny T5 trained on the reverse task -> export -> fuse -> fp32 vs dynamic INT8 vs static
    INT8 (the target's formats): BLEU on the vendored reverse test split (held out from training, which
    draws fresh seeded pairs) and per-sentence greedy latency at batch 1, the three interleaved.
(b) T5 outliers: the same model with FFN outliers injected: in every layer, k rows of ``wi`` times c and
    the matching input columns of ``wo`` times 1/c (ReLU is positively homogeneous, so the float function
    is unchanged: checked on the PyTorch logits). Then dynamic INT8 with no rule ("plain") and with a rule
    on every ``DenseReluDense.wo`` (smooth, split, float): next-token agreement with the float graphs,
    BLEU, latency interleaved. The same rules on the model without outliers show what a rule costs when
    the outliers are not there.
(c) gated FFN (flan-t5/mT5's ``gated-gelu``): whether each treatment applies to ``wo`` there at all.

Run: PYTHONPATH=.:tests python benchmarks/seq2seq_int8.py --out benchmarks/results/seq2seq-int8
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tiny_seq2seq: models built in code

WO_RULE = r"model\.(encoder|decoder)\.block\.\d+\.layer\.\d+\.DenseReluDense\.wo"


def host() -> dict:
    from xformopt.measure.host import cpu_model, effective_cpu_flags, library_versions
    from xformopt.targets import detect

    flags = sorted(f for f in effective_cpu_flags() if f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8"))
    return {"cpu": cpu_model(), "flags": flags, "target": detect().name, "versions": library_versions()}


def export_fuse(hf: Path, root: Path) -> Path:
    from xformopt import api

    api.run_pass("export", hf, root / "export", force=True)
    api.run_pass("fuse", root / "export", root / "fuse", force=True, select="all")
    return root / "fuse"


def quantize(fused: Path, out: Path, rule: str | None, **options) -> dict:
    """The quantize pass with the t5 row's outlier rule replaced by ``rule`` on every wo (None: no rule)."""
    from xformopt import api, families

    row = families.FAMILIES["t5"]
    families.FAMILIES["t5"] = dataclasses.replace(row, int8_outliers=((WO_RULE, rule),) if rule else ())
    try:
        result = api.run_pass("quantize", fused, out, force=True, check=False, **options)
    finally:
        families.FAMILIES["t5"] = row
    return result.entry["record"]


def held_out():
    from xformopt.resources import word_seq2seq_path

    rows = [json.loads(line) for line in word_seq2seq_path("reverse", "test").read_text().splitlines()]
    return [r["source"] for r in rows], [r["target"] for r in rows]


def quality(float_dir: Path, dirs: dict[str, Path], texts, targets, threads: int) -> dict:
    """BLEU of each stage's greedy output, and next-token agreement with the float graphs."""
    from xformopt.models import load_tokenizer
    from xformopt.passes.seq2seq_stages import _settings
    from xformopt.scoring.text_generation import bleu
    from xformopt.seq2seq.measure import decode, forced_agreement, generate_rows
    from xformopt.seq2seq.runner import OrtSeq2Seq

    tokenizer = load_tokenizer(float_dir)
    settings = _settings(float_dir)
    reference = generate_rows(OrtSeq2Seq(float_dir, threads), tokenizer, texts, settings)
    out = {}
    for name, path in dirs.items():
        runner = OrtSeq2Seq(path, threads)
        rows = generate_rows(runner, tokenizer, texts, settings)
        hits = forced_agreement(runner, tokenizer, texts, reference)
        out[name] = {"bleu": round(bleu(decode(tokenizer, rows), targets)["value"], 2),
                     "next_token_agreement": round(float(hits.mean()), 4), "positions": int(hits.size),
                     "same_output_as_float": round(float(np.mean([a == b for a, b in zip(rows, reference)])), 4)}
    return out


def latency(dirs: dict[str, Path], texts, threads: int, rounds: int) -> dict:
    """Median ms per sentence (greedy, batch 1), every stage on the same sentence each round, shuffled order."""
    from xformopt.measure.latency import run_interleaved
    from xformopt.models import load_tokenizer
    from xformopt.passes.seq2seq_stages import _settings
    from xformopt.seq2seq.generate import generate
    from xformopt.seq2seq.measure import encode
    from xformopt.seq2seq.runner import OrtSeq2Seq

    first = next(iter(dirs.values()))
    tokenizer, settings = load_tokenizer(first), _settings(first)
    encoded = [encode(tokenizer, [t]) for t in texts]
    runners = {n: OrtSeq2Seq(p, threads) for n, p in dirs.items()}
    calls = {n: (lambda i, r=r: generate(r, encoded[i]["input_ids"], encoded[i]["attention_mask"], settings))
             for n, r in runners.items()}
    stats = run_interleaved(calls, len(encoded), warmup=2, iterations=rounds, seed=0)
    base = stats[next(iter(dirs))].median_ms
    return {n: {"median_ms": round(s.median_ms, 3), "p90_ms": round(s.p90_ms, 3), "n": s.n,
                "ratio_to_first": round(s.median_ms / base, 3)} for n, s in stats.items()}


def summary(record: dict) -> dict:
    cov = record["coverage"]
    out = {"mode": record["mode"], "int8": cov["int8"], "weighted_gemms": cov["weighted_gemms"],
           "int8_ops": cov["int8_ops"], "pass_agreement": round(record["agreement"]["mean_agreement"], 4)}
    if "outliers" in record:
        o = record["outliers"]
        out["outliers"] = {"nodes": len(o["nodes"]), "kept_float": len(o["kept_float"]), "skipped": len(o["skipped"]),
                           "float_parity": o.get("float_parity_max_abs_diff"),
                           "peak_over_median": sorted(round(n["peak_over_median"], 1) for n in o["nodes"].values())}
    if "calibration" in record:
        cal = record["calibration"]
        out["calibration"] = {k: cal[k] for k in ("rows", "encoder_feeds", "decoder_feeds", "decoder_steps_seen")}
    return out


def part_a(hf: Path, root: Path, args) -> dict:
    fused = export_fuse(hf, root)
    records = {"dynamic": quantize(fused, root / "dynamic", None),
               "static": quantize(fused, root / "static", None, mode="static")}
    dirs = {"fp32": fused, "dynamic": root / "dynamic", "static": root / "static"}
    texts, targets = held_out()
    return {"quantize": {k: summary(r) for k, r in records.items()},
            "quality": quality(fused, dirs, texts, targets, args.threads),
            "latency": latency(dirs, texts[:args.sentences], args.threads, args.rounds)}


def inject(hf: Path, out: Path, k: int, c: float, seed: int = 0) -> dict:
    """The outlier model: k FFN channels per layer scaled by c in ``wi`` and 1/c in ``wo``; its float
    logits against the original's."""
    import shutil

    import torch
    from tiny_seq2seq import inject_ffn_outliers
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    shutil.copytree(hf, out, dirs_exist_ok=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(hf).eval()
    original = AutoModelForSeq2SeqLM.from_pretrained(hf).eval()
    layers = inject_ffn_outliers(model, k, c, seed)
    model.save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(hf)
    texts, _ = held_out()
    enc = tokenizer(texts[:32], padding=True, return_tensors="pt")
    start = torch.zeros((len(texts[:32]), 1), dtype=torch.long)
    with torch.no_grad():
        a = original(**enc, decoder_input_ids=start).logits
        b = model(**enc, decoder_input_ids=start).logits
    return {"k": k, "c": c, "layers": layers,
            "float_max_abs_logit_diff": float((a - b).abs().max()), "logit_scale": float(a.abs().max())}


def part_b(hf: Path, root: Path, args) -> dict:
    texts, targets = held_out()
    results = {}
    models = [(f"outliers_c{c:g}", root / f"hf-c{c:g}", c) for c in args.c] + [("without_outliers", hf, None)]
    for name, model, c in models:
        if c is not None:
            results[name] = {"injection": inject(hf, model, args.k, c)}
        base = root / name
        fused = export_fuse(model, base)
        records = {rule or "plain": quantize(fused, base / (rule or "plain"), rule)
                   for rule in (None, "smooth", "split", "float")}
        dirs = {"fp32": fused, **{n: base / n for n in records}}
        results.setdefault(name, {}).update({"quantize": {n: summary(r) for n, r in records.items()},
                                             "quality": quality(fused, dirs, texts, targets, args.threads)})
        if c == args.c[0]:
            results[name]["latency"] = latency(dirs, texts[:args.sentences], args.threads, args.rounds)
    return results


def part_c(root: Path) -> dict:
    """A random gated-gelu T5 (flan-t5 / mT5 FFN): which treatments reach its wo GEMMs."""
    import transformers
    from tiny_seq2seq import build_seq2seq, make_config

    hf = build_seq2seq(root / "hf-gated", "t5")
    config = make_config("t5")
    config.feed_forward_proj, config.is_gated_act, config.dense_act_fn = "gated-gelu", True, "gelu_new"
    transformers.T5ForConditionalGeneration(config).eval().save_pretrained(hf)
    fused = export_fuse(hf, root / "gated")
    out = {}
    for rule in ("smooth", "split"):
        o = quantize(fused, root / "gated" / rule, rule)["outliers"]
        out[rule] = {"treated": len(o["nodes"]), "skipped": len(o["skipped"]),
                     "why": sorted(set(o["skipped"].values()))[:1]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/seq2seq-int8"))
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=240, help="interleaved rounds (one sentence each)")
    parser.add_argument("--sentences", type=int, default=24, help="held-out sentences timed per round")
    parser.add_argument("-k", type=int, default=4, help="outlier channels per FFN")
    parser.add_argument("-c", type=lambda v: [float(x) for x in v.split(",")], default=[64.0, 1024.0],
                        help="outlier scales, comma-separated (a study per scale; latency on the first)")
    parser.add_argument("--parts", default="a,b,c")
    args = parser.parse_args()

    from tiny_seq2seq import build_seq2seq

    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    hf = args.work / "hf-trained"
    if not (hf / "config.json").is_file():
        build_seq2seq(hf, "t5", train_steps=args.train_steps)
    path = args.out / "results.json"  # parts run separately update one file
    results: dict = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    results.update({"host": host(), "args": {k: str(v) for k, v in vars(args).items()}})
    for part, key, run in (("a", "a_modes", lambda: part_a(hf, args.work / "a", args)),
                           ("b", "b_outliers", lambda: part_b(hf, args.work / "b", args)),
                           ("c", "c_gated", lambda: part_c(args.work / "c"))):
        if part in args.parts.split(","):
            results[key] = run()
            print(json.dumps(results[key], indent=1), flush=True)
            results[f"{key}_seconds"] = round(time.time() - started, 1)
            path.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")

if __name__ == "__main__":
    main()
