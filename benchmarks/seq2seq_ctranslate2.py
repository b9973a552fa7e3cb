"""xformopt's INT8 encoder-decoder artifact against CTranslate2's INT8 and PyTorch: same model, same
inputs, same threads, one interleaved run (each round: every engine translates the same sentence at
batch 1, greedy, in a shuffled order).

Two models, both T5 built in code (no checkpoint is reachable offline; CTranslate2 4.8's converter
fails on transformers 5's BART config and on our word-level Marian vocabulary, T5 converts):

- ``trained``: the tiny T5 of tests/tiny_seq2seq.py trained 800 steps on the reverse task, scored by BLEU
  on the vendored reverse test split (meaningful: the model learned the task);
- ``t5-small``: random weights with t5-small's shapes (d_model 512, 6+6 layers, 8 heads, d_ff 2048,
  vocab 32128) for speed only: every engine generates exactly ``--tokens`` tokens (min = max length).

Run: python benchmarks/seq2seq_ctranslate2.py --threads 2 --out benchmarks/results/seq2seq-ctranslate2
Needs: pip install 'xformopt[ctranslate2]'.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tiny_seq2seq: models built in code


def build(kind: str, root: Path, trained: Path | None = None) -> Path:
    from tiny_seq2seq import build_seq2seq

    if kind == "trained":
        return trained or build_seq2seq(root / "hf", "t5", train_steps=800)
    import transformers

    directory = build_seq2seq(root / "hf", "t5")  # the tokenizer; the model is replaced below
    config = transformers.T5Config(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=6,
                                   num_heads=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    transformers.T5ForConditionalGeneration(config).eval().save_pretrained(directory)
    return directory


def xformopt_int8(src: Path, root: Path) -> Path:
    """export -> fuse -> quantize (dynamic INT8) with the single-pass commands' library function."""
    from xformopt.pipeline import run_single

    previous = src
    for name in ("export", "fuse", "quantize"):
        out = root / name
        options = {"select": "all"} if name == "fuse" else {}
        run_single(name, str(previous), out, options, force=True)
        previous = out
    return previous


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="trained,t5-small")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--tokens", type=int, default=32, help="t5-small: tokens every engine generates")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--trained-dir", type=Path, help="a tiny T5 already trained (tests/tiny_seq2seq.py, 800 steps)")
    args = parser.parse_args()
    import ctranslate2
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from xformopt.measure.host import cpu_model, effective_cpu_flags, library_versions
    from xformopt.resources import word_seq2seq_path
    from xformopt.scoring.text_generation import bleu
    from xformopt.seq2seq.text import Text2TextModel

    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in word_seq2seq_path("reverse", "test").read_text().splitlines()]
    results = {"host": {"cpu": cpu_model(), "flags": sorted(f for f in effective_cpu_flags()
                                                           if f in ("avx2", "avx512f", "avx512_vnni", "amx_int8"))},
               "versions": {**library_versions(), "ctranslate2": ctranslate2.__version__},
               "threads": args.threads, "rounds": args.rounds, "models": {}}
    for kind in args.models.split(","):
        root = args.out / "work" / kind
        print(f"[{kind}] building, exporting, converting", file=sys.stderr)
        src = build(kind, root, args.trained_dir)
        artifact = xformopt_int8(src, root)
        ct2_dir = root / "ct2-int8"
        ctranslate2.converters.TransformersConverter(str(src)).convert(str(ct2_dir), quantization="int8", force=True)
        tokenizer = AutoTokenizer.from_pretrained(src)
        hf = AutoModelForSeq2SeqLM.from_pretrained(src).eval()
        ours = Text2TextModel(artifact, threads=args.threads)
        ct2 = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="int8", intra_threads=args.threads,
                                     inter_threads=1)
        fixed = kind != "trained"
        n = args.tokens if fixed else 24
        settings = ours.settings.with_(max_new_tokens=n, num_beams=1, **({"min_new_tokens": n} if fixed else {}))
        extra = {"min_new_tokens": n} if fixed else {}

        def run_torch(text):
            enc = tokenizer([text], return_tensors="pt")
            with torch.no_grad():
                out = hf.generate(**enc, max_new_tokens=n, num_beams=1, do_sample=False, **extra)[0, 1:].tolist()
            return out

        def run_ours(text):
            return ours.generate([text], settings)[0].ids

        def run_ct2(text):
            tokens = tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])
            out = ct2.translate_batch([tokens], beam_size=1, max_decoding_length=n,
                                      min_decoding_length=n if fixed else 0)[0].hypotheses[0]
            return tokenizer.convert_tokens_to_ids(out)

        engines = {"pytorch fp32": run_torch, "xformopt int8": run_ours, "ctranslate2 int8": run_ct2}
        texts = [r["source"] for r in rows]
        for fn in engines.values():  # warm-up
            for t in texts[:3]:
                fn(t)
        times = {k: [] for k in engines}
        counts = {k: [] for k in engines}
        order = list(engines)
        rng = random.Random(0)
        for r in range(args.rounds):
            rng.shuffle(order)
            for name in order:
                started = time.perf_counter()
                ids = engines[name](texts[r % len(texts)])
                times[name].append(time.perf_counter() - started)
                counts[name].append(len(ids))
        table = {}
        for name, fn in engines.items():
            entry = {"median_ms": float(np.median(times[name]) * 1e3),
                     "tokens_per_s": float(sum(counts[name]) / sum(times[name])),
                     "mean_tokens": float(np.mean(counts[name]))}
            if not fixed:
                hyps = [tokenizer.decode(fn(t), skip_special_tokens=True).strip() for t in texts]
                entry["bleu"] = bleu(hyps, [r["target"] for r in rows])["value"]
            table[name] = entry
        base = table["pytorch fp32"]["tokens_per_s"]
        for entry in table.values():
            entry["tokens_per_s_vs_pytorch"] = entry["tokens_per_s"] / base
        results["models"][kind] = table
        print(json.dumps({kind: table}, indent=1), file=sys.stderr)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = ["| model | engine | BLEU | median ms / sentence | tokens/s | x PyTorch |", "|---|---|---|---|---|---|"]
    for kind, table in results["models"].items():
        for name, e in table.items():
            lines.append(f"| {kind} | {name} | {e.get('bleu', float('nan')):.2f} | {e['median_ms']:.2f} | "
                         f"{e['tokens_per_s']:.0f} | {e['tokens_per_s_vs_pytorch']:.2f}x |")
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
