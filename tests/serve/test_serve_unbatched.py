"""`xformopt serve` of decoders without GroupQueryAttention. A tiny Qwen3.5 (one Gated DeltaNet layer with
conv/recurrent states, one full-attention layer; the plain dynamo export) is batched continuously in
left-padded rows (:class:`~xformopt.runtime.padded_batch_decoder.PaddedBatchDecoder`); a tiny GPT-2 (ORT's
GPT-2 layout, which neither engine batches) is served one request at a time on the single-stream runner
(:class:`~xformopt.runtime.serial_decoder.SerialDecoder`), under the same scheduler.

Real uvicorn servers on free ports, real httpx clients. Every answer must equal ``xformopt generate``'s
greedy single-stream answer (concurrent requests, joins, leaves and chunked prompts included); streaming,
the mode in /info and the start-up warning, the queue bound (503 + Retry-After) and SIGTERM (the running
request ends cleanly, the waiting one is refused with 503) are checked as for the GroupQueryAttention path.
Where a request must outlast something, the engine's steps are slowed to a known minimum; no test asserts
a wall-clock time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import tiny_decoders
from decoder_serve_helpers import CHAT_TEMPLATE, slow_engine_factory, sse_events
from helpers import error_lines, make_ctx, run_cli, run_pass
from serve_helpers import ServerThread, free_port, metric

from xformopt.serve.app import ServeConfig, create_app
from xformopt.serve.decoder_scheduler import DecoderSettings

PROMPTS = ["The movie was a", "A long and winding story about a film that nobody had ever seen before"]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory, sample_texts) -> Path:
    """The tiny Qwen3.5's export (states carried), with a chat template."""
    root = tmp_path_factory.mktemp("qwen3_5-serve")
    model = tiny_decoders.build(root / "m", "qwen3_5_text", seed=3)
    run_pass("export", make_ctx(model, sample_texts), model, root / "e")
    (root / "e" / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return root / "e"


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory, sample_texts) -> Path:
    """A tiny GPT-2's export (ORT's GPT-2 layout: stacked past, position ids, no GroupQueryAttention)."""
    from toy_decoder import build_decoder

    root = tmp_path_factory.mktemp("gpt2-serve")
    model = build_decoder(root / "m", "gpt2")
    run_pass("export", make_ctx(model, sample_texts), model, root / "e")
    return root / "e"


@pytest.fixture(scope="module")
def generator(qwen):
    from xformopt.decoder.generator import TextGenerator

    return TextGenerator(qwen, threads=1)


def _config(artifact, **decoder) -> ServeConfig:
    return ServeConfig(str(artifact), threads=1, model_name="tiny", decoder=DecoderSettings(**decoder))


def test_serial_engine_decodes_as_generate_through_chunked_prompts(qwen):
    """The engine alone: a prompt longer than the graph's 64-token step, read in chunks of 24 as the
    scheduler reads it, then decoded, gives generate's greedy tokens."""
    import numpy as np

    from xformopt.decoder.generate import generate
    from xformopt.runtime.decoder import OrtDecoder
    from xformopt.runtime.serial_decoder import SerialDecoder

    prompt = [(7 * i) % 200 + 3 for i in range(90)]
    expected = generate(OrtDecoder(qwen, threads=1), prompt, 12).new_ids  # greedy, to EOS or 12 tokens
    engine = SerialDecoder(qwen, threads=1, max_kv_tokens=512)
    slot = engine.open(len(prompt) + 12)
    assert not engine.fits(8)  # one row: the next request waits
    for start in range(0, len(prompt), 24):
        logits = engine.prefill(slot, prompt[start:start + 24])
    engine.start_decoding(slot)
    got = [int(np.argmax(logits))]
    while len(got) < len(expected):
        got.append(int(np.argmax(engine.decode([got[-1]])[0])))
    assert got == expected
    engine.close(slot)
    assert engine.fits(8) and engine.cached_positions == 0


