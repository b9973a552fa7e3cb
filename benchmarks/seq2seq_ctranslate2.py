"""xformopt's INT8 encoder-decoder artifact against CTranslate2's INT8: same model, same inputs, same threads,
same beam settings, one interleaved run.

Each cell (model x threads x beams, batch 1) is a run of rounds; in each round both engines translate the same
source in a shuffled order, and the round's ratio is xformopt's tokens/s over CTranslate2's. A cell reports the
median ratio and a bootstrap 95% interval of that median (rounds resampled). xformopt runs twice per round: as
served (``xformopt int8``: the artifact's ``generate.onnx``, ONNX Runtime's BeamSearch op, where the call allows;
the cell's ``decode_loop`` says which ran) and through the Python decode loop (``xformopt int8 python loop``), so a
cell also gives the Python loop over CTranslate2 and the BeamSearch graph over the Python loop. Beside the batch-1 cells, each
model and thread count also gets a batch-8 cell (eight sources in one call of each engine's batch API).

Three T5 models built in code (no checkpoint is reachable offline; CTranslate2 4.8's converter fails on
transformers 5's BART config and on our word-level Marian vocabulary, T5 converts):

- ``trained``: the tiny T5 of tests/tiny_seq2seq.py trained 800 steps on the reverse task; generation stops
  at EOS (outputs are 3-10 tokens), up to ``--tokens``;
- ``t5-small``: random weights, t5-small's shapes (d_model 512, 6 + 6 layers, 8 heads of 64, ReLU FFN 2048,
  vocab 32128, tied head);
- ``flan-t5-small``: random weights, flan-t5-small's shapes (6 heads of 64 in a 512 stream, gated-GELU FFN
  1024, 8 + 8 layers, untied head).

On the random models both engines generate exactly ``--tokens`` tokens (minimum = maximum length). Beam
settings on both: ``--beams`` beams, length penalty 1.0, no early stop (ours: ``early_stopping=False``;
CTranslate2 has no early stop), one hypothesis returned.

Run: python benchmarks/seq2seq_ctranslate2.py --out benchmarks/results/seq2seq-ctranslate2
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

MODELS = ("trained", "t5-small", "flan-t5-small")
GENERATE_FILE = "generate.onnx"  # xformopt.seq2seq.beam_search_graph's (not imported before the package root)
OURS = {"xformopt int8": True, "xformopt int8 python loop": False}  # name -> decode in the BeamSearch graph
T5_SMALL = dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8)


def build(kind: str, root: Path) -> Path:
    import torch
    import transformers
    from tiny_seq2seq import FLAN_T5_SMALL, build_seq2seq, make_config

    if kind == "trained":
        return build_seq2seq(root / "hf", "t5", train_steps=800)
    directory = build_seq2seq(root / "hf", "t5")  # the tokenizer; the model is replaced below
    if kind == "t5-small":
        config = transformers.T5Config(**T5_SMALL, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    else:
        config = make_config("t5", **FLAN_T5_SMALL)
        config.relative_attention_num_buckets = 32  # the checkpoint's (the tiny default is 8)
    torch.manual_seed(0)
    transformers.T5ForConditionalGeneration(config).eval().save_pretrained(directory)
    return directory


def xformopt_int8(src: Path, root: Path) -> Path:
    """export -> fuse -> quantize (dynamic INT8) with the single-pass commands' library function."""
    from xformopt.pipeline import run_single

    previous = src
    for name in ("export", "fuse", "quantize"):
        out = root / name
        if not (out / "manifest.json").is_file():
            run_single(name, str(previous), out, {"select": "all"} if name == "fuse" else {}, force=True)
        previous = out
    return previous


def prepared(kind: str, work: Path) -> tuple[Path, Path, Path]:
    """(the Hugging Face folder, xformopt's INT8 artifact, CTranslate2's INT8 folder), built once under ``work``."""
    import ctranslate2

    root = work / kind
    src = root / "hf" if (root / "hf" / "config.json").is_file() else build(kind, root)
    artifact = xformopt_int8(src, root)
    if not (artifact / GENERATE_FILE).is_file():  # an artifact built before quantize wrote the search graph
        from transformers import AutoTokenizer

        from xformopt.seq2seq.search_graph import write_search_graph

        print(write_search_graph(artifact, ["w1 w2 w3", "w4 w5 w6 w7"], AutoTokenizer.from_pretrained(artifact), None),
              file=sys.stderr)
    ct2_dir = root / "ct2-int8"
    if not (ct2_dir / "model.bin").is_file():
        ctranslate2.converters.TransformersConverter(str(src)).convert(str(ct2_dir), quantization="int8", force=True)
    return src, artifact, ct2_dir


