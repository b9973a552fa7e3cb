"""Where a sentence's time goes on a T5 INT8 artifact decoded as served (ONNX Runtime's BeamSearch op), beside
CTranslate2: microseconds per sentence, batch 1, one interleaved run (issue 55).

Per round, in a shuffled order over the same ``--per-round`` sources, each of:
- ``xformopt as served``: ``Text2TextModel.generate`` (tokenizing, the op's ``run``, reading its output, decoding);
- ``op run alone``: the same ``run`` of ``generate.onnx`` on feeds built beforehand;
- ``encoder graph alone``: ``encoder.onnx`` (the encoder and the first decoder step) on the same sources;
- ``tokenizer alone``: the tokenization ``generate`` makes (``Text2TextModel.encode``: the Rust backend's);
- ``ctranslate2 with tokenizer`` (as benchmarks/seq2seq_ctranslate2.py times it) and ``ctranslate2 alone``
  (``translate_batch`` on tokens split beforehand).
``xformopt as served`` less ``op run alone`` is the Python side of a call. Medians over rounds.

Run: OMP_WAIT_POLICY=PASSIVE python benchmarks/seq2seq_sentence_split.py --work WORK --model trained --threads 1 \
    --out benchmarks/results/seq2seq-sentence-split
(``WORK``: where benchmarks/seq2seq_ctranslate2.py builds its models; built there when absent.)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seq2seq_ctranslate2 import prepared  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="trained")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--beams", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--per-round", type=int, default=20)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import ctranslate2
    from transformers import AutoTokenizer

    from xformopt.measure.host import cpu_model, library_versions
    from xformopt.resources import word_seq2seq_path
    from xformopt.runtime.session import ort_session
    from xformopt.seq2seq.search_graph import search_feed
    from xformopt.seq2seq.text import Text2TextModel

    src, artifact, ct2_dir = prepared(args.model, args.work)
    texts = [json.loads(line)["source"] for line in word_seq2seq_path("reverse", "test").read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(src)
    model = Text2TextModel(artifact, threads=args.threads, search_graph=True)
    settings = model.settings.with_(max_new_tokens=args.tokens, num_beams=args.beams, length_penalty=1.0,
                                    early_stopping=False, min_new_tokens=0)
    search = model.runner.search
    if search is None or search.unfit(settings) is not None:
        raise SystemExit(f"{artifact} does not decode in the BeamSearch op with these settings")
    encoder = ort_session(artifact / "encoder.onnx", args.threads)
    ct2 = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="int8", intra_threads=args.threads,
                                 inter_threads=1)

    def encode(text):
        ids, mask = model.encode([text])
        return {"input_ids": ids, "attention_mask": mask}

    encoded = {t: encode(t) for t in texts}
    feeds = {t: search_feed(encoded[t]["input_ids"], encoded[t]["attention_mask"], settings) for t in texts}
    names = [i.name for i in encoder.get_inputs()]
    encoder_feeds = {t: {n: encoded[t][n].astype(np.int64) for n in names if n in encoded[t]} for t in texts}
    rust = tokenizer.backend_tokenizer  # CTranslate2's tokens from the Rust tokenizer, as generate's own encode
    pieces = {t: rust.encode(t).tokens for t in texts}
    ct2_options = dict(beam_size=args.beams, length_penalty=1.0, max_decoding_length=args.tokens, num_hypotheses=1,
                       return_end_token=True)
    parts = {
        "xformopt as served": lambda t: model.generate([t], settings),
        "op run alone": lambda t: search.session.run(None, feeds[t]),
        "encoder graph alone": lambda t: encoder.run(None, encoder_feeds[t]),
        "tokenizer alone": encode,
        "ctranslate2 with tokenizer": lambda t: ct2.translate_batch([rust.encode(t).tokens], **ct2_options),
        "ctranslate2 alone": lambda t: ct2.translate_batch([pieces[t]], **ct2_options),
    }
    tokens = sum(len(g.ids) for t in texts for g in model.generate([t], settings))
    for fn in parts.values():  # warm-up
        for t in texts[:5]:
            fn(t)
    per_sentence = {name: [] for name in parts}
    order, rng = list(parts), random.Random(0)
    for r in range(args.rounds):
        chunk = [texts[(r * args.per_round + i) % len(texts)] for i in range(args.per_round)]
        rng.shuffle(order)
        for name in order:
            started = time.perf_counter()
            for t in chunk:
                parts[name](t)
            per_sentence[name].append((time.perf_counter() - started) / len(chunk) * 1e6)
    medians = {name: float(np.median(v)) for name, v in per_sentence.items()}
    served, op = np.asarray(per_sentence["xformopt as served"]), np.asarray(per_sentence["op run alone"])
    result = {"model": args.model, "threads": args.threads, "beams": args.beams, "rounds": args.rounds,
              "per_round": args.per_round, "tokens_per_sentence": tokens / len(texts), "host": cpu_model(),
              "versions": {**library_versions(), "ctranslate2": ctranslate2.__version__},
              "us_per_sentence_median": medians,
              "python_side_us_median": float(np.median(served - op)),
              "speed_vs_ctranslate2_with_tokenizer": float(np.median(  # its time over ours per round
                  np.asarray(per_sentence["ctranslate2 with tokenizer"]) / served))}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.model}-{args.threads}t-{args.beams}b.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
