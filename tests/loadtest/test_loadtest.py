"""`xformopt loadtest` against servers with a known service time (real uvicorn servers on free ports).

Only what holds on any host is asserted: a latency is never below the service time, errors are
counted by status exactly, and an open-loop client sees the queue a saturated server builds (a
closed-loop client would not: it waits for each answer before sending the next)."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from serve_helpers import ServerThread

from xformopt.loadtest.generator import arrival_times
from xformopt.loadtest.report import markdown, sustainable
from xformopt.loadtest.run import Options, Target, run

SERVICE_S = 0.02


def known_service_app(serial_s: float | None = None):
    """POST /predict sleeps SERVICE_S (503 for texts starting 'fail'); with ``serial_s``, requests are
    served one at a time, each taking that long (capacity 1 / serial_s per second)."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    lock = asyncio.Lock()

    async def predict(request):
        body = await request.json()
        if serial_s is not None:
            async with lock:
                await asyncio.sleep(serial_s)
        else:
            await asyncio.sleep(SERVICE_S)
        if body["inputs"].startswith("fail"):
            return JSONResponse({"error": "no"}, status_code=503)
        return JSONResponse([{"label": "x", "score": 1.0}])

    async def info(request):
        return JSONResponse({"task": "text-classification"})

    return Starlette(routes=[Route("/predict", predict, methods=["POST"]), Route("/info", info),
                             Route("/health", info)])