def engines(src: Path, artifact: Path, ct2_dir: Path, threads: int, beams: int, tokens: int, fixed: bool):
    """Two callables, list of sources -> list of generated token counts (EOS counted where reached)."""
    import ctranslate2
    from transformers import AutoTokenizer

    from xformopt.seq2seq.generate import decode_loop
    from xformopt.seq2seq.text import Text2TextModel

    tokenizer = AutoTokenizer.from_pretrained(src)
    models = {name: Text2TextModel(artifact, threads=threads, search_graph=graph) for name, graph in OURS.items()}
    settings = models["xformopt int8"].settings.with_(max_new_tokens=tokens, num_beams=beams, length_penalty=1.0,
                                                      early_stopping=False, min_new_tokens=tokens if fixed else 0)
    ct2 = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="int8", intra_threads=threads, inter_threads=1)

    def ours(model):
        return lambda texts: [len(g.ids) for g in model.generate(texts, settings)]

    rust = tokenizer.backend_tokenizer  # the Rust tokenizer, as xformopt's own encode calls it (not transformers' wrapper)

    def run_ct2(texts):
        batch = [encoding.tokens for encoding in rust.encode_batch(texts)]
        out = ct2.translate_batch(batch, beam_size=beams, length_penalty=1.0, max_decoding_length=tokens,
                                  min_decoding_length=tokens if fixed else 0, num_hypotheses=1, return_end_token=True)
        return [len(r.hypotheses[0]) for r in out]

    def loop(batch: int) -> str:  # which loop "xformopt int8" runs at this batch
        return decode_loop(models["xformopt int8"].runner, settings, batch)

    return {**{name: ours(model) for name, model in models.items()}, "ctranslate2 int8": run_ct2}, loop


def bootstrap_median(values: np.ndarray, reps: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    medians = np.median(values[rng.integers(0, len(values), (reps, len(values)))], axis=1)
    return float(np.quantile(medians, 0.025)), float(np.quantile(medians, 0.975))


def cell(fns: dict, texts: list[str], rounds: int, batch: int, seed: int) -> dict:
    """Interleaved rounds; per round each engine's tokens/s on the same sources, and their ratio."""
    for fn in fns.values():  # warm-up
        fn(texts[:batch])
    rates = {name: [] for name in fns}
    order, rng = list(fns), random.Random(seed)
    for r in range(rounds):
        chunk = [texts[(r * batch + i) % len(texts)] for i in range(batch)]
        rng.shuffle(order)
        for name in order:
            started = time.perf_counter()
            count = sum(fns[name](chunk))
            rates[name].append(count / (time.perf_counter() - started))
    out = {"rounds": rounds, "batch": batch}
    # per round: ours (the BeamSearch graph where it runs) over CTranslate2, the Python loop over CTranslate2,
    # and ours over the Python loop
    pairs = {"": ("xformopt int8", "ctranslate2 int8"), "python_": ("xformopt int8 python loop", "ctranslate2 int8"),
             "graph_over_python_": ("xformopt int8", "xformopt int8 python loop")}
    for prefix, (num, den) in pairs.items():
        ratio = np.asarray(rates[num]) / np.asarray(rates[den])
        out[f"{prefix}ratio_median"], out[f"{prefix}ratio_ci95"] = float(np.median(ratio)), list(bootstrap_median(ratio))
    return {**out, **{f"{name} tokens/s median": float(np.median(v)) for name, v in rates.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batch8-rounds", type=int, default=5, help="rounds of the batch-8 cell (0: none)")
    parser.add_argument("--tokens", type=int, default=48, help="new tokens (random models: exactly this many)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, help="where models and artifacts are built (reused); default OUT/work")
    args = parser.parse_args()
    import ctranslate2

    from xformopt.measure.host import cpu_model, effective_cpu_flags, library_versions
    from xformopt.resources import word_seq2seq_path

    args.out.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in word_seq2seq_path("reverse", "test").read_text().splitlines()]
    texts = [r["source"] for r in rows]
    results = {"host": {"cpu": cpu_model(), "flags": sorted(f for f in effective_cpu_flags()
                                                           if f in ("avx2", "avx512f", "avx512_vnni", "amx_int8"))},
               "versions": {**library_versions(), "ctranslate2": ctranslate2.__version__},
               "tokens": args.tokens, "cells": []}
    for kind in args.models.split(","):
        src, artifact, ct2_dir = prepared(kind, args.work or args.out / "work")
        for threads in (int(t) for t in args.threads.split(",")):
            for beams in (int(b) for b in args.beams.split(",")):
                fns, loop = engines(src, artifact, ct2_dir, threads, beams, args.tokens, fixed=kind != "trained")
                for batch, rounds in ((1, args.rounds), (8, args.batch8_rounds)):
                    if rounds:
                        row = {"model": kind, "threads": threads, "beams": beams, "decode_loop": loop(batch),
                               **cell(fns, texts, rounds, batch, seed=threads * 10 + beams)}
                        results["cells"].append(row)
                        print(json.dumps(row), file=sys.stderr, flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = ["| model | threads | beams | batch | xformopt loop | xformopt tokens/s | Python loop tokens/s | CTranslate2 "
             "tokens/s | xformopt / CT2 (95% CI) | Python loop / CT2 (95% CI) | xformopt / Python loop (95% CI) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]

    def ratio(c, prefix):
        low, high = c[f"{prefix}ratio_ci95"]
        return f"{c[f'{prefix}ratio_median']:.2f} ({low:.2f}-{high:.2f})"

    for c in results["cells"]:
        lines.append(f"| {c['model']} | {c['threads']} | {c['beams']} | {c['batch']} | {c['decode_loop']} | "
                     f"{c['xformopt int8 tokens/s median']:.0f} | {c['xformopt int8 python loop tokens/s median']:.0f} | "
                     f"{c['ctranslate2 int8 tokens/s median']:.0f} | {ratio(c, '')} | {ratio(c, 'python_')} | "
                     f"{ratio(c, 'graph_over_python_')} |")
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
