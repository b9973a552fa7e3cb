"""Batching defaults measured at start-up (xformopt.serve.autotune): the rule that turns session-call
timings into max_batch / max_wait_ms, the timing loop, and flags that override either setting."""

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


def test_time_sizes_stops_past_twice_the_budget(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(autotune.time, "perf_counter", lambda: clock[0])
    seen = []

    def run_rows(rows):  # a session whose call costs 3 ms per row on the fake clock, 5 ms more at times
        seen.append(len(rows))
        clock[0] += 0.003 * len(rows) + (0.005 if len(seen) % 3 == 0 else 0.0)

    call_ms = autotune.time_sizes(run_rows, object(), budget_ms=10.0)
    assert list(call_ms) == [1, 2, 4, 8] and call_ms[8] == pytest.approx(24.0)  # the busy moments do not count
    assert set(seen) == {1, 2, 4, 8}


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
    only_wait = autotune.tune(predictor, 1, None)  # --max-batch 1: only batch 1 is timed
    assert only_wait.max_batch == 1 and list(only_wait.call_ms) == [1] and only_wait.source["max_batch"] == "flag"
