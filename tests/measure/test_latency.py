"""Tests for xformopt.measure.latency (no wall-clock assertions about speed)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from xformopt.measure import latency
from xformopt.measure.latency import LatencyStats, compare, run_interleaved, summarize

# ----------------------------------------------------------------------------- summarize


def test_percentiles_match_numpy_linear_hand_values():
    samples = [i / 1000.0 for i in range(1, 101)]  # 1..100 ms
    s = summarize(samples)
    assert s.n == 100
    assert s.median_ms == pytest.approx(50.5)
    assert s.p90_ms == pytest.approx(90.1)
    assert s.p99_ms == pytest.approx(99.01)
    assert s.min_ms == pytest.approx(1.0)
    assert s.mean_ms == pytest.approx(50.5)


def test_percentiles_independent_of_sample_order():
    samples = [i / 1000.0 for i in range(100, 0, -1)]
    s = summarize(samples)
    assert (s.median_ms, s.p90_ms, s.p99_ms) == pytest.approx((50.5, 90.1, 99.01))


def test_mean_std_throughput():
    # 2, 4, 4, 4, 5, 5, 7, 9 ms: mean 5, sample std sqrt(32/7)
    samples = [x / 1000.0 for x in (2, 4, 4, 4, 5, 5, 7, 9)]
    s = summarize(samples, items_per_call=4)
    assert s.mean_ms == pytest.approx(5.0)
    assert s.std_ms == pytest.approx(math.sqrt(32 / 7))
    assert s.std_ms == pytest.approx(float(np.std(np.array(samples) * 1000, ddof=1)))
    assert s.min_ms == pytest.approx(2.0)
    assert s.median_ms == pytest.approx(4.5)
    # 8 calls * 4 items over 40 ms total
    assert s.throughput_per_s == pytest.approx(4 * 8 / 0.040)


def test_single_sample():
    s = summarize([0.010])
    assert s.n == 1
    assert s.median_ms == s.p90_ms == s.p99_ms == s.mean_ms == s.min_ms == pytest.approx(10.0)
    assert s.std_ms == 0.0
    assert s.throughput_per_s == pytest.approx(100.0)


def test_empty_raises():
    with pytest.raises(ValueError):
        summarize([])


def test_bad_items_per_call_raises():
    with pytest.raises(ValueError):
        summarize([0.001], items_per_call=0)


def test_to_dict_roundtrip_json():
    s = summarize([0.001, 0.002, 0.003])
    d = s.to_dict()
    assert set(d) == {
        "n", "median_ms", "p90_ms", "p99_ms", "mean_ms", "std_ms", "min_ms", "throughput_per_s",
    }
    assert LatencyStats(**json.loads(json.dumps(d))) == s


def test_stats_frozen():
    s = summarize([0.001])
    with pytest.raises(Exception):
        s.n = 5  # type: ignore[misc]


# ----------------------------------------------------------------------------- run_interleaved


class Recorder:
    """Fake variants that log (phase, name, index) for every call."""

    def __init__(self, names):
        self.log: list[tuple[str, int]] = []
        self.variants = {name: self._make(name) for name in names}

    def _make(self, name):
        def call(i):
            self.log.append((name, i))

        return call


class FakeClock:
    """Deterministic perf_counter_ns: each reading advances by ``step_ns``."""

    def __init__(self, step_ns: int):
        self.now = 0
        self.step_ns = step_ns

    def __call__(self) -> int:
        self.now += self.step_ns
        return self.now


NAMES = ["a", "b", "c", "d"]


def _timed_rounds(log, warmup, names):
    timed = log[warmup * len(names):]
    k = len(names)
    assert len(timed) % k == 0
    return [timed[j:j + k] for j in range(0, len(timed), k)]


def test_each_round_calls_every_variant_once_on_same_index():
    rec = Recorder(NAMES)
    stats = run_interleaved(rec.variants, n_inputs=3, warmup=2, iterations=7)
    rounds = _timed_rounds(rec.log, 2, NAMES)
    assert len(rounds) == 7
    for r, rnd in enumerate(rounds):
        assert sorted(name for name, _ in rnd) == NAMES
        assert {i for _, i in rnd} == {r % 3}  # inputs cycled 0,1,2,0,...
    assert set(stats) == set(NAMES)
    assert all(s.n == 7 for s in stats.values())


def test_order_shuffled_across_rounds_and_reproducible():
    def orders(seed):
        rec = Recorder(NAMES)
        run_interleaved(rec.variants, n_inputs=1, warmup=0, iterations=20, seed=seed)
        return [tuple(n for n, _ in rnd) for rnd in _timed_rounds(rec.log, 0, NAMES)]

    o1, o2 = orders(123), orders(123)
    assert o1 == o2
    assert len(set(o1)) > 1  # not the same order every round
    assert orders(124) != o1


def test_warmup_before_any_timed_call(monkeypatch):
    events: list[str] = []
    clock = FakeClock(1000)

    def fake_clock():
        events.append("clock")
        return clock()

    monkeypatch.setattr(latency, "_clock", fake_clock)

    def make(name):
        return lambda i: events.append(f"call:{name}:{i}")

    run_interleaved({n: make(n) for n in "xy"}, n_inputs=2, warmup=3, iterations=2)
    first_clock = events.index("clock")
    warm = events[:first_clock]
    assert sorted(warm) == sorted(
        [f"call:x:{i}" for i in (0, 1, 0)] + [f"call:y:{i}" for i in (0, 1, 0)]
    )
    # every call after the warm-up is bracketed by clock readings
    assert len([e for e in events[first_clock:] if e.startswith("call")]) == 4


def test_warmup_zero():
    rec = Recorder(["a"])
    run_interleaved(rec.variants, n_inputs=5, warmup=0, iterations=4)
    assert rec.log == [("a", 0), ("a", 1), ("a", 2), ("a", 3)]


def test_default_iterations_is_50():
    rec = Recorder(["a", "b"])
    stats = run_interleaved(rec.variants, n_inputs=1, warmup=0)
    assert stats["a"].n == stats["b"].n == latency.DEFAULT_ITERATIONS == 50


def test_timings_come_from_clock(monkeypatch):
    monkeypatch.setattr(latency, "_clock", FakeClock(2_000_000))  # 2 ms per reading
    rec = Recorder(["a", "b"])
    stats = run_interleaved(rec.variants, n_inputs=1, warmup=1, iterations=5, items_per_call=8)
    for s in stats.values():
        assert s.n == 5
        assert s.median_ms == pytest.approx(2.0)
        assert s.std_ms == pytest.approx(0.0)
        assert s.throughput_per_s == pytest.approx(8 / 0.002)


def test_time_budget_stops_run(monkeypatch):
    # Each clock reading advances 1 ms; a round of 2 variants costs ~5 readings.
    monkeypatch.setattr(latency, "_clock", FakeClock(1_000_000))
    rec = Recorder(["a", "b"])
    stats = run_interleaved(rec.variants, n_inputs=1, warmup=0, time_budget_s=0.050)
    n = stats["a"].n
    assert stats["b"].n == n
    assert 3 <= n <= 12  # stopped by the budget, not by any iteration count
    assert n < latency.DEFAULT_ITERATIONS


def test_tiny_budget_still_runs_three_rounds():
    rec = Recorder(["a", "b"])
    stats = run_interleaved(rec.variants, n_inputs=1, warmup=0, time_budget_s=0.0)
    assert stats["a"].n == stats["b"].n == 3


def test_iterations_win_when_smaller_than_budget(monkeypatch):
    monkeypatch.setattr(latency, "_clock", FakeClock(1_000))
    rec = Recorder(["a"])
    stats = run_interleaved(rec.variants, n_inputs=1, warmup=0, iterations=4, time_budget_s=100.0)
    assert stats["a"].n == 4


def test_budget_wins_when_smaller_than_iterations(monkeypatch):
    monkeypatch.setattr(latency, "_clock", FakeClock(1_000_000_000))  # 1 s per reading
    rec = Recorder(["a"])
    stats = run_interleaved(rec.variants, n_inputs=1, warmup=0, iterations=1000, time_budget_s=1.0)
    assert stats["a"].n == 3


def test_progress_callback():
    calls = []
    rec = Recorder(["a", "b"])
    run_interleaved(rec.variants, n_inputs=1, warmup=0, iterations=4,
                    progress=lambda d, t: calls.append((d, t)))
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]

    calls.clear()
    run_interleaved(rec.variants, n_inputs=1, warmup=0, time_budget_s=0.0,
                    progress=lambda d, t: calls.append((d, t)))
    assert calls == [(1, 0), (2, 0), (3, 0)]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"variants": {}, "n_inputs": 1},
        {"variants": {"a": lambda i: None}, "n_inputs": 0},
        {"variants": {"a": lambda i: None}, "n_inputs": 1, "iterations": 0},
        {"variants": {"a": lambda i: None}, "n_inputs": 1, "warmup": -1},
        {"variants": {"a": lambda i: None}, "n_inputs": 1, "time_budget_s": -1.0},
    ],
)
def test_invalid_arguments(kwargs):
    with pytest.raises(ValueError):
        run_interleaved(**kwargs)


# ----------------------------------------------------------------------------- compare


def test_compare_speedup():
    base = summarize([0.010, 0.010, 0.010])
    fast = summarize([0.004, 0.005, 0.006])
    slow = summarize([0.020])
    sp = compare({"torch": base, "onnx": fast, "slow": slow}, baseline="torch")
    assert sp["torch"] == pytest.approx(1.0)
    assert sp["onnx"] == pytest.approx(2.0)
    assert sp["slow"] == pytest.approx(0.5)


def test_compare_unknown_baseline():
    with pytest.raises(KeyError):
        compare({"a": summarize([0.001])}, baseline="b")


def test_model_call_mode_tokenizes_beforehand_and_times_only_the_model_call():
    from xformopt.measure.modes import model_call

    class Recorder:
        def __init__(self):
            self.tokenized, self.ran = [], []

        def tokenize(self, texts, pairs=None):
            self.tokenized.append((tuple(texts), pairs))
            return {"text": texts[0]}

        def run_encoded(self, encoded):
            assert len(self.tokenized) == 3, "every text is tokenized before the first timed call"
            self.ran.append(encoded["text"])
            return np.zeros(1)

    a, b = Recorder(), Recorder()
    stats = model_call({"a": a, "b": b}, ["x", "y", "z"], None, rounds=6, warmup=2)
    assert set(stats) == {"a", "b"} and all(s.n == 6 for s in stats.values())
    for r in (a, b):
        assert r.tokenized == [(("x",), None), (("y",), None), (("z",), None)]
        assert len(r.ran) == 8 and set(r.ran) <= {"x", "y", "z"}
    assert a.ran == b.ran  # interleaved: both variants see the same text in each round
