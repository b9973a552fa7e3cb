"""`xformopt loadtest` for decoder servers, against streaming servers with a known service time (real
uvicorn servers on free ports).

Only bounds that hold on any host are asserted: a first token never comes before the server's prefill
time, a stream's gaps add up to about one step time each (10 % slack for the client's own timing),
and N streams served one token at a time (a serial server) never get more than one token per step time together, while independent
streams get up to N times that; tokens and requests are counted exactly."""

from __future__ import annotations

import asyncio
import json

from serve_helpers import ServerThread

from xformopt.loadtest.run import Target
from xformopt.loadtest.stream_ladder import StreamOptions, run_streams
from xformopt.loadtest.stream_report import markdown

FIRST_S, STEP_S = 0.05, 0.02
SLACK = 1.1  # rates are timed at the client: the first chunk may arrive a little later than the last one's pace


def known_stream_app(serial: bool = False, chat_role_chunk: bool = True):
    """POST /v1/completions streams max_tokens chunks of text: the first after FIRST_S, each next after
    STEP_S; ``serial``: one token at a time across all streams (a lock held for each step), so N streams
    share one token per STEP_S. /info says text-generation; no /metrics."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    lock = asyncio.Lock()

    async def step(seconds: float) -> None:
        if serial:
            async with lock:
                await asyncio.sleep(seconds)
        else:
            await asyncio.sleep(seconds)

    async def completions(request):
        body = await request.json()
        n = body["max_tokens"]

        async def events():
            if chat_role_chunk:  # like OpenAI: an opening chunk without text, before any token
                yield b'data: {"choices": [{"index": 0, "text": "", "finish_reason": null}]}\n\n'
            await step(FIRST_S)
            for k in range(n):
                if k:
                    await step(STEP_S)
                finish = "length" if k == n - 1 else None
                yield ("data: " + json.dumps({"choices": [{"index": 0, "text": f" t{k}", "finish_reason": finish}]})
                       + "\n\n").encode()
            yield ("data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": n}})
                   + "\n\ndata: [DONE]\n\n").encode()

        return StreamingResponse(events(), media_type="text/event-stream")

    async def info(request):
        return JSONResponse({"task": "text-generation"})

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]), Route("/info", info),
                             Route("/health", info)])


TEXTS = ["A fine film with a slow middle.", "Nothing in it works.", "The cast is wonderful and the plot is thin."]


def _run(app, streams, tokens=8, duration=1.2):
    with ServerThread(app) as server:
        options = StreamOptions(streams=streams, duration_s=duration, warmup_s=0.2, max_tokens=tokens, prompt_chars=60)
        return run_streams([Target(server.url, "known")], TEXTS, options)


def test_independent_streams_respect_the_service_times_and_scale():
    document = _run(known_stream_app(), [1, 4])
    levels = document["targets"][0]["levels"]
    for level in levels:
        assert level["ok"] == level["requests"] >= level["streams"] and not level["errors"]
        assert level["completion_tokens"] == 8 * level["ok"] and level["prompt_tokens_mean"] == 7
        assert level["ttft_p50_ms"] >= FIRST_S * 1000  # no first token before the prefill time
        assert level["ttft_p50_ms"] <= level["ttft_p90_ms"] <= level["ttft_p99_ms"]
        assert level["itl_p50_ms"] <= level["itl_p90_ms"] <= level["itl_p99_ms"] <= level["itl_max_ms"]
        assert level["stream_decode_tokens_per_s"] <= SLACK / STEP_S  # never faster than the step time
        assert sum(u["requests"] for u in level["users"]) == level["ok"] and len(level["users"]) == level["streams"]
    one, four = levels
    assert abs(four["aggregate_decode_tokens_per_s"] - 4 * four["stream_decode_tokens_per_s"]) < 0.01
    assert document["targets"][0]["scaling"]["aggregate_decode_tokens_per_s"]["1"] == 1.0
    assert document["schema"] == "xformopt.loadtest.streams/1"
    assert "| 4 |" in markdown(document)


def test_a_serial_server_shares_one_token_per_step_among_its_streams():
    document = _run(known_stream_app(serial=True), [3], tokens=6, duration=1.5)
    level = document["targets"][0]["levels"][0]
    assert not level["errors"] and level["completion_tokens"] == 6 * level["ok"]
    # one token per STEP_S across all streams: together they never beat that
    assert level["aggregate_decode_tokens_per_s"] <= SLACK / STEP_S


def test_cli_writes_json_markdown_and_plot_for_a_decoder_server(tmp_path, capsys):
    from helpers import run_cli

    with ServerThread(known_stream_app()) as server:
        code, out, err = run_cli(["loadtest", server.url, "--streams", "2,1", "--duration", "0.6", "--warmup", "0.1",
                                  "--max-tokens", "4", "-o", tmp_path / "lt", "--json"], capsys)
        assert code == 0, err
        document = json.loads(out)
        assert [s["streams"] for s in document["targets"][0]["levels"]] == [1, 2]
        assert json.loads((tmp_path / "lt" / "loadtest.json").read_text())["schema"] == "xformopt.loadtest.streams/1"
        assert "| streams |" in (tmp_path / "lt" / "loadtest.md").read_text()
        assert (tmp_path / "lt" / "loadtest.png").stat().st_size > 1000
        code, _, err = run_cli(["loadtest", server.url, "--streams", "0,2"], capsys)
        assert code == 2 and "at least 1" in err
        code, _, err = run_cli(["loadtest", server.url, "--route", "/predict", "--streams", "1"], capsys)
        assert code == 2 and "a decoder load test posts to" in err
