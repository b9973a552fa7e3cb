"""Batching defaults measured on the host at start-up: the artifact's own session is timed at a few
batch sizes and ``max_batch`` / ``max_wait_ms`` follow from those timings (unless the flags set them).

The rule (its reasons in README, "Serving"):

- ``max_batch``: among the batch sizes whose session call takes at most ``CALL_BUDGET_MS`` (a
  request that arrives while a batch runs waits for it and then for its own, so two calls must fit
  inside a p99 target of tens of milliseconds), the smallest one that reaches ``NEAR_BEST`` of the
  best rows/s measured. Past it, larger batches add latency for little throughput.
- ``max_wait_ms``: one batch-1 call. Under load, batches fill while the previous one runs, without
  waiting; at light load, waiting longer than a lone request's own service time would more than
  double its latency for a batch mate that is unlikely to come.

Rows are a mid-length text of ``PROBE_TOKENS`` tokens (or the model's limit), each size timed
``REPEATS`` times after ``WARM_CALLS`` untimed ones (a new shape allocates), the fastest kept: on a
shared host, other processes only ever add time, so the minimum is the estimate of what the session
costs (a median let one busy moment pick a batch of 2).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
CALL_BUDGET_MS = 20.0
NEAR_BEST = 0.9
PROBE_TOKENS = 32
REPEATS = 7
WARM_CALLS = 2
WAIT_BOUNDS_MS = (0.5, 5.0)
PROBE_TEXT = ("a quiet, patient film about two brothers who run a small bakery, with warm performances, "
              "a few slow stretches and an ending that earns its tears; worth seeing on a big screen")


@dataclass
class Choice:
    max_batch: int
    max_wait_ms: float
    call_ms: dict[int, float] = field(default_factory=dict)  # batch size -> median session call (ms)
    probe_tokens: int = 0
    source: dict[str, str] = field(default_factory=dict)  # setting -> "measured" | "flag"

    def public(self) -> dict:
        return {"max_batch": self.max_batch, "max_wait_ms": self.max_wait_ms, "source": self.source,
                "probe_tokens": self.probe_tokens,
                "session_call_ms": {str(b): round(t, 3) for b, t in self.call_ms.items()},
                "rows_per_s": {str(b): round(b / t * 1000, 1) for b, t in self.call_ms.items() if t > 0},
                "rule": f"max_batch: smallest size within {NEAR_BEST:g} of the best rows/s among calls <= "
                        f"{CALL_BUDGET_MS:g} ms; max_wait_ms: one batch-1 call, within {WAIT_BOUNDS_MS}"}


def probe_row(predictor, sample=None):
    """One row of about PROBE_TOKENS tokens, as the model sees it (a QA model gets a question too)."""
    words = PROBE_TEXT.split()
    text = " ".join(words * 4)
    item = sample if sample is not None else text
    row = predictor.prepare([item])[0].rows[0]
    keep = min(PROBE_TOKENS, row.length)
    features = {k: (v[:keep - 1] + v[-1:]) if keep < len(v) else list(v) for k, v in row.features.items()}
    return type(row)(features)


def time_sizes(run_rows, row, sizes=SIZES, budget_ms: float = CALL_BUDGET_MS, repeats: int = REPEATS) -> dict:
    """Fastest ms of one session call per batch size; stops after the first size twice over budget."""
    out: dict[int, float] = {}
    for size in sizes:
        rows = [row] * size
        for _ in range(WARM_CALLS):
            run_rows(rows)
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            run_rows(rows)
            samples.append((time.perf_counter() - started) * 1000)
        out[size] = min(samples)
        if out[size] > 2 * budget_ms:
            break
    return out


def choose(call_ms: dict[int, float], budget_ms: float = CALL_BUDGET_MS) -> tuple[int, float]:
    """(max_batch, max_wait_ms) from the timings, by the rule in the module docstring."""
    eligible = {b: t for b, t in call_ms.items() if t <= budget_ms} or {min(call_ms): call_ms[min(call_ms)]}
    rate = {b: b / t for b, t in eligible.items()}
    best = max(rate.values())
    max_batch = min(b for b, r in rate.items() if r >= NEAR_BEST * best)
    low, high = WAIT_BOUNDS_MS
    return max_batch, round(min(max(call_ms[min(call_ms)], low), high), 2)


def tune(predictor, max_batch: int | None, max_wait_ms: float | None, sample=None) -> Choice:
    """The settings to serve with: each one the flag gave, or measured here."""
    source = {"max_batch": "flag" if max_batch is not None else "measured",
              "max_wait_ms": "flag" if max_wait_ms is not None else "measured"}
    if max_batch is not None and max_wait_ms is not None:
        return Choice(max_batch, max_wait_ms, source=source)
    row = probe_row(predictor, sample)
    sizes = tuple(s for s in SIZES if max_batch is None or s <= max(max_batch, 1)) or (1,)
    call_ms = time_sizes(predictor.run_rows, row, sizes)
    measured_batch, measured_wait = choose(call_ms)
    return Choice(max_batch if max_batch is not None else measured_batch,
                  max_wait_ms if max_wait_ms is not None else measured_wait, call_ms, row.length, source)
