"""BART and Marian (and T5) through xformopt's decode loop against PyTorch: the INT8 artifact's tokens/s over
``transformers``' ``generate`` on the same model, greedy and 4 beams, batch 1, interleaved rounds.

Random weights at a small real size built in code (d_model 512, 6 + 6 layers, 8 heads, FFN 1024, vocabulary
32128; the word-level tokenizer of tests/tiny_seq2seq.py): both engines generate exactly ``--tokens`` tokens
(minimum = maximum length), so the work per sentence is the same. CTranslate2 is not in this table: its
converter takes neither transformers 5's BART config nor our word-level Marian vocabulary.

Run: python benchmarks/seq2seq_families_speed.py --out benchmarks/results/seq2seq-families
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from seq2seq_ctranslate2 import bootstrap_median, xformopt_int8  # noqa: E402

SHAPE = dict(d_model=512, layers=6, heads=8, vocab=32128)


def build(family: str, root: Path) -> Path:
    from tiny_seq2seq import build_seq2seq

    if (root / "hf" / "config.json").is_file():
        return root / "hf"
    return build_seq2seq(root / "hf", family, **SHAPE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default="bart,marian")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path)
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from xformopt.measure.host import cpu_model
    from xformopt.resources import word_seq2seq_path
    from xformopt.seq2seq.text import Text2TextModel

    texts = [json.loads(line)["source"] for line in word_seq2seq_path("reverse", "test").read_text().splitlines()]
    cells = []
    for family in args.families.split(","):
        root = (args.work or args.out / "work") / family
        src = build(family, root)
        artifact = xformopt_int8(src, root)
        hf = AutoModelForSeq2SeqLM.from_pretrained(src).eval()
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            ours = Text2TextModel(artifact, threads=threads)
            for beams in (int(b) for b in args.beams.split(",")):
                settings = ours.settings.with_(max_new_tokens=args.tokens, min_new_tokens=args.tokens, num_beams=beams,
                                               early_stopping=False)

                def run_ours(text):
                    return ours.generate([text], settings)

                def run_torch(text):
                    enc = ours.tokenizer([text], return_tensors="pt")
                    with torch.no_grad():
                        return hf.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                                           max_new_tokens=args.tokens, min_new_tokens=args.tokens, num_beams=beams,
                                           do_sample=False, early_stopping=False)

                fns = {"xformopt int8": run_ours, "pytorch fp32": run_torch}
                cells.append({"family": family, "threads": threads, "beams": beams,
                              **timed(fns, texts, args.rounds, args.tokens, seed=threads * 10 + beams)})
                print(json.dumps(cells[-1]), file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"cpu": cpu_model(), "shape": SHAPE, "tokens": args.tokens,
                                                       "cells": cells}, indent=1) + "\n")
    lines = ["| family | threads | beams | xformopt int8 tokens/s | PyTorch fp32 tokens/s | x PyTorch (median) | 95% CI |",
             "|---|---|---|---|---|---|---|"]
    for c in cells:
        lines.append(f"| {c['family']} | {c['threads']} | {c['beams']} | {c['xformopt int8']:.0f} | {c['pytorch fp32']:.0f} | "
                     f"{c['ratio_median']:.2f} | {c['ratio_ci95'][0]:.2f}-{c['ratio_ci95'][1]:.2f} |")
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def timed(fns: dict, texts: list[str], rounds: int, tokens: int, seed: int) -> dict:
    for fn in fns.values():
        fn(texts[0])
    rates = {name: [] for name in fns}
    order, rng = list(fns), random.Random(seed)
    for r in range(rounds):
        rng.shuffle(order)
        for name in order:
            started = time.perf_counter()
            fns[name](texts[r % len(texts)])
            rates[name].append(tokens / (time.perf_counter() - started))
    ratio = np.asarray(rates["xformopt int8"]) / np.asarray(rates["pytorch fp32"])
    low, high = bootstrap_median(ratio)
    return {**{name: float(np.median(v)) for name, v in rates.items()}, "ratio_median": float(np.median(ratio)),
            "ratio_ci95": [low, high], "rounds": rounds}


if __name__ == "__main__":
    main()