def test_left_padded_batch_decodes_joins_leaves_and_chunked_prompts_as_each_alone(qwen):
    """Three sequences join at different steps (one with a 90-token prompt read in 24-token chunks, past
    the graph's 64-token step), decode together in one call per step, and leave as they finish: each
    gets exactly generate's greedy tokens."""
    import numpy as np

    from xformopt.decoder.generate import generate
    from xformopt.runtime.decoder import OrtDecoder
    from xformopt.runtime.padded_batch_decoder import PaddedBatchDecoder

    prompts = {"a": [5, 17, 33, 9, 41], "b": [(7 * i) % 200 + 3 for i in range(90)], "c": [11, 12, 13]}
    new = {"a": 20, "b": 14, "c": 20}
    runner = OrtDecoder(qwen, threads=1)
    alone = {k: generate(runner, p, new[k], eos_token_id=None).new_ids for k, p in prompts.items()}
    engine = PaddedBatchDecoder(qwen, threads=1, max_kv_tokens=4096, max_rows=4)
    got, slots = {}, {}

    def join(key):
        slots[key] = engine.open(len(prompts[key]) + new[key])
        for start in range(0, len(prompts[key]), 24):
            logits = engine.prefill(slots[key], prompts[key][start:start + 24])
        engine.start_decoding(slots[key])
        got[key] = [int(np.argmax(logits))]

    def step():
        order = [next(k for k in slots if slots[k] is s) for s in engine.decoding]
        for key, row in zip(order, engine.decode([got[k][-1] for k in order])):
            got[key].append(int(np.argmax(row)))
            if len(got[key]) == new[key]:
                engine.close(slots.pop(key))

    join("a"), step(), step(), join("b"), step(), join("c")
    steps, remaining = engine.calls["decode"], max(new[k] - len(got[k]) for k in slots)
    while slots:
        step()
    assert got == alone
    assert engine.calls["decode"] - steps == remaining  # one call per step for every decoding row
    assert engine.cached_positions == 0 and engine.width == 0


def test_qwen3_5_is_batched_continuously_with_generate_answers(qwen, generator):
    """Two concurrent requests are both answered, each equal to generate's greedy text; /info says which
    engine batches it; a streamed chat equals the same chat unstreamed."""

    async def ask(url):
        async with httpx.AsyncClient(timeout=120) as client:
            replies = await asyncio.gather(*(client.post(f"{url}/v1/completions", json={
                "prompt": p, "max_tokens": 16, "temperature": 0}) for p in PROMPTS))
            info = (await client.get(f"{url}/info")).json()
            metrics = (await client.get(f"{url}/metrics")).text
        assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
        return [r.json()["choices"][0]["text"] for r in replies], info, metrics

    chat = {"messages": [{"role": "user", "content": "Say something"}], "max_tokens": 12, "temperature": 0}
    with ServerThread(create_app(_config(qwen))) as server:
        answers, info, metrics = asyncio.run(ask(server.url))
        whole = httpx.post(f"{server.url}/v1/chat/completions", json=chat, timeout=120).json()
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json={**chat, "stream": True},
                          timeout=120) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = list(sse_events(r))
    assert answers == [generator.generate(p, max_new_tokens=16).text for p in PROMPTS]
    assert info["batching"] == {"mode": "continuous", "engine": "left-padded", "max_streams": 16, "reason": None}
    assert metric(metrics, "xformopt_decoder_finished_total", reason="length") + \
        metric(metrics, "xformopt_decoder_finished_total", reason="stop") == 2
    assert events[-1] == "[DONE]"
    streamed = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"])
    assert streamed == whole["choices"][0]["message"]["content"]
    assert whole["choices"][0]["message"]["content"] == generator.generate(chat="Say something",
                                                                           max_new_tokens=12).text


def test_gpt2_layout_is_served_one_at_a_time_with_generate_answers(gpt2, caplog):
    """GPT-2's own export has no GroupQueryAttention and a stacked past: concurrent requests are queued and
    answered one at a time, each as generate answers it; the start-up log and /info say batching is off
    and why."""
    from xformopt.decoder.generator import TextGenerator

    async def ask(url):
        async with httpx.AsyncClient(timeout=120) as client:
            replies = await asyncio.gather(*(client.post(f"{url}/v1/completions", json={
                "prompt": p, "max_tokens": 10, "temperature": 0}) for p in PROMPTS))
            metrics = (await client.get(f"{url}/metrics")).text
            return [r.json() for r in replies], (await client.get(f"{url}/info")).json()["batching"], metrics

    with caplog.at_level(logging.WARNING, logger="xformopt.serve"), ServerThread(create_app(_config(gpt2))) as server:
        replies, batching, metrics = asyncio.run(ask(server.url))
    generator = TextGenerator(gpt2, threads=1)
    assert [r["choices"][0]["text"] for r in replies] == [generator.generate(p, max_new_tokens=10).text
                                                          for p in PROMPTS]
    assert batching["mode"] == "one at a time" and batching["engine"] == "single-stream"
    assert batching["max_streams"] == 1 and "GroupQueryAttention" in batching["reason"]
    assert metric(metrics, "xformopt_batch_size_sum") == metric(metrics, "xformopt_batch_size_count") > 0  # 1 row
    said = [r.getMessage() for r in caplog.records if "batching is off" in r.getMessage()]
    assert len(said) == 1 and "GroupQueryAttention" in said[0] and "\n" not in said[0]


