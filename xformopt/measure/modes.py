"""The three latency modes, built on the interleaved harness.

- ``real``: batch 1 over the held-out texts at their true lengths, tokenization included: the
  number a user of the model feels.
- ``model_call``: ``real`` with tokenization done beforehand: the model call alone.
- ``fixed``: a batch x sequence-length grid of exact shapes (no padding), for capacity planning
  and the latency-vs-length plot.
- ``throughput``: length-bucketed batches over the whole held-out set at several batch sizes; the
  best sustained samples/s and the batch size that reached it.

``solo_repeats`` times one model alone, in several repeats, so a regression gate can compare
medians against a tolerance derived from their spread.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from time import perf_counter

import numpy as np

from xformopt.measure.latency import LatencyStats, run_interleaved, summarize

Progress = Callable[[int, int], None] | None


def real(predictors: Mapping, texts: Sequence[str], pairs, *, rounds: int, warmup: int, seed: int = 0,
         progress: Progress = None) -> dict[str, LatencyStats]:
    calls = {
        name: (lambda i, p=p: p([texts[i]], [pairs[i]] if pairs else None)) for name, p in predictors.items()
    }
    return run_interleaved(calls, len(texts), warmup=warmup, iterations=rounds, seed=seed, progress=progress)


def model_call(predictors: Mapping, texts: Sequence[str], pairs, *, rounds: int, warmup: int, seed: int = 0,
                progress: Progress = None) -> dict[str, LatencyStats]:
    """``real`` without tokenization: every text is tokenized once per predictor beforehand and only the
    model call is timed, as benchmarks that quote "model call only" figures time it."""
    encoded = {name: [p.tokenize([texts[i]], [pairs[i]] if pairs else None) for i in range(len(texts))]
               for name, p in predictors.items()}
    calls = {name: (lambda i, p=p, e=encoded[name]: p.run_encoded(e[i])) for name, p in predictors.items()}
    return run_interleaved(calls, len(texts), warmup=warmup, iterations=rounds, seed=seed, progress=progress)


def solo_repeats(predictor, texts: Sequence[str], pairs, *, rounds: int, warmup: int, repeats: int,
                 seed: int = 0, progress: Progress = None) -> dict:
    """``repeats`` back-to-back runs of ``rounds`` batch-1 calls; pooled stats plus each repeat's median.

    ``progress(calls done, repeats x rounds)`` counts over all repeats, not per repeat."""
    samples: list[LatencyStats] = []
    medians = []
    for r in range(repeats):
        step = (lambda done, _total, r=r: progress(r * rounds + done, repeats * rounds)) if progress else None
        stats = real({"m": predictor}, texts, pairs, rounds=rounds, warmup=warmup if r == 0 else 0, seed=seed + r,
                     progress=step)["m"]
        samples.append(stats)
        medians.append(stats.median_ms)
    fields = ("median_ms", "p90_ms", "p99_ms", "mean_ms", "std_ms", "min_ms", "throughput_per_s")
    pooled = {k: float(np.median([getattr(s, k) for s in samples])) for k in fields}
    return {
        **pooled,
        "n": sum(s.n for s in samples),
        "repeats": repeats,
        "repeat_medians_ms": medians,
        # Half the range of repeat medians: what two honest measurements of one build may differ by.
        "spread_ms": (max(medians) - min(medians)) / 2 if len(medians) > 1 else 0.0,
    }


def exact_length_inputs(tokenizer, texts: Sequence[str], batch: int, seq: int) -> dict[str, np.ndarray]:
    """A batch of real token ids cut or tiled to exactly ``seq`` tokens, with no padding."""
    # the single-sequence special tokens ([CLS] x [SEP], <s> x </s>) by hand: transformers 5's tokenizers no
    # longer have build_inputs_with_special_tokens
    first = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    last = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    ids = []
    for i in range(batch):
        row = tokenizer(texts[i % len(texts)], add_special_tokens=False)["input_ids"] or [tokenizer.unk_token_id]
        body = (row * (seq // len(row) + 1))[: max(seq - 2, 1)]
        ids.append((([first] if first is not None else []) + body + ([last] if last is not None else []))[:seq])
    input_ids = np.array(ids, dtype=np.int64)
    encoded = {"input_ids": input_ids, "attention_mask": np.ones_like(input_ids), "token_type_ids": np.zeros_like(input_ids)}
    return {k: v for k, v in encoded.items() if k in tokenizer.model_input_names}


def fixed(predictors: Mapping, texts: Sequence[str], batches: Sequence[int], seqs: Sequence[int], *,
          rounds: int, warmup: int, seed: int = 0, progress: Progress = None) -> list[dict]:
    """Latency per (batch, seq) cell, all models interleaved within each cell."""
    tokenizer = next(iter(predictors.values())).tokenizer
    rows = []
    cells = [(b, s) for b in batches for s in seqs]
    for done, (batch, seq) in enumerate(cells):
        encoded = exact_length_inputs(tokenizer, texts, batch, seq)
        calls = {name: (lambda i, p=p: p.run_encoded(encoded)) for name, p in predictors.items()}
        stats = run_interleaved(calls, 1, warmup=warmup, iterations=rounds, seed=seed, items_per_call=batch)
        for name, st in stats.items():
            rows.append({"stage": name, "batch": batch, "seq": seq, **st.to_dict()})
        if progress:
            progress(done + 1, len(cells))
    return rows


def throughput(predictors: Mapping, texts: Sequence[str], pairs, batch_sizes: Sequence[int], *,
               passes: int = 2, seed: int = 0, progress: Progress = None) -> dict[str, dict]:
    """Samples/s over the held-out set with length-bucketed batches (sorted by length: little padding).

    For each batch size, every model runs full passes over the set in a shuffled order per pass, so
    drift hits all alike; the best pass counts (sustained, not a cold start).
    """
    rng = random.Random(seed)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    rates: dict[str, dict[int, float]] = {name: {} for name in predictors}
    for k, size in enumerate(batch_sizes):
        batches = [order[i : i + size] for i in range(0, len(order), size)]
        for name, predictor in predictors.items():  # warm each model at this batch size
            predictor([texts[i] for i in batches[-1]], [pairs[i] for i in batches[-1]] if pairs else None)
        for p in range(passes):
            names = list(predictors)
            rng.shuffle(names)
            for name in names:
                start = perf_counter()
                for idx in batches:
                    predictors[name]([texts[i] for i in idx], [pairs[i] for i in idx] if pairs else None)
                rates[name][size] = max(rates[name].get(size, 0.0), len(order) / (perf_counter() - start))
            if progress:
                progress(k * passes + p + 1, len(batch_sizes) * passes)
    return {
        name: {"samples_per_s": max(by.values()), "best_batch": max(by, key=by.get), "by_batch": by}
        for name, by in rates.items()
    }


__all__ = ["real", "model_call", "solo_repeats", "fixed", "throughput", "exact_length_inputs", "summarize"]
