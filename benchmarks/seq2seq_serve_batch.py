"""Batch 8 through ``xformopt serve`` beside CTranslate2's batch API: eight clients send one source each at
once to the server (``--max-batch 8``, so the server batches them), against CTranslate2 translating the same
eight sources in one ``translate_batch`` call; interleaved rounds, tokens/s from the tokens each returned.

The server is the real command (a subprocess on a free local port, 127.0.0.1), talked to with httpx.
Generation stops at EOS or ``--tokens`` (requests take no minimum length), the same on both engines; ``--beams``
sets the beam width on both (length penalty 1.0; CTranslate2 has no early stop, the served model's generation
config has ``early_stopping=False``: the same stop rule).

Run: OMP_WAIT_POLICY=PASSIVE python benchmarks/seq2seq_serve_batch.py --work WORK --out benchmarks/results/seq2seq-serve-batch
(``WORK``: where benchmarks/seq2seq_ctranslate2.py built its models).
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seq2seq_ctranslate2 import bootstrap_median, prepared  # noqa: E402

BATCH = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(artifact: Path, threads: int) -> tuple[subprocess.Popen, str]:
    import httpx

    port = free_port()
    proc = subprocess.Popen(["xformopt", "serve", str(artifact), "--port", str(port), "--max-batch", str(BATCH),
                             "--max-wait-ms", "20", "--threads", str(threads), "--cache-size", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise RuntimeError("the server did not become healthy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="t5-small")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--beams", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import ctranslate2
    import httpx
    from transformers import AutoTokenizer

    from xformopt.resources import word_seq2seq_path

    src, artifact, ct2_dir = prepared(args.model, args.work)
    tokenizer = AutoTokenizer.from_pretrained(src)
    texts = [json.loads(line)["source"] for line in word_seq2seq_path("reverse", "test").read_text().splitlines()]
    ct2 = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="int8", intra_threads=args.threads,
                                 inter_threads=1)
    proc, url = serve(artifact, args.threads)
    pool = ThreadPoolExecutor(BATCH)
    client = httpx.Client(timeout=600)

    def one(text):
        body = client.post(f"{url}/v1/completions", json={"prompt": text, "max_tokens": args.tokens,
                                                                "num_beams": args.beams, "length_penalty": 1.0}).json()
        return body["usage"]["completion_tokens"]

    def run_serve(chunk):
        return sum(pool.map(one, chunk))

    def run_ct2(chunk):
        batch = [tokenizer.convert_ids_to_tokens(tokenizer(t)["input_ids"]) for t in chunk]
        out = ct2.translate_batch(batch, beam_size=args.beams, length_penalty=1.0,
                                  max_decoding_length=args.tokens, return_end_token=True)
        return sum(len(r.hypotheses[0]) for r in out)

    fns = {"xformopt serve": run_serve, "ctranslate2 batch": run_ct2}
    try:
        rates = {name: [] for name in fns}
        order, rng = list(fns), random.Random(0)
        for fn in fns.values():
            fn(texts[:BATCH])
        for r in range(args.rounds):
            chunk = [texts[(r * BATCH + i) % len(texts)] for i in range(BATCH)]
            rng.shuffle(order)
            for name in order:
                started = time.perf_counter()
                count = fns[name](chunk)
                rates[name].append(count / (time.perf_counter() - started))
    finally:
        proc.terminate()
        proc.wait(30)
    ratio = np.asarray(rates["xformopt serve"]) / np.asarray(rates["ctranslate2 batch"])
    row = {"model": args.model, "threads": args.threads, "batch": BATCH, "rounds": args.rounds, "beams": args.beams,
           **{f"{k} tokens/s median": float(np.median(v)) for k, v in rates.items()},
           "ratio_median": float(np.median(ratio)), "ratio_ci95": list(bootstrap_median(ratio))}
    args.out.mkdir(parents=True, exist_ok=True)
    name = "results.json" if args.beams == 1 and args.threads == 2 else f"results-{args.threads}t-{args.beams}b.json"
    (args.out / name).write_text(json.dumps(row, indent=1) + "\n")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
