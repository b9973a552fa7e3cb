"""Batching defaults measured at start-up (xformopt.serve.autotune): the rule that turns session-call
timings into max_batch / max_wait_ms, the interleaved measurement (on a fake clock: a busy start and
busy moments do not change the choice), and flags that override either setting."""

from __future__ import annotations

import time

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


def test_a_size_near_the_line_must_reach_it_by_a_margin_of_its_measurement_error():
    # batch 2 runs at 0.91 of batch 4's rows/s: within 0.9 exactly, not by two standard errors of 3 %
    ratio = {1: 1.0, 2: 1.6, 4: 2.912}
    call_ms = {b: 4.0 * r for b, r in ratio.items()}
    assert autotune.choose(call_ms)[0] == 2
    assert autotune.choose(call_ms, ratio=ratio, ratio_se={1: 0.0, 2: 0.048, 4: 0.087})[0] == 4
    assert autotune.choose(call_ms, ratio=ratio, ratio_se={1: 0.0, 2: 0.001, 4: 0.001})[0] == 2  # measured tightly
    assert autotune.median_se([1.0] * 9) == 0.0 and autotune.median_se([1.0, 2.0, 3.0, 4.0]) > 0


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
    """The host is 8 x slower for the measurement's first 3 s (busy seconds at start-up: the former rule,
    the fastest of 7 back-to-back calls per size, timed sizes 1-32 in them and chose 4 here) and 8 x
    slower for one call in ten after: the choice equals the quiet host's, and so does the quiet call."""
    import random

    rng = random.Random(0)
    session = FakeSession(monkeypatch, slowdown=lambda now: 8.0 if now < 3.0 else (8.0 if rng.random() < 0.1 else 1.0))
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


@pytest.fixture
def busy_cpus():
    """A busy-loop process per usable core beside the test: a host shared with other work."""
    import subprocess
    import sys

    from xformopt.measure.host import usable_cpus

    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(usable_cpus())]
    yield len(burners)
    for burner in burners:
        burner.kill()
        burner.wait()


def test_a_start_up_beside_busy_loops_still_enables_batching(served_classifier, busy_cpus):
    """The tiny model's session call is mostly fixed cost, so batching pays several times over; a server
    started while busy loops hold every core still measures that and batches (/info says what it measured,
    when, and the load average then)."""
    import httpx
    from serve_helpers import ServerThread

    from xformopt.serve.app import ServeConfig, create_app

    with ServerThread(create_app(ServeConfig(str(served_classifier), threads=1))) as server:
        batching = httpx.get(f"{server.url}/info").json()["batching"]
    measured = batching["measured"]
    assert batching["max_batch"] > 1 and batching["source"]["max_batch"] == "measured"
    assert measured["call_ratio"]["8"] < 8 * autotune.NEAR_BEST  # batching pays, as measured
    assert measured["load_average"][0] > 0 and measured["reason"] == "start-up" and batching["remeasured"] == 0


def test_a_drifting_session_is_measured_again_while_idle(served_classifier, monkeypatch):
    """An idle server times a probe call now and then; once they take over DRIFT x what was measured (the
    host got slower), it measures again between batches, serving meanwhile, and /info shows the new
    measurement and why."""
    import httpx
    from serve_helpers import ServerThread, slowed_factory

    from xformopt.serve import scheduler
    from xformopt.serve.app import ServeConfig, create_app

    monkeypatch.setattr(scheduler, "CANARY_S", 0.02)
    monkeypatch.setattr(scheduler, "CANARY_WINDOW", 3)
    monkeypatch.setattr(scheduler, "RETUNE_COOLDOWN_S", 0.0)
    kept: list = []
    config = ServeConfig(str(served_classifier), threads=1, scheduler=scheduler.Settings(max_batch=4))  # sizes 1-4
    app = create_app(config, slowed_factory(keep=kept))
    with ServerThread(app) as server:
        first = httpx.get(f"{server.url}/info").json()["batching"]
        kept[0].seconds = 0.03  # every session call takes 30 ms from now: far over the measured call
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert httpx.post(f"{server.url}/predict", json={"inputs": ["served meanwhile"]}).status_code == 200
            batching = httpx.get(f"{server.url}/info").json()["batching"]
            if batching["remeasured"] and batching["measured"]["typical_call_ms"]["1"] >= 25:
                break  # (a loaded host may have measured once more before the slowdown: that one does not count)
            time.sleep(0.2)
    assert batching["remeasured"] >= 1 and batching["measured"]["reason"].startswith("drift")
    assert batching["measured"]["at"] >= first["measured"]["at"]
    # the sleep added to each call is wall time, not CPU: the measured (typical) call shows it
    assert batching["measured"]["typical_call_ms"]["1"] >= 25 > first["measured"]["typical_call_ms"]["1"]
