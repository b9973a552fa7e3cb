"""What the passes and the evaluation measure on a seq2seq runner: generated texts over many rows,
next-token agreement with a reference (teacher-forced), and per-step cost against the cache length."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from xformopt.seq2seq.generate import GenerationSettings, generate


def encode(tokenizer, texts: Sequence[str]) -> dict[str, np.ndarray]:
    enc = tokenizer(list(texts), padding=True, truncation=True, return_tensors="np")
    return {"input_ids": enc["input_ids"].astype(np.int64), "attention_mask": enc["attention_mask"].astype(np.int64)}


def generate_rows(runner, tokenizer, texts: Sequence[str], settings: GenerationSettings,
                  batch_size: int = 16) -> list[list[int]]:
    """Generated ids per text, batched (sorted by length so a batch pads little; rows back in order)."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out: dict[int, list[int]] = {}
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        enc = encode(tokenizer, [texts[i] for i in chunk])
        for i, row in zip(chunk, generate(runner, enc["input_ids"], enc["attention_mask"], settings)):
            out[i] = row
    return [out[i] for i in range(len(texts))]


def decode(tokenizer, rows: list[list[int]]) -> list[str]:
    return [t.strip() for t in tokenizer.batch_decode(rows, skip_special_tokens=True)]


def sentence_call(runner, tokenizer, texts: Sequence[str], settings: GenerationSettings):
    """``call(i)``: text ``i`` end to end at batch 1, as a request is served: tokenize, generate, decode.
    What the report and ``xformopt bench`` time per sentence, so the two compare like with like."""

    def call(i: int) -> list[str]:
        enc = encode(tokenizer, [texts[i]])
        return decode(tokenizer, generate(runner, enc["input_ids"], enc["attention_mask"], settings))

    return call


def padded(rows: list[list[int]], width: int | None = None) -> np.ndarray:
    """Token rows as one int64 array padded with -1 (what a stage's outputs are saved as)."""
    width = width or max([len(r) for r in rows] + [1])
    out = np.full((len(rows), width), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r[:width]
    return out


def forced_agreement(runner, tokenizer, texts: Sequence[str], reference_rows: list[list[int]]) -> np.ndarray:
    """Per generated position: 1.0 where ``runner``'s arg-max, fed the reference's tokens so far (teacher
    forcing, one text at a time), is the reference's next token. Every position of every text, concatenated."""
    hits = []
    for text, row in zip(texts, reference_rows):
        if not row:
            continue
        enc = encode(tokenizer, [text])
        logits, cache = runner.start(enc["input_ids"], enc["attention_mask"])
        for j, token in enumerate(row):
            hits.append(float(int(logits[0].argmax()) == token))
            if j + 1 < len(row):
                logits, cache = runner.step(np.asarray([[token]], dtype=np.int64), cache)
    return np.asarray(hits, dtype=np.float64)


def step_cost_by_length(runner, tokenizer, text: str, lengths: Sequence[int], repeats: int = 20) -> dict:
    """Median milliseconds of one cached decoder step after ``n`` earlier steps, per ``n`` in
    ``lengths``: with a cache, the cost grows only by attention's share over a longer past (a model
    re-run over the whole prefix would grow with every weight multiplication too)."""
    enc = encode(tokenizer, [text])
    token = np.asarray([[3]], dtype=np.int64)  # any token: the cost depends on shapes, not ids
    _, cache = runner.start(enc["input_ids"], enc["attention_mask"])
    medians = {}
    done = 0
    for n in sorted(lengths):
        while done < n:
            _, cache = runner.step(token, cache)
            done += 1
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            runner.step(token, cache)
            samples.append(time.perf_counter() - started)
        medians[int(n)] = float(np.median(samples) * 1e3)
    return medians
