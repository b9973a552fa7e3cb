"""Latency harness: interleaved timing of model variants and robust summaries.

Every speed comparison in xformopt (PyTorch baseline vs. exported vs. fused vs.
quantized ONNX) goes through :func:`run_interleaved`. Timing variants one after
another ("A 100 times, then B 100 times") lets slow machine drift -- thermal
throttling, turbo budgets, a noisy neighbour process, page-cache state -- land
on one variant only and masquerade as a speed difference. Interleaving them
round by round, on the same input, in a freshly shuffled order each round,
spreads that drift evenly over all variants, so their *ratio* stays honest even
when absolute numbers wobble.

We report the median as the headline number: latency distributions are
right-skewed (GC pauses, interrupts, scheduler hiccups), and the median is not
dragged around by a few outliers the way the mean is. p90/p99 show the tail.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

DEFAULT_ITERATIONS = 50
MIN_ROUNDS_WITH_BUDGET = 3

# Indirection so tests can substitute a fake clock; nanosecond integer counter
# avoids float rounding on very short calls.
_clock: Callable[[], int] = time.perf_counter_ns


@dataclass(frozen=True)
class LatencyStats:
    """Summary of ``n`` timed calls. All times in milliseconds."""

    n: int  # timed calls
    median_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    std_ms: float  # sample standard deviation (ddof=1); 0.0 when n == 1
    min_ms: float
    throughput_per_s: float  # items per second = items_per_call * n / total time

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(samples_s: Sequence[float], items_per_call: int = 1) -> LatencyStats:
    """Summarise per-call durations given in seconds.

    Percentiles use numpy's default "linear" interpolation, so e.g. samples of
    1..100 ms give median 50.5, p90 90.1 and p99 99.01 ms.
    """
    arr = np.asarray(samples_s, dtype=np.float64).ravel()
    if arr.size == 0:
        raise ValueError("summarize() needs at least one sample")
    if items_per_call < 1:
        raise ValueError(f"items_per_call must be >= 1, got {items_per_call}")
    ms = arr * 1000.0
    p50, p90, p99 = np.percentile(ms, [50, 90, 99], method="linear")
    total_s = float(arr.sum())
    throughput = items_per_call * arr.size / total_s if total_s > 0 else math.inf
    return LatencyStats(
        n=int(arr.size),
        median_ms=float(p50),
        p90_ms=float(p90),
        p99_ms=float(p99),
        mean_ms=float(ms.mean()),
        std_ms=float(ms.std(ddof=1)) if arr.size > 1 else 0.0,
        min_ms=float(ms.min()),
        throughput_per_s=float(throughput),
    )


def _check_interleaved_args(variants, n_inputs: int, warmup: int, iterations: int | None,
                            time_budget_s: float | None) -> None:
    """Refuse arguments :func:`run_interleaved` cannot time with (a ValueError naming the argument)."""
    if not variants:
        raise ValueError("run_interleaved() needs at least one variant")
    if n_inputs < 1:
        raise ValueError(f"n_inputs must be >= 1, got {n_inputs}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if iterations is not None and iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if time_budget_s is not None and time_budget_s < 0:
        raise ValueError(f"time_budget_s must be >= 0, got {time_budget_s}")


def run_interleaved(
    variants: Mapping[str, Callable[[int], object]],
    n_inputs: int,
    *,
    warmup: int = 5,
    iterations: int | None = None,
    time_budget_s: float | None = None,
    seed: int = 0,
    items_per_call: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, LatencyStats]:
    """Time several variants against each other, interleaved round by round.

    ``variants`` maps a name to ``call(i)``, which runs ONE timed unit of work
    on input index ``i`` (inputs ``0..n_inputs-1`` are cycled).

    1. Warm-up: each variant gets ``warmup`` untimed calls (first calls pay for
       lazy init, allocator growth, kernel selection, cache fill).
    2. Rounds: in round ``r`` every variant is called once on input
       ``r % n_inputs``, in an order shuffled per round by
       ``random.Random(seed)`` (reproducible, but no variant is always first
       or always after the same neighbour, whose cache footprint it would
       inherit).

    Stops after ``iterations`` rounds, or once ``time_budget_s`` (wall time of
    the timed phase, all variants together) is spent -- but never before
    ``MIN_ROUNDS_WITH_BUDGET`` rounds; with both, whichever comes first; with
    neither, ``DEFAULT_ITERATIONS`` rounds. ``progress(done, total)`` is called
    after each round, ``total`` being 0 when only a time budget bounds the run.
    """
    _check_interleaved_args(variants, n_inputs, warmup, iterations, time_budget_s)
    if iterations is None and time_budget_s is None:
        iterations = DEFAULT_ITERATIONS

    names = list(variants)

    for name in names:
        call = variants[name]
        for w in range(warmup):
            call(w % n_inputs)

    rng = random.Random(seed)
    samples_ns: dict[str, list[int]] = {name: [] for name in names}
    total = iterations if iterations is not None else 0
    budget_ns = None if time_budget_s is None else int(time_budget_s * 1e9)
    order = list(names)
    rounds = 0
    start = _clock()
    while True:
        idx = rounds % n_inputs
        rng.shuffle(order)
        for name in order:
            call = variants[name]
            t0 = _clock()
            call(idx)
            t1 = _clock()
            samples_ns[name].append(t1 - t0)
        rounds += 1
        if progress is not None:
            progress(rounds, total)
        if iterations is not None and rounds >= iterations:
            break
        if (
            budget_ns is not None
            and rounds >= MIN_ROUNDS_WITH_BUDGET
            and _clock() - start >= budget_ns
        ):
            break

    return {
        name: summarize([ns / 1e9 for ns in samples_ns[name]], items_per_call=items_per_call)
        for name in names
    }


def compare(stats: Mapping[str, LatencyStats], baseline: str) -> dict[str, float]:
    """Speedup of each variant over ``baseline``: baseline median / variant median (>1 = faster)."""
    if baseline not in stats:
        raise KeyError(f"baseline {baseline!r} not among {sorted(stats)}")
    base = stats[baseline].median_ms
    return {
        name: (base / s.median_ms if s.median_ms > 0 else math.inf) for name, s in stats.items()
    }