def test_a_full_queue_is_refused_with_503_and_retry_after(gpt2):
    """One request running (slowed), one waiting (the limit): the third gets 503 + Retry-After at once,
    and the two accepted ones are answered."""
    from xformopt.runtime.serial_decoder import SerialDecoder

    config = _config(gpt2, max_waiting=1)
    body = {"prompt": "The film", "max_tokens": 40, "temperature": 0, "ignore_eos": True}

    async def scenario(url):
        async with httpx.AsyncClient(timeout=120) as client:
            first = asyncio.create_task(client.post(f"{url}/v1/completions", json=body))
            while metric((await client.get(f"{url}/metrics")).text, "xformopt_decoder_running_sequences") < 1:
                await asyncio.sleep(0.02)
            second = asyncio.create_task(client.post(f"{url}/v1/completions", json=body))
            while metric((await client.get(f"{url}/metrics")).text, "xformopt_decoder_waiting_sequences") < 1:
                await asyncio.sleep(0.02)
            third = await client.post(f"{url}/v1/completions", json=body)
            return await first, await second, third

    app = create_app(config, engine_factory=slow_engine_factory(0.05, SerialDecoder))
    with ServerThread(app) as server:
        first, second, third = asyncio.run(scenario(server.url))
    assert third.status_code == 503 and third.headers["Retry-After"] and third.json()["error_type"] == "Overloaded"
    assert [r.status_code for r in (first, second)] == [200, 200]
    assert first.json()["choices"][0]["text"] == second.json()["choices"][0]["text"]


def test_require_batching_refuses_in_one_line_before_it_binds(gpt2, capsys):
    code, _, err = run_cli(["serve", str(gpt2), "--port", str(free_port()), "--require-batching"], capsys)
    assert code == 2 and len(error_lines(err)) == 1 and "GroupQueryAttention" in err, err


SIGTERM_SERVER = """
import sys
sys.path.insert(0, sys.argv[4])
from decoder_serve_helpers import slow_engine_factory
from xformopt.runtime.padded_batch_decoder import PaddedBatchDecoder
from xformopt.serve import server
from xformopt.serve.app import ServeConfig, create_app
from xformopt.serve.decoder_scheduler import DecoderSettings
config = ServeConfig(sys.argv[1], threads=1, decoder=DecoderSettings(max_streams=1, drain_s=float(sys.argv[3])))
sys.exit(0 if server.run(create_app(config, engine_factory=slow_engine_factory(0.05, PaddedBatchDecoder)), "127.0.0.1",
                         int(sys.argv[2]), drain_s=float(sys.argv[3])) else 1)
"""


def _wait_healthy(url: str, process) -> None:
    for _ in range(1200):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.1)
    raise AssertionError("the server did not become healthy")


def test_sigterm_ends_the_running_request_cleanly_and_refuses_the_waiting_one(qwen):
    """Qwen3.5, one stream at a time (--max-batch 1). One stream running (100 tokens at >= 50 ms a step
    outlast the 2 s drain) and one request waiting at SIGTERM: the stream ends at the drain with finish_reason "length", its usage and [DONE]; the waiting
    request gets 503 + Retry-After (nothing was sent to it); a new request during the drain gets 503; exit 0."""
    port, drain, tokens = free_port(), 2.0, 100
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen([sys.executable, "-c", SIGTERM_SERVER, str(qwen), str(port), str(drain),
                                str(Path(__file__).resolve().parents[1])], env=env, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    base = {"prompt": "The film", "temperature": 0, "ignore_eos": True}

    async def scenario():
        async with httpx.AsyncClient(timeout=120) as client:
            events, started = [], asyncio.Event()

            async def stream():
                body = {**base, "max_tokens": tokens, "stream": True, "stream_options": {"include_usage": True}}
                async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
                    assert r.status_code == 200
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
                            started.set()

            running = asyncio.create_task(stream())
            await started.wait()
            waiting = asyncio.create_task(client.post(f"{url}/v1/completions", json={**base, "max_tokens": 3}))
            while metric((await client.get(f"{url}/metrics")).text, "xformopt_decoder_waiting_sequences") < 1:
                await asyncio.sleep(0.02)
            process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            async with httpx.AsyncClient(timeout=10) as fresh:
                during = await fresh.post(f"{url}/v1/completions", json={**base, "max_tokens": 3})
            await running
            return events, await waiting, during

    try:
        _wait_healthy(url, process)
        events, waited, during = asyncio.run(scenario())
        assert process.wait(timeout=120) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert during.status_code == 503 and during.headers["connection"] == "close"
    assert events[-1] == "[DONE]"
    finishes = [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"]]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert 0 < events[-2]["usage"]["completion_tokens"] < tokens
    assert waited.status_code == 503 and waited.headers["Retry-After"]
