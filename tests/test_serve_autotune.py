"""Batching defaults measured at start-up (xformopt.serve.autotune): the rule that turns session-call
timings into max_batch / max_wait_ms, the interleaved measurement (on a fake clock: a busy start and
busy moments do not change the choice), and flags that override either setting."""

from __future__ import annotations

import pytest

from xformopt.serve import autotune


def test_max_batch_is_the_smallest_size_near_the_best_rate_within_the_call_budget():
    # rows/s: 1000, 1667, 2500, 3333, 3810, 4000 and (64 rows, over a 10 ms budget) 3879
    call_ms = {1: 1.0, 2: 1.2, 4: 1.6, 8: 2.4, 16: 4.2, 32: 8.0, 64: 16.5}
    assert autotune.choose(call_ms, budget_ms=10.0) == (16, 1.0)
    assert autotune.choose(call_ms, budget_ms=3.0)[0] == 8  # 16 rows take 4.2 ms: over a 3 ms budget
    assert autotune.choose({1: 30.0, 2: 55.0}, budget_ms=10.0) == (1, autotune.WAIT_BOUNDS_MS[1])  # all over budget
    assert autotune.choose({1: 0.1, 2: 0.19})[1] == autotune.WAIT_BOUNDS_MS[0]
    flat = {1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0}  # no gain from batching: batch 1
    assert autotune.choose(flat)[0] == 1


class FakeSession:
    """A session on a fake clock: a call costs ``fixed + per_row`` ms of CPU per row, and takes that times
    ``slowdown(wall clock s)`` in wall time (a neighbour taking the cores away adds waiting, not CPU)."""

    def __init__(self, monkeypatch, fixed=1.0, per_row=0.2, slowdown=lambda now: 1.0, cpu_clock=True):
        self.wall = self.cpu = 0.0
        self.fixed, self.per_row, self.slowdown = fixed, per_row, slowdown
        self.sizes: list[int] = []
        monkeypatch.setattr(autotune.time, "perf_counter", lambda: self.wall)
        monkeypatch.setattr(autotune.time, "process_time", (lambda: self.cpu) if cpu_clock else (lambda: 0.0))

    def run_rows(self, rows):
        self.sizes.append(len(rows))
        cost = (self.fixed + self.per_row * len(rows)) / 1000
        self.cpu += cost
        self.wall += cost * self.slowdown(self.wall)

    def quiet(self, sizes=autotune.SIZES) -> dict:
        return {s: self.fixed + self.per_row * s for s in sizes}


def _measure(session, **kwargs):
    measurement = autotune.Measurement(session.run_rows, object(), **kwargs)
    while measurement.step():
        pass
    return measurement.result()


def test_the_measurement_stops_timing_sizes_past_twice_the_budget(monkeypatch):
    session = FakeSession(monkeypatch, fixed=0.0, per_row=3.0)  # 3 ms a row: 8 rows take 24 ms, over 2 x 10
    found = _measure(session, budget_ms=10.0)
    assert list(found["call_ms"]) == [1, 2, 4, 8] and found["call_ms"][8] == pytest.approx(24.0)
    assert set(session.sizes) == {1, 2, 4, 8}
    assert session.sizes.count(8) == autotune.WARM_CALLS + 1  # warmed, one pair, then no more
    assert session.sizes.count(4) >= autotune.ROUNDS


def test_a_busy_start_and_busy_moments_do_not_change_the_choice(monkeypatch):
    """The host is 15 x slower for the measurement's first 0.3 s (a busy second at start-up: the old
    fastest-of-7 rule then timed batch 1 alone in the busy stretch) and 8 x slower for one call in ten
    after: the choice equals the quiet host's, and so does the quiet batch-1 call."""
    import random

    rng = random.Random(0)
    session = FakeSession(monkeypatch, slowdown=lambda now: 15.0 if now < 0.3 else (8.0 if rng.random() < 0.1 else 1.0))
    want = autotune.choose(session.quiet())
    assert want[0] > 1  # batching pays here: 1 ms of each call is fixed
    found = _measure(session)
    assert autotune.choose(found["call_ms"]) == want
    assert found["call_ms"][1] == pytest.approx(1.2) and found["dropped"] > 0
    # a CPU clock too coarse to time a call: wall-clock pairs, whose ratio a busy stretch spoils less than
    # it spoils the timings themselves
    session = FakeSession(monkeypatch, slowdown=lambda now: 15.0 if 0.05 < now < 0.3 else 1.0, cpu_clock=False)
    found = _measure(session)
    assert autotune.choose(found["call_ms"])[0] == want[0] and found["call_ms"][1] == pytest.approx(1.2, rel=0.05)


def test_a_host_far_slower_than_the_artifact_recorded_is_marked_busy(monkeypatch):
    session = FakeSession(monkeypatch)
    assert not _measure(session, reference_ms=1.0)["busy"]
    session = FakeSession(monkeypatch, fixed=10.0)  # batch 1 takes 10.2 ms of CPU: 10 x the recorded 1 ms
    assert _measure(session, reference_ms=1.0)["busy"]


class _NoSession:
    def run_rows(self, rows):
        raise AssertionError("both settings came from flags: nothing to time")


def test_flags_override_the_measurement():
    choice = autotune.tune(_NoSession(), 4, 2.5)
    assert (choice.max_batch, choice.max_wait_ms) == (4, 2.5)
    assert choice.source == {"max_batch": "flag", "max_wait_ms": "flag"} and choice.call_ms == {}


def test_a_real_session_is_timed_and_the_choice_reported(served_classifier):
    from xformopt.runtime.predictor import load_predictor

    predictor = load_predictor(served_classifier, threads=1)
    choice = autotune.tune(predictor, None, None)
    assert choice.source == {"max_batch": "measured", "max_wait_ms": "measured"}
    assert choice.max_batch in choice.call_ms and choice.probe_tokens == autotune.PROBE_TOKENS
    assert choice.max_wait_ms == autotune.choose(choice.call_ms)[1]
    public = choice.public()
    assert public["max_batch"] == choice.max_batch and set(public["rows_per_s"]) == set(public["session_call_ms"])
    measured = public["measured"]
    assert measured["reason"] == "start-up" and measured["pairs"] >= autotune.ROUNDS and measured["at"].endswith("Z")
    assert set(measured["call_ratio"]) == set(public["session_call_ms"]) and measured["call_ratio"]["1"] == 1.0
    only_wait = autotune.tune(predictor, 1, None)  # --max-batch 1: only batch 1 is timed
    assert only_wait.max_batch == 1 and list(only_wait.call_ms) == [1] and only_wait.source["max_batch"] == "flag"
