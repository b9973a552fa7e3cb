"""A sentence's fixed cost and the cost of each decoder step, inside ONNX Runtime's BeamSearch op and in CTranslate2
(issue 55): every engine is made to decode exactly N tokens (``min_length = max_length``, CTranslate2's
``min_decoding_length = max_decoding_length``) for N in ``--steps``, batch 1, one thread; a line fitted to the
median microseconds per sentence against N gives the fixed cost (encoder, first step, the call) and the per-step cost.
Engines and N interleaved per round.

Run: OMP_WAIT_POLICY=PASSIVE python benchmarks/seq2seq_step_costs.py --src HF --ct2 CT2_DIR \
    --graph before=OLD/generate.onnx --graph after=NEW/generate.onnx --out benchmarks/results/seq2seq-encoder-slim
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, required=True, help="the Hugging Face folder (tokenizer)")
    parser.add_argument("--ct2", type=Path, required=True, help="CTranslate2's INT8 folder")
    parser.add_argument("--graph", action="append", required=True, help="NAME=PATH of a generate.onnx")
    parser.add_argument("--steps", default="2,4,8,16,32")
    parser.add_argument("--beams", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--sources", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import ctranslate2
    import onnxruntime as ort
    from transformers import AutoTokenizer

    from xformopt.measure.host import cpu_model, library_versions
    from xformopt.resources import word_seq2seq_path
    from xformopt.seq2seq.generate import GenerationSettings
    from xformopt.seq2seq.search_graph import search_feed

    texts = [json.loads(line)["source"] for line in word_seq2seq_path("reverse", "test").read_text().splitlines()]
    texts = texts[:args.sources]
    tokenizer = AutoTokenizer.from_pretrained(args.src)
    steps = [int(n) for n in args.steps.split(",")]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    graphs = {name: ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
              for name, path in (g.split("=", 1) for g in args.graph)}
    ct2 = ctranslate2.Translator(str(args.ct2), device="cpu", compute_type="int8", intra_threads=1, inter_threads=1)
    pieces = [tokenizer.convert_ids_to_tokens(tokenizer(t)["input_ids"]) for t in texts]

    settings = GenerationSettings.from_model_dir(args.src).with_(num_beams=args.beams, length_penalty=1.0,
                                                                 early_stopping=False)

    def feed(text: str, n: int) -> dict:  # exactly n new tokens
        enc = tokenizer([text], return_tensors="np")
        return search_feed(enc["input_ids"], enc["attention_mask"], settings.with_(max_new_tokens=n, min_new_tokens=n))

    feeds = {n: [feed(t, n) for t in texts] for n in steps}
    runs = {name: (lambda s: lambda n: [s.run(None, f) for f in feeds[n]])(s) for name, s in graphs.items()}
    runs["ctranslate2"] = lambda n: ct2.translate_batch(
        pieces, max_batch_size=1, beam_size=args.beams, length_penalty=1.0, max_decoding_length=n,
        min_decoding_length=n, num_hypotheses=1)
    for run in runs.values():  # warm-up
        run(steps[0])
    us = {name: {n: [] for n in steps} for name in runs}
    for _ in range(args.rounds):
        for n in steps:
            for name, run in runs.items():
                started = time.perf_counter()
                run(n)
                us[name][n].append((time.perf_counter() - started) / len(texts) * 1e6)
    result = {"host": cpu_model(), "versions": {**library_versions(), "ctranslate2": ctranslate2.__version__},
              "beams": args.beams, "threads": 1, "rounds": args.rounds, "sources": len(texts), "engines": {}}
    for name, by_n in us.items():
        medians = [float(np.median(by_n[n])) for n in steps]
        per_step, fixed = np.polyfit(steps, medians, 1)
        result["engines"][name] = {"us_per_sentence_by_steps": dict(zip(map(str, steps), medians, strict=True)),
                                   "fixed_us": float(fixed), "per_step_us": float(per_step)}
        print(f"{name:20s} fixed {fixed:6.1f} us  per step {per_step:5.1f} us", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"step-costs-{args.beams}b.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
