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
        document = run([Target(server.url, "known")], texts, options, log=lambda m: None)
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
        step = run([Target(server.url, "serial")], ["x"], options, log=lambda m: None)["targets"][0]["steps"][0]
    sent = len(arrival_times(rate, duration, random.Random(1)))
    # one at a time: the last answer comes at least sent * serial after the first arrival, and it was
    # scheduled within the step's duration, so its latency is at least the difference
    assert step["max_ms"] >= 1000 * (sent * serial - duration) - 1
    assert step["p99_ms"] > 10 * serial * 1000
    assert sustainable([step], 50) is None


def test_cli_writes_json_markdown_and_plot_and_compares_two_servers(tmp_path, capsys):
    from conftest import run_cli

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
