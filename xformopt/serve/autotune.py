"""Batching defaults measured on the host at start-up: the artifact's own session is timed at a few
batch sizes and ``max_batch`` / ``max_wait_ms`` follow from those timings (unless the flags set them).

The rule (its reasons in docs/serving.md):

- ``max_batch``: among the batch sizes whose session call takes at most ``CALL_BUDGET_MS`` (a
  request that arrives while a batch runs waits for it and then for its own, so two calls must fit
  inside a p99 target of tens of milliseconds), the smallest one that reaches ``NEAR_BEST`` of the
  best rows/s measured, by a margin of ``MARGIN_SE`` standard errors of the measurement. Past it,
  larger batches add latency for little throughput. The margin keeps a near-tie from being decided
  by noise: on the 2-core test host MiniLM's batch 2 ran at 0.83-0.93 of batch 4's rows/s from one
  start to the next, across the 0.9 line; a size that close to the line counts as not reaching it, so
  starts agree on the larger size (whose call is within the budget all the same).
- ``max_wait_ms``: one batch-1 call. Under load, batches fill while the previous one runs, without
  waiting; at light load, waiting longer than a lone request's own service time would more than
  double its latency for a batch mate that is unlikely to come.

How it is measured, so that a busy second on a shared host cannot decide (a start-up that took the
fastest of 7 back-to-back calls per size chose batch 1 on a loaded host where batching paid):

- **Pairs.** A batch-1 call and a batch-n call back to back (which one first alternates), each timed
  in wall-clock and in the process's CPU time. The cost of n rows against one is the ratio of the
  pair's CPU times: a neighbour that takes the cores away makes a call wait, which adds wall time but
  not CPU time (on the 2-core test host at load 7-9, the 10-90 % range of a pair's ratio was 1.5-1.8 in
  CPU time and 1.2-3.3 in wall time). Where the CPU clock is too coarse to time a call, wall time.
- **Rounds.** Every size once per round, in a rotated order, ``ROUNDS`` short rounds: a busy moment
  spoils a pair or two out of many, and each size keeps the median ratio of its pairs.
- **The quiet batch-1 call**: the lowest median of ``BLOCK`` consecutive batch-1 wall timings (one
  quiet stretch sets it, one lucky call does not), and at most the median CPU time of a batch-1 call
  (on an idle host a call is not slower than the CPU it uses). Each size's call is that times its
  median ratio.
- **Disturbed pairs are dropped**: a pair whose batch-1 call took over ``DISTURBED`` x the quiet call,
  or over ``DISTURBED`` x the latency the artifact's report.json recorded on this kind of host
  (unless fewer than ``MIN_KEPT`` would be left: then all count, the CPU-time ratios hold). When the
  quiet call itself is that far over the recorded latency, the measurement is marked busy
  and the server measures again in the background (xformopt.serve.scheduler).

A :class:`Measurement` advances one pair per :meth:`~Measurement.step`, so the scheduler can run a
re-measurement between batches while it serves.
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
CALL_BUDGET_MS = 20.0
NEAR_BEST = 0.9
PROBE_TOKENS = 32
WARM_CALLS = 2
ROUNDS = 15  # rounds wanted (one pair per size each) ...
MIN_KEPT = 8  # ... with at least this many undisturbed pairs per size, else more rounds
MAX_ROUNDS = 24  # ... up to this many
PRUNE_AFTER = 3  # rounds before sizes clearly over budget stop being timed
BLOCK = 5  # batch-1 timings per block (min of block medians: the quiet call)
DISTURBED = 3.0  # a pair whose batch-1 call took over this x the quiet (or recorded) call is dropped
START_LIMIT_S = 10.0  # the start-up measurement stops here, whatever it has
MARGIN_SE = 2.0  # a size reaches NEAR_BEST only by this many standard errors of its rate ratio
BOOTSTRAP = 200  # resamples of the pairs for those standard errors (a fixed seed: the same data, the same choice)
WAIT_BOUNDS_MS = (0.5, 5.0)
PROBE_TEXT = ("a quiet, patient film about two brothers who run a small bakery, with warm performances, "
              "a few slow stretches and an ending that earns its tears; worth seeing on a big screen")


@dataclass
class Choice:
    max_batch: int
    max_wait_ms: float
    call_ms: dict[int, float] = field(default_factory=dict)  # batch size -> session call on a quiet host (ms)
    probe_tokens: int = 0
    source: dict[str, str] = field(default_factory=dict)  # setting -> "measured" | "flag"
    typical_ms: dict[int, float] = field(default_factory=dict)  # batch size -> median call as measured (ms)
    ratio: dict[int, float] = field(default_factory=dict)  # batch size -> median call / batch-1 call
    ratio_se: dict[int, float] = field(default_factory=dict)  # ... its standard error (bootstrap)
    pairs: int = 0
    dropped: int = 0
    reference_ms: float | None = None  # the artifact's recorded batch-1 latency on this kind of host
    busy: bool = False  # the quiet call was over DISTURBED x the recorded one
    reason: str = "start-up"
    measured_at: float = 0.0  # unix time
    seconds: float = 0.0
    load_average: tuple | None = None

    def rows_per_s(self, size: int | None = None) -> float:
        """Rows per second at ``size`` (default max_batch) as measured (typical, not quiet): 0 if unknown."""
        size = size or self.max_batch
        known = [b for b in self.typical_ms if b <= size] or list(self.typical_ms)
        if not known:
            return 0.0
        b = max(known)
        return b / self.typical_ms[b] * 1000 if self.typical_ms[b] > 0 else 0.0

    def public(self) -> dict:
        out = {"max_batch": self.max_batch, "max_wait_ms": self.max_wait_ms, "source": self.source,
               "probe_tokens": self.probe_tokens,
               "session_call_ms": {str(b): round(t, 3) for b, t in self.call_ms.items()},
               "rows_per_s": {str(b): round(b / t * 1000, 1) for b, t in self.call_ms.items() if t > 0},
               "rule": f"max_batch: smallest size within {NEAR_BEST:g} of the best rows/s (by {MARGIN_SE:g} standard "
                       f"errors) among calls <= {CALL_BUDGET_MS:g} ms; max_wait_ms: one batch-1 call, within "
                       f"{WAIT_BOUNDS_MS}"}
        if self.call_ms:
            out["measured"] = {
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.measured_at)),
                "reason": self.reason, "seconds": round(self.seconds, 2),
                "load_average": [round(x, 2) for x in self.load_average] if self.load_average else None,
                "pairs": self.pairs, "pairs_dropped": self.dropped,
                "call_ratio": {str(b): round(r, 3) for b, r in self.ratio.items()},
                "call_ratio_se": {str(b): round(r, 4) for b, r in self.ratio_se.items()},
                "typical_call_ms": {str(b): round(t, 3) for b, t in self.typical_ms.items()},
                "recorded_batch1_ms": round(self.reference_ms, 3) if self.reference_ms else None,
                "busy": self.busy,
                "statistic": f"session_call_ms = quiet batch-1 call (min of medians of {BLOCK} wall timings, at most "
                             "the median CPU time) x median CPU-time ratio of interleaved (batch-1, batch-n) pairs; "
                             f"pairs whose batch-1 call took over {DISTURBED:g}x the quiet or recorded one dropped"}
        return out


def probe_row(predictor, sample=None):
    """One row of about PROBE_TOKENS tokens, as the model sees it (a QA model gets a question too)."""
    words = PROBE_TEXT.split()
    text = " ".join(words * 4)
    item = sample if sample is not None else text
    row = predictor.prepare([item])[0].rows[0]
    keep = min(PROBE_TOKENS, row.length)
    features = {k: (v[:keep - 1] + v[-1:]) if keep < len(v) else list(v) for k, v in row.features.items()}
    return type(row)(features)


def min_of_medians(samples: list[float], block: int = BLOCK) -> float:
    """The lowest median of ``block`` consecutive samples (all of them when fewer)."""
    if len(samples) <= block:
        return statistics.median(samples)
    return min(statistics.median(samples[i:i + block]) for i in range(0, len(samples) - block + 1, block))


class Measurement:
    """Interleaved (batch-1, batch-n) pairs over rounds, one pair per step (module docstring)."""

    def __init__(self, run_rows, row, sizes=SIZES, budget_ms: float = CALL_BUDGET_MS,
                 reference_ms: float | None = None, rounds: int = ROUNDS):
        self.run_rows, self.row, self.budget_ms = run_rows, row, budget_ms
        self.reference_ms, self.rounds_wanted = reference_ms, rounds
        self.sizes = [s for s in sizes if s > 1]  # sizes with pairs (reported)
        self.active = list(self.sizes)  # sizes still timed each round
        self.t1: list[float] = []  # every batch-1 wall timing (ms), in order
        self.t1_cpu: list[float] = []  # ... and its CPU time (ms)
        self.pairs: dict[int, list[tuple]] = {s: [] for s in self.sizes}  # (batch-1, batch-n) wall, then CPU ms
        self._unwarmed = [1, *self.sizes]  # sizes not warmed up yet (then each is checked against the budget)
        self._round: deque[int] = deque()
        self.rounds = 0
        self.started = time.perf_counter()

    def _call_ms(self, size: int) -> tuple[float, float]:
        """(wall, CPU) ms of one session call; CPU time is the whole process's (the session's threads)."""
        started, cpu = time.perf_counter(), time.process_time()
        self.run_rows([self.row] * size)
        return (time.perf_counter() - started) * 1000, (time.process_time() - cpu) * 1000

    def _pair(self, size: int) -> None:
        if self.rounds % 2:
            ts = self._call_ms(size)
            t1 = self._call_ms(1)
        else:
            t1 = self._call_ms(1)
            ts = self._call_ms(size)
        self.t1.append(t1[0])
        self.t1_cpu.append(t1[1])
        if size > 1:
            self.pairs[size].append((t1[0], ts[0], t1[1], ts[1]))

    def step(self) -> bool:
        """Run one step (a few session calls); False once the measurement is complete."""
        if self._unwarmed:  # warm-up: a new shape allocates; sizes stop at the first far over budget
            size = self._unwarmed.pop(0)
            for _ in range(WARM_CALLS):
                self.run_rows([self.row] * size)
            self._pair(size)
            if size > 1 and self._estimate_ms(size, self.pairs[size]) > 2 * self.budget_ms:
                self._drop_sizes_after(size)
                self._unwarmed.clear()
            return True
        if not self._round:
            if self.complete():
                return False
            self.rounds += 1
            if self.rounds == PRUNE_AFTER + 1:
                self._prune()
            order = self.active or [1]
            shift = self.rounds % len(order)
            self._round.extend(order[shift:] + order[:shift])
        self._pair(self._round.popleft())
        return True

    def complete(self) -> bool:
        if self.rounds >= MAX_ROUNDS:
            return True
        if not self.active:
            return len(self.t1) >= self.rounds_wanted
        bound = self._bound()
        return self.rounds >= self.rounds_wanted and \
            all(sum(p[0] <= bound for p in self.pairs[s]) >= min(MIN_KEPT, self.rounds_wanted) for s in self.active)

    def _quiet_ms(self) -> float:
        quiet = min_of_medians(self.t1)
        cpu = statistics.median(self.t1_cpu)
        return min(quiet, cpu) if self._cpu_clock_usable() else quiet

    def _cpu_clock_usable(self) -> bool:
        """CPU time measures a call when the clock resolves it (Windows' reads 0 below 15.6 ms). The
        sessions run on ONNX Runtime's CPU provider, so a call is CPU-bound: its CPU time is its cost."""
        return min(self.t1_cpu, default=0.0) > 0

    def _ratios(self, pairs) -> list[float]:
        if self._cpu_clock_usable() and all(p[2] > 0 for p in pairs):
            return [p[3] / p[2] for p in pairs]
        return [p[1] / p[0] for p in pairs]

    def _ratio(self, pairs) -> float:
        return statistics.median(self._ratios(pairs))

    def _estimate_ms(self, size: int, pairs) -> float:
        return self._quiet_ms() * self._ratio(pairs)

    def _drop_sizes_after(self, size: int) -> None:
        """Sizes past ``size`` are not timed at all; ``size`` itself is reported from its pairs so far (it
        shows where the budget ends) but no longer timed."""
        self.sizes = [s for s in self.sizes if s <= size]
        self.pairs = {s: p for s, p in self.pairs.items() if s <= size}
        self.active = [s for s in self.active if s < size]

    def _prune(self) -> None:
        """After a few rounds, the first size whose call is over twice the budget, and those past it,
        stop being timed."""
        for size in self.active:
            if self._estimate_ms(size, self.pairs[size]) > 2 * self.budget_ms:
                self._drop_sizes_after(size)
                return

    def _bound(self) -> float:
        quiet = self._quiet_ms()
        return DISTURBED * min(quiet, self.reference_ms or quiet)

    def result(self) -> dict:
        """{call_ms, typical_ms, ratio, pairs, dropped, busy}: per size, the estimates of the module docstring."""
        quiet = self._quiet_ms()
        bound = self._bound()
        call_ms, typical, ratio = {1: quiet}, {1: statistics.median(t for t in self.t1 if t <= bound)
                                               if any(t <= bound for t in self.t1) else statistics.median(self.t1)}, {1: 1.0}
        ratio_se = {1: 0.0}  # batch 1 against itself
        dropped = total = 0
        for size in self.sizes:
            pairs = self.pairs[size]
            kept = [p for p in pairs if p[0] <= bound]
            if len(kept) < min(MIN_KEPT, len(pairs)):  # mostly disturbed: the medians of all (CPU ratios hold)
                kept = pairs
            total += len(pairs)
            dropped += len(pairs) - len(kept)
            ratio[size] = self._ratio(kept)
            ratio_se[size] = median_se(self._ratios(kept))
            call_ms[size] = quiet * ratio[size]
            typical[size] = statistics.median(p[1] for p in kept)
        busy = self.reference_ms is not None and quiet > DISTURBED * self.reference_ms
        return {"call_ms": call_ms, "typical_ms": typical, "ratio": ratio, "ratio_se": ratio_se, "pairs": total,
                "dropped": dropped,
                "busy": busy, "seconds": time.perf_counter() - self.started}


def median_se(samples: list[float], resamples: int = BOOTSTRAP) -> float:
    """Standard error of the median, by bootstrap with a fixed seed."""
    if len(samples) < 2:
        return 0.0
    rng = random.Random(0)
    return statistics.stdev(statistics.median(rng.choices(samples, k=len(samples))) for _ in range(resamples))


def choose(call_ms: dict[int, float], budget_ms: float = CALL_BUDGET_MS,
           ratio: dict[int, float] | None = None, ratio_se: dict[int, float] | None = None) -> tuple[int, float]:
    """(max_batch, max_wait_ms) from the timings, by the rule in the module docstring (``ratio`` and
    ``ratio_se``: each size's call against batch 1's and its standard error, for the margin)."""
    eligible = {b: t for b, t in call_ms.items() if t <= budget_ms} or {min(call_ms): call_ms[min(call_ms)]}
    rate = {b: b / t for b, t in eligible.items()}
    best_size = max(rate, key=rate.get)
    best = rate[best_size]

    def rel_se(b):  # relative standard error of rate[b] / best (two medians' errors, independent)
        if not ratio or not ratio_se or b == best_size:
            return 0.0
        return math.hypot(ratio_se.get(b, 0.0) / ratio[b], ratio_se.get(best_size, 0.0) / ratio[best_size])

    max_batch = min((b for b, r in rate.items() if r >= NEAR_BEST * best * (1 + MARGIN_SE * rel_se(b))),
                    default=best_size)
    low, high = WAIT_BOUNDS_MS
    return max_batch, round(min(max(call_ms[min(call_ms)], low), high), 2)


def recorded_latency_ms(artifact_dir) -> float | None:
    """The artifact's own batch-1 median latency from report.json, when it was measured on this kind of
    host (same CPU model, usable cores and runtimes); else None (no sanity bound from it)."""
    from xformopt.measure import host

    try:
        report = json.loads((Path(artifact_dir) / "report.json").read_text(encoding="utf-8"))
        latency = report["artifact"]["latency"]
        if (report.get("settings") or {}).get("batch", 1) != 1 or not report.get("host_fingerprint"):
            return None
        here = {"cpu_model": host.cpu_model(), "machine": platform.machine(), "cores_usable": host.usable_cpus(),
                "versions": host.library_versions()}
        if host.host_fingerprint(here) != report["host_fingerprint"]:
            return None
        return float(latency["median_ms"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def measure(predictor, sizes, sample=None, reference_ms: float | None = None, limit_s: float = START_LIMIT_S):
    """A complete measurement (start-up): (Measurement, probe row length)."""
    row = probe_row(predictor, sample)
    measurement = Measurement(predictor.run_rows, row, sizes, reference_ms=reference_ms)
    deadline = time.perf_counter() + limit_s
    while measurement.step() and time.perf_counter() < deadline:
        pass
    return measurement, row.length


def settle(measurement: Measurement, probe_tokens: int, max_batch: int | None, max_wait_ms: float | None,
           reason: str = "start-up") -> Choice:
    """The Choice a finished measurement gives, flags kept where given."""
    found = measurement.result()
    measured_batch, measured_wait = choose(found["call_ms"], ratio=found["ratio"], ratio_se=found["ratio_se"])
    source = {"max_batch": "flag" if max_batch is not None else "measured",
              "max_wait_ms": "flag" if max_wait_ms is not None else "measured"}
    return Choice(max_batch if max_batch is not None else measured_batch,
                  max_wait_ms if max_wait_ms is not None else measured_wait, found["call_ms"], probe_tokens, source,
                  found["typical_ms"], found["ratio"], found["ratio_se"], found["pairs"], found["dropped"],
                  measurement.reference_ms, found["busy"], reason, time.time(), found["seconds"], _load_average())


def tuned_sizes(max_batch: int | None) -> tuple[int, ...]:
    return tuple(s for s in SIZES if max_batch is None or s <= max(max_batch, 1)) or (1,)


def tune(predictor, max_batch: int | None, max_wait_ms: float | None, sample=None,
         reference_ms: float | None = None) -> Choice:
    """The settings to serve with: each one the flag gave, or measured here."""
    if max_batch is not None and max_wait_ms is not None:
        return Choice(max_batch, max_wait_ms, source={"max_batch": "flag", "max_wait_ms": "flag"})
    measurement, tokens = measure(predictor, tuned_sizes(max_batch), sample, reference_ms)
    return settle(measurement, tokens, max_batch, max_wait_ms)


def _load_average() -> tuple | None:
    try:
        return os.getloadavg()
    except OSError:
        return None
