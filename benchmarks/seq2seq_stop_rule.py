"""Which beam-search stop rule CTranslate2 follows, and what the rule costs ONNX Runtime's BeamSearch op (issue 55).

CTranslate2 documents its rule as "the decoding will continue until beam_size * patience hypotheses are finished"
(patience 1 by default): transformers' ``early_stopping=True``. xformopt's ``generate.onnx`` is built with the op's
``early_stopping=0`` (transformers' ``False`` heuristic, which decodes on while an open beam could still win). This
script copies the artifact's ``generate.onnx`` with ``early_stopping=1`` and, on the held-out sources, 4 beams,
1 thread:
- counts the rows where each op's tokens, CTranslate2's, and the Python loop's under each rule agree;
- times each op's ``run`` and CTranslate2's ``translate_batch`` (Rust-tokenized sources), interleaved.

Run: OMP_WAIT_POLICY=PASSIVE python benchmarks/seq2seq_stop_rule.py --work WORK --json OUT.json
(``WORK``: where benchmarks/seq2seq_ctranslate2.py built its ``trained`` model.)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import xformopt  # noqa: F401  (ORT telemetry off before onnxruntime loads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    import ctranslate2
    import onnx
    from transformers import AutoTokenizer

    from xformopt.measure.host import cpu_model, library_versions
    from xformopt.resources import word_seq2seq_path
    from xformopt.seq2seq.beam_search_graph import GENERATE_FILE
    from xformopt.seq2seq.search_graph import OrtSearchGraph, search_feed
    from xformopt.seq2seq.text import Text2TextModel

    root = args.work / "trained"
    artifact = root / "quantize"
    model = onnx.load(artifact / GENERATE_FILE)
    next(a for a in model.graph.node[0].attribute if a.name == "early_stopping").i = 1
    early = Path(tempfile.mkdtemp(prefix="stop-rule-")) / GENERATE_FILE
    onnx.save(model, early)

    texts = [json.loads(line)["source"] for line in word_seq2seq_path("reverse", "test").read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(root / "hf")
    rust = tokenizer.backend_tokenizer
    ops = {f"op early_stopping={i}": OrtSearchGraph(path, threads=1)
           for i, path in enumerate((artifact / GENERATE_FILE, early))}
    ct2 = ctranslate2.Translator(str(root / "ct2-int8"), device="cpu", compute_type="int8", intra_threads=1,
                                 inter_threads=1)
    loop = Text2TextModel(artifact, threads=1, search_graph=False)
    settings = loop.settings.with_(num_beams=args.beams, max_new_tokens=args.tokens, length_penalty=1.0,
                                   early_stopping=False)
    encoded = [tokenizer([t], return_tensors="np") for t in texts]
    feeds = [search_feed(e["input_ids"], e["attention_mask"], settings) for e in encoded]
    ct2_options = dict(beam_size=args.beams, length_penalty=1.0, max_decoding_length=args.tokens, num_hypotheses=1)
    eos = tokenizer.eos_token_id
    tokens = {name: [[i for i in op.generate(e["input_ids"], e["attention_mask"], settings)[0] if i != eos]
                     for e in encoded] for name, op in ops.items()}
    tokens["ctranslate2"] = [tokenizer.convert_tokens_to_ids(r.hypotheses[0])
                             for r in ct2.translate_batch([rust.encode(t).tokens for t in texts], **ct2_options)]
    for rule in (False, True):
        tokens[f"python loop early_stopping={rule}"] = [[i for i in g.ids if i != eos] for t in texts
                                                         for g in loop.generate([t], settings.with_(early_stopping=rule))]
    names = list(tokens)
    agree = {f"{a} = {b}": sum(x == y for x, y in zip(tokens[a], tokens[b], strict=True))
             for i, a in enumerate(names) for b in names[i + 1:]}

    def run_ct2():
        for text in texts:
            ct2.translate_batch([rust.encode(text).tokens], **ct2_options)

    runs = {**{name: (lambda s: lambda: [s.run(None, f) for f in feeds])(op.session) for name, op in ops.items()},
            "ctranslate2 with tokenizer": run_ct2}
    for run in runs.values():
        run()
    us = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            us[name].append((time.perf_counter() - started) / len(texts) * 1e6)
    result = {"host": cpu_model(), "versions": {**library_versions(), "ctranslate2": ctranslate2.__version__},
              "beams": args.beams, "sources": len(texts), "rounds": args.rounds, "rows_agreeing": agree,
              "us_per_sentence_median": {name: float(np.median(v)) for name, v in us.items()}}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    print(json.dumps(result["us_per_sentence_median"]), file=sys.stderr)


if __name__ == "__main__":
    main()