def test_latencies_are_never_below_the_service_time_and_errors_are_counted_by_status():
    texts = ["a", "b", "fail c", "d"]
    with ServerThread(known_service_app()) as server:
        options = Options(rates=[8.0, 16.0], duration_s=2.0, warmup_s=0.3, p99_ms=10_000, seed=3, full_ladder=True)
        document = run([Target(server.url, "known")], texts, options)
    steps = document["targets"][0]["steps"]
    assert [s["offered_rps"] for s in steps] == [8.0, 16.0]
    for i, step in enumerate(steps):
        sent = len(arrival_times(step["offered_rps"], 2.0, random.Random(3 + i)))
        assert step["sent"] == sent
        assert step["errors"] == ({"503": sent // 4 + (1 if sent % 4 > 2 else 0)} if sent > 2 else {})
        assert step["ok"] == sent - sum(step["errors"].values())
        assert step["p50_ms"] >= SERVICE_S * 1000 and step["p50_ms"] <= step["p90_ms"] <= step["p99_ms"] <= step["max_ms"]
        assert step["mean_batch_size"] is None  # this server has no /metrics
    assert sustainable(steps, 10_000) is None  # every step had errors
    assert "known" in markdown(document) and document["load_average"]["before"]


def test_an_open_loop_client_sees_the_queue_of_a_saturated_server():
    serial, duration, rate = 0.05, 2.0, 40.0  # capacity 20/s, offered 40/s
    with ServerThread(known_service_app(serial_s=serial)) as server:
        options = Options(rates=[rate], duration_s=duration, warmup_s=0.0, p99_ms=50, seed=1)
        step = run([Target(server.url, "serial")], ["x"], options)["targets"][0]["steps"][0]
    sent = len(arrival_times(rate, duration, random.Random(1)))
    # one at a time: the last answer comes at least sent * serial after the first arrival, and it was
    # scheduled within the step's duration, so its latency is at least the difference
    assert step["max_ms"] >= 1000 * (sent * serial - duration) - 1
    assert step["p99_ms"] > 10 * serial * 1000
    assert sustainable([step], 50) is None


def test_cli_writes_json_markdown_and_plot_and_compares_two_servers(tmp_path, capsys):
    from helpers import run_cli

    with ServerThread(known_service_app()) as one, ServerThread(known_service_app()) as two:
        code, out, err = run_cli(["loadtest", one.url, "--rates", "5,10", "--duration", "1", "--warmup", "0.2",
                                  "--p99-ms", "5000", "--compare", two.url, "-o", tmp_path / "lt", "--json"], capsys)
    assert code == 0, err
    document = json.loads(out)
    assert [t["label"] for t in document["targets"]] == ["target", "compare"]
    assert all(len(t["steps"]) == 2 for t in document["targets"])
    assert document["comparison"]["labels"] == ["target", "compare"]
    assert json.loads((tmp_path / "lt" / "loadtest.json").read_text())["schema"] == "xformopt.loadtest/1"
    assert "| offered req/s |" in (tmp_path / "lt" / "loadtest.md").read_text()
    assert (tmp_path / "lt" / "loadtest.png").stat().st_size > 1000
    code, _, err = run_cli(["loadtest", "nowhere", "--rates", "5"], capsys)
    assert code == 2 and "neither a URL" in err
    code, _, err = run_cli(["loadtest", "http://127.0.0.1:1", "--rates", "0,5"], capsys)
    assert code == 2 and "positive rates" in err


@pytest.mark.parametrize("rate", [50.0, 400.0])
def test_poisson_arrivals_have_the_offered_mean_rate(rate):
    times = arrival_times(rate, 20.0, random.Random(0))
    assert abs(len(times) / 20.0 - rate) < 4 * (rate / 20.0) ** 0.5  # within 4 standard deviations
    assert times == sorted(times) and times[-1] < 20.0


def bounded_app(serial_s: float, max_waiting: int, idle_mb: float, busy_mb: float):
    """Serves one request at a time (``serial_s`` each); more than ``max_waiting`` waiting get 503 at once;
    texts starting 'hang' are never answered; /metrics reports ``idle_mb`` until the first request,
    ``busy_mb`` after it."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    lock, state = asyncio.Lock(), {"waiting": 0, "seen": False}

    async def predict(request):
        body = await request.json()
        state["seen"] = True
        if body["inputs"].startswith("hang"):
            await asyncio.sleep(3600)
        if state["waiting"] >= max_waiting:
            return JSONResponse({"error": "full"}, status_code=503, headers={"Retry-After": "1"})
        state["waiting"] += 1
        try:
            async with lock:
                await asyncio.sleep(serial_s)
        finally:
            state["waiting"] -= 1
        return JSONResponse([{"label": "x", "score": 1.0}])

    async def metrics(request):
        rss = (busy_mb if state["seen"] else idle_mb) * 2**20
        return PlainTextResponse(f"xformopt_batch_size_count 0\nprocess_resident_memory_bytes {rss:e}\n")

    async def info(request):
        return JSONResponse({"task": "text-classification"})

    return Starlette(routes=[Route("/predict", predict, methods=["POST"]), Route("/info", info),
                             Route("/health", info), Route("/metrics", metrics)])


def test_overload_counts_every_fate_memory_against_idle_and_the_recovery():
    texts = ["a", "b", "c", "d", "e", "f", "g", "hang h"]
    # its hung requests never finish: at exit they are cancelled after 1 s (else the 60 s join runs out)
    with ServerThread(bounded_app(serial_s=0.01, max_waiting=4, idle_mb=100, busy_mb=180), graceful_s=1) as server:
        options = Options(rates=[20.0], duration_s=1.0, warmup_s=0.0, p99_ms=2000, seed=5, timeout_s=1.0,
                          overload_rps=300.0, overload_s=2.0, recovery_s=4.0)
        document = run([Target(server.url, "bounded")], texts, options)
    result = document["targets"][0]["overload"]
    sent = result["overload"]["sent"] + result["recovery"]["sent"]
    assert sent > 300 and result["lost"] == 0
    # every eighth request hangs: exactly those time out at the client
    assert result["hung"] == sum(result[p]["by_status"].get("timeout", 0) for p in ("overload", "recovery")) > 0
    assert result["overload"]["by_status"].get("503", 0) > 0  # over capacity: refused, not queued
    assert result["memory"]["idle_bytes"] == 100 * 2**20 and result["memory"]["peak_over_idle"] == pytest.approx(1.8)
    assert result["checks"]["memory_within_1.5x_idle"] is False and result["checks"]["none_lost_or_hung"] is False
    assert "### Overload: 300 req/s" in markdown(document)


def test_recovery_is_the_first_window_from_which_every_window_is_good():
    from xformopt.loadtest.generator import Outcome
    from xformopt.loadtest.overload import recovery_time

    def window(start, status="200", latency=0.01, n=5):
        return [Outcome(start + i * 0.1, start + i * 0.1, start + i * 0.1 + latency, status) for i in range(n)]

    outcomes = window(10.0, "503") + window(11.0, latency=0.5) + window(12.0) + window(13.0, "504") + window(14.0) \
        + window(15.0) + window(16.0)
    assert recovery_time(outcomes, end=10.0, until=17.0, bound_ms=100) == 4.0  # 13-14 had a 504
    assert recovery_time(outcomes[:-5] + window(16.0, latency=1.0), end=10.0, until=17.0, bound_ms=100) is None
    assert recovery_time(window(10.0) + window(11.0), end=10.0, until=12.0, bound_ms=100) == 0.0
    one_slow = window(10.0, n=4) + window(10.5, latency=0.5, n=1) + window(11.0)  # one slow request in 10-11
    assert recovery_time(one_slow, end=10.0, until=12.0, bound_ms=100, q=50) == 0.0
    assert recovery_time(one_slow, end=10.0, until=12.0, bound_ms=100, q=99) == 1.0
