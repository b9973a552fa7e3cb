"""`xformopt serve` for decoders: continuous batching on a tiny int4 GroupQueryAttention decoder, real uvicorn
servers on free ports, real clients (httpx and the OpenAI client).

The correctness proof of the per-sequence KV handling: every answer decoded in a batch, whatever joined or
left it meanwhile, equals the artifact's own single-stream generation (greedy, and seeded sampling). The
other tests check what a client sees: OpenAI's streaming format, a disconnect freeing its row, the queue
and KV bounds (503 with Retry-After, never unbounded growth), and SIGTERM ending every stream cleanly. No
test asserts a wall-clock time; where a stream must outlast something, the engine's steps are slowed to a
known minimum (decoder_serve_helpers.SlowEngine), so the order of events does not depend on the host.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from decoder_serve_helpers import CONTEXT, build_served_decoder, slow_engine_factory, sse_events
from serve_helpers import ServerThread, free_port, metric

from xformopt.serve.app import ServeConfig, create_app
from xformopt.serve.decoder_scheduler import DecoderSettings

pytestmark = pytest.mark.extra("genai")


@pytest.fixture(scope="module")
def served_decoder(tmp_path_factory, sample_texts) -> Path:
    return build_served_decoder(tmp_path_factory.mktemp("served-decoder"), sample_texts)


@pytest.fixture(scope="module")
def generator(served_decoder):
    from xformopt.decoder.generator import TextGenerator

    return TextGenerator(served_decoder, threads=1)


def _config(artifact, **decoder) -> ServeConfig:
    return ServeConfig(str(artifact), threads=1, model_name="tiny", decoder=DecoderSettings(**decoder))


def _prompts(texts: list[str]) -> list[str]:
    """Real texts cut to mixed lengths (a few tokens to a few hundred)."""
    cuts = [12, 300, 40, 900, 25, 160, 600, 70]
    return [" ".join(texts[i:i + 8])[:n] for i, n in enumerate(cuts)]


# --------------------------------------------------------------------------- the engine


def test_batched_greedy_equals_single_stream_through_joins_leaves_and_chunked_prompts(served_decoder, generator,
                                                                                      sample_texts):
    from xformopt.decoder.generate import generate
    from xformopt.runtime.batch_decoder import BatchDecoder

    prompts = [list(generator.tokenizer(t)["input_ids"]) for t in _prompts(sample_texts)]
    new = [30, 6, 17, 25, 3, 12, 9, 21]
    arrive = [0, 0, 1, 3, 3, 6, 8, 12]  # the step each sequence arrives at
    # the artifact's own single-stream greedy decoding (OrtDecoder, one sequence per call)
    expected = [generate(generator.runner, p, n).new_ids for p, n in zip(prompts, new)]
    bound = 3 * 256  # at most 3 rows of 256 positions: some arrivals must wait for a row to free
    engine = BatchDecoder(served_decoder, threads=1, max_kv_tokens=bound, max_rows=4)
    assert engine.last_position_logits  # the head reads the last position only (runtime/last_logits.py)
    got: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    waiting, reading, decoding = list(range(len(prompts))), {}, {}
    chunk, step, widths, waited = 32, 0, set(), set()
    while waiting or reading or decoding:
        for i in [i for i in waiting if arrive[i] <= step]:
            if waiting[0] != i or not engine.fits(len(prompts[i]) + new[i]):
                waited.add(i)
                break
            waiting.remove(i)
            reading[i] = [engine.open(len(prompts[i]) + new[i]), 0]
        for i, (slot, done) in list(reading.items())[:1]:  # one prompt chunk per step
            logits = engine.prefill(slot, prompts[i][done:done + chunk])
            reading[i][1] += chunk
            if reading[i][1] >= len(prompts[i]):
                del reading[i]
                got[i].append(int(np.argmax(logits)))
                engine.start_decoding(slot)
                decoding[i] = slot
        finished = [i for i, s in decoding.items() if len(got[i]) >= new[i]]
        for i in finished:
            engine.close(decoding.pop(i))
        if decoding:
            order = sorted(decoding, key=lambda i: decoding[i].row)
            assert [decoding[i] for i in order] == engine.decoding
            widths.add(len(order))
            for i, row in zip(order, engine.decode([got[i][-1] for i in order])):
                got[i].append(int(np.argmax(row)))
        assert engine.allocated_positions <= bound and engine.cached_positions <= engine.allocated_positions
        step += 1
    assert [got[i][:new[i]] for i in range(len(prompts))] == expected
    assert max(widths) >= 3 and waited  # batches of several rows, and arrivals that had to wait for room
    assert engine.calls["prefill"] > len(prompts)  # long prompts were read in chunks


# --------------------------------------------------------------------------- through the server


def test_served_answers_equal_single_stream_whatever_joins_or_leaves(served_decoder, generator, sample_texts):
    prompts = _prompts(sample_texts)
    new = [24, 8, 40, 16, 30, 5, 20, 12]
    sampled = {3: dict(temperature=0.8, top_p=0.9, seed=7), 6: dict(temperature=1.2, seed=11)}
    app = create_app(_config(served_decoder, max_streams=4, max_kv_tokens=4096),
                     engine_factory=slow_engine_factory(0.01))  # steps of >= 10 ms: the requests overlap

    async def ask(client, url, i):
        await asyncio.sleep(0.03 * i)  # staggered arrivals: each joins a batch already decoding
        body = {"prompt": prompts[i], "max_tokens": new[i], "temperature": 0, **sampled.get(i, {})}
        if i % 2:
            body.update(stream=True, stream_options={"include_usage": True})
            text, finish, usage = "", None, None
            async with client.stream("POST", f"{url}/v1/completions", json=body) as reply:
                assert reply.status_code == 200
                async for line in reply.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        event = json.loads(line[6:])
                        if event["choices"]:
                            text += event["choices"][0]["text"]
                            finish = event["choices"][0]["finish_reason"] or finish
                        usage = event.get("usage") or usage
            return text, finish, usage["completion_tokens"]
        reply = await client.post(f"{url}/v1/completions", json=body)
        assert reply.status_code == 200, reply.text
        answer = reply.json()
        return answer["choices"][0]["text"], answer["choices"][0]["finish_reason"], answer["usage"]["completion_tokens"]

    async def all_of(url):
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(ask(client, url, i) for i in range(len(prompts))))

    with ServerThread(app) as server:
        answers = asyncio.run(all_of(server.url))
        page = httpx.get(f"{server.url}/metrics").text
    for i, (text, finish, tokens) in enumerate(answers):
        options = {k: v for k, v in sampled.get(i, {}).items()}
        alone = generator.generate(prompts[i], max_new_tokens=new[i], **options)
        assert text == alone.text, i
        assert tokens == len(alone.generation.new_ids)
        assert finish == ("stop" if alone.generation.stopped == "eos" else "length")
    calls = metric(page, "xformopt_batch_size_count")
    assert metric(page, "xformopt_batch_size_sum") > calls  # decode steps ran several sequences together
    generated = sum(tokens for _, _, tokens in answers)
    assert metric(page, "xformopt_decoder_generated_tokens_total") == generated
    assert metric(page, "xformopt_decoder_time_to_first_token_seconds_count") == len(prompts)
    assert metric(page, "xformopt_decoder_inter_token_seconds_count") == generated - len(prompts)
    assert metric(page, "xformopt_decoder_kv_tokens") == 0  # every row freed
    assert metric(page, "xformopt_decoder_running_sequences") == 0
    assert metric(page, "xformopt_decoder_kv_tokens_allocated") <= 4096


def test_openai_client_streams_a_chat_completion_unchanged(served_decoder, generator):
    openai = pytest.importorskip("openai")
    with ServerThread(create_app(_config(served_decoder))) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
        assert [m.id for m in client.models.list()] == ["tiny"]
        question = [{"role": "user", "content": "Was the movie any good?"}]
        pieces, finish, usage = [], None, None
        stream = client.chat.completions.create(model="tiny", messages=question, max_tokens=24, temperature=0,
                                                stream=True, stream_options={"include_usage": True})
        for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
            usage = chunk.usage or usage
        whole = client.chat.completions.create(model="tiny", messages=question, max_tokens=24, temperature=0)
    alone = generator.generate(chat="Was the movie any good?", max_new_tokens=24)
    assert "".join(pieces) == whole.choices[0].message.content == alone.text
    assert finish == whole.choices[0].finish_reason and len(pieces) >= 2
    assert usage.completion_tokens == whole.usage.completion_tokens == len(alone.generation.new_ids)
    assert usage.prompt_tokens == len(alone.generation.prompt_ids)


def test_inference_client_chat_completion_unchanged(served_decoder, generator, monkeypatch):
    """huggingface_hub's InferenceClient (the `clients` extra) appends /v1/chat/completions to the base URL."""
    import huggingface_hub as hub
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)  # the suite's offline switch refuses local URLs too
    with ServerThread(create_app(_config(served_decoder))) as server:
        client = hub.InferenceClient(base_url=server.url, api_key="unused")
        question = [{"role": "user", "content": "Was the movie any good?"}]
        whole = client.chat_completion(question, max_tokens=24, temperature=0)
        pieces = [c.choices[0].delta.content or "" for c in client.chat_completion(question, max_tokens=24,
                                                                                     temperature=0, stream=True)
                  if c.choices]
    alone = generator.generate(chat="Was the movie any good?", max_new_tokens=24)
    assert whole.choices[0].message.content == "".join(pieces) == alone.text


def test_stop_strings_end_the_answer_before_them(served_decoder, generator, sample_texts):
    prompt = sample_texts[1][:200]
    alone = generator.generate(prompt, max_new_tokens=40, stop_at_eos=False).text
    stop = alone[len(alone) // 2: len(alone) // 2 + 3]
    assert stop.strip()
    with ServerThread(create_app(_config(served_decoder))) as server:
        body = {"prompt": prompt, "max_tokens": 40, "temperature": 0, "stop": [stop], "ignore_eos": True}
        whole = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
        with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True}, timeout=60) as reply:
            events = list(sse_events(reply))
    assert whole["choices"][0]["text"] == alone[: alone.index(stop)]
    assert whole["choices"][0]["finish_reason"] == "stop"
    streamed = "".join(e["choices"][0]["text"] for e in events[:-1])
    assert streamed == whole["choices"][0]["text"] and events[-1] == "[DONE]"


def test_a_client_that_disconnects_mid_stream_frees_its_slot(served_decoder):
    app = create_app(_config(served_decoder, max_streams=1, max_kv_tokens=2048), engine_factory=slow_engine_factory(0.02))
    long_body = {"prompt": "The film", "max_tokens": 500, "temperature": 0, "ignore_eos": True, "stream": True}
    with ServerThread(app) as server:
        with httpx.stream("POST", f"{server.url}/v1/completions", json=long_body, timeout=60) as reply:
            events = sse_events(reply)
            [next(events) for _ in range(3)]  # three tokens in, then the client goes away
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            page = httpx.get(f"{server.url}/metrics").text
            if metric(page, "xformopt_decoder_finished_total", reason="cancelled") == 1:
                break
            time.sleep(0.05)
        assert metric(page, "xformopt_decoder_running_sequences") == 0
        assert metric(page, "xformopt_decoder_generated_tokens_total") < 500  # it stopped decoding early
        # the only row is free again: the next request is served
        reply = httpx.post(f"{server.url}/v1/completions", json={"prompt": "A plot", "max_tokens": 4,
                                                                 "temperature": 0, "ignore_eos": True}, timeout=60)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4


def test_queue_and_kv_bounds_refuse_with_503_or_422_and_never_grow(served_decoder):
    # two rows allowed, but the KV bound holds one 600-position reservation at a time
    app = create_app(_config(served_decoder, max_streams=2, max_waiting=1, max_kv_tokens=1000),
                     engine_factory=slow_engine_factory(0.02))
    body = {"prompt": "The film", "max_tokens": 590, "temperature": 0, "ignore_eos": True, "stream": True}
    with ServerThread(app) as server:
        url = server.url

        def page():
            return httpx.get(f"{url}/metrics").text

        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as first:
            events = sse_events(first)  # kept: a generator collected early would close the stream
            next(events)

            async def second_and_third():
                async with httpx.AsyncClient(timeout=60) as client:
                    waiting = asyncio.create_task(client.post(f"{url}/v1/completions", json={**body, "stream": False,
                                                                                             "max_tokens": 3}))
                    while metric(page(), "xformopt_decoder_waiting_sequences") < 1:
                        await asyncio.sleep(0.02)
                    assert metric(page(), "xformopt_decoder_running_sequences") == 1  # the KV bound holds it back
                    refused = await client.post(f"{url}/v1/completions", json={**body, "stream": False})
                    waiting.cancel()
                    return refused

            refused = asyncio.run(second_and_third())
        assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error_type"] == "Overloaded"
        too_long = httpx.post(f"{url}/v1/completions", json={**body, "max_tokens": 999, "stream": False}, timeout=60)
        assert too_long.status_code == 422 and "KV bound" in too_long.json()["error"]
        assert metric(page(), "xformopt_decoder_kv_tokens_allocated") <= 1000
        assert metric(page(), "xformopt_decoder_rejected_total", why="queue_full") == 1


def test_bad_requests_get_one_json_error_line(served_decoder):
    with ServerThread(create_app(_config(served_decoder))) as server:
        def post(path, body):
            return httpx.post(f"{server.url}{path}", json=body, timeout=30)

        chat = {"messages": [{"role": "user", "content": "hi"}]}
        cases = [
            ("/v1/chat/completions", {**chat, "n": 2}, "n"),
            ("/v1/chat/completions", {"messages": []}, "messages"),
            ("/v1/chat/completions", {**chat, "temperature": 3}, "temperature"),
            ("/v1/chat/completions", {**chat, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
            ("/v1/chat/completions", {**chat, "tools": []}, "tools"),
            ("/v1/chat/completions", {**chat, "frequency_penalty": 0.5}, "frequency_penalty"),
            ("/v1/completions", {"prompt": "   "}, "empty"),
            ("/v1/completions", {"prompt": ["a", "b"]}, "one prompt"),
            ("/v1/completions", {"prompt": "The film", "max_tokens": CONTEXT}, "context window"),
            ("/v1/completions", {"prompt": [10 ** 7]}, "token ids"),
        ]
        for path, body, words in cases:
            reply = post(path, body)
            assert reply.status_code == 422, (body, reply.text)
            assert words in reply.json()["error"] and reply.json()["error_type"] == "Validation"
        info = httpx.get(f"{server.url}/info").json()
        assert info["task"] == "text-generation" and info["max_tokens"] == CONTEXT
        assert info["settings"]["decoder"]["max_kv_tokens"] == 8192


SIGTERM_SERVER = """
import sys
sys.path.insert(0, sys.argv[4])
from decoder_serve_helpers import slow_engine_factory
from xformopt.serve import server
from xformopt.serve.app import ServeConfig, create_app
from xformopt.serve.decoder_scheduler import DecoderSettings
config = ServeConfig(sys.argv[1], threads=1, decoder=DecoderSettings(max_streams=2, max_kv_tokens=4096,
                                                                     drain_s=float(sys.argv[3])))
sys.exit(0 if server.run(create_app(config, engine_factory=slow_engine_factory(0.02)), "127.0.0.1",
                         int(sys.argv[2]), drain_s=float(sys.argv[3])) else 1)
"""


def test_sigterm_finishes_or_cleanly_ends_the_streams_in_flight_and_exits_0(served_decoder):
    """Two streams decoding and one request waiting at SIGTERM: the short stream finishes, the long one (it
    needs >= 20 s at 20 ms a step) is ended at the 4 s drain with finish_reason and [DONE], the waiting one
    gets 503 (nothing was sent to it yet), and the server exits 0 (server.run: uvicorn and the drain hook).
    Readiness-first: during the drain /health says 503 and a new request is still answered (503), not reset."""
    port, drain = free_port(), 4.0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen([sys.executable, "-c", SIGTERM_SERVER, str(served_decoder), str(port), str(drain),
                                str(Path(__file__).resolve().parents[1])], env=env, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None, process.stderr.read()
            time.sleep(0.1)
        base = {"prompt": "The film", "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        long_tokens = CONTEXT - 10

        async def stream(client, max_tokens, started: asyncio.Event):
            events = []
            async with client.stream("POST", f"{url}/v1/completions", json={**base, "max_tokens": max_tokens}) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
                        started.set()
            return events

        async def scenario():
            async with httpx.AsyncClient(timeout=120) as client:
                flags = [asyncio.Event(), asyncio.Event()]
                streams = [asyncio.create_task(stream(client, n, f)) for n, f in zip((long_tokens, 20), flags)]
                await asyncio.gather(*(f.wait() for f in flags))
                waiting = asyncio.create_task(client.post(f"{url}/v1/completions", json={**base, "stream": False,
                                                                                          "max_tokens": 3}))
                while metric((await client.get(f"{url}/metrics")).text, "xformopt_decoder_waiting_sequences") < 1:
                    await asyncio.sleep(0.02)
                process.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.5)
                async with httpx.AsyncClient(timeout=10) as fresh:  # a new connection during the drain
                    during = [await fresh.get(f"{url}/health"),
                              await fresh.post(f"{url}/v1/completions", json={**base, "stream": False, "max_tokens": 3})]
                return await asyncio.gather(*streams), await waiting, during

        (long_events, short_events), waited, during = asyncio.run(scenario())
        assert [r.status_code for r in during] == [503, 503] and during[1].headers["connection"] == "close"
        assert process.wait(timeout=120) == 0
        for events, tokens, cut in ((short_events, 20, False), (long_events, long_tokens, True)):
            assert events[-1] == "[DONE]"
            finishes = [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"]]
            assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
            usage = events[-2]["usage"]
            assert (usage["completion_tokens"] < tokens) if cut else (usage["completion_tokens"] == tokens)
        assert waited.status_code == 503 and waited.headers["Retry-After"]
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health", timeout=2)
    finally:
        if process.poll() is None:
            process.kill()


# --------------------------------------------------------------------------- text held back while streaming


def test_incremental_text_holds_back_stop_prefixes_and_split_characters(generator):
    from xformopt.serve.decoder_text import IncrementalText

    tokenizer = generator.tokenizer
    ids = list(tokenizer("The movie was great. END of story")["input_ids"])
    stream = IncrementalText(tokenizer, ["END"])
    sent = "".join(stream.add(ids[:k]) for k in range(1, len(ids) + 1) if stream.stop_hit is None)
    assert sent == "The movie was great. " and stream.stop_hit == "END"
    plain = IncrementalText(tokenizer)
    emoji = list(tokenizer("café ☕ ok")["input_ids"])
    pieces = [plain.add(emoji[:k]) for k in range(1, len(emoji) + 1)] + [plain.flush()]
    assert "".join(pieces) == "café ☕ ok" and not any("\ufffd" in p for p in pieces)


def test_loadtest_streams_against_the_served_decoder_reads_its_decode_calls(served_decoder):
    from xformopt.loadtest.run import Target
    from xformopt.loadtest.stream_ladder import StreamOptions, run_streams

    step = 0.01
    app = create_app(_config(served_decoder, max_streams=4), engine_factory=slow_engine_factory(step))
    with ServerThread(app) as server:
        options = StreamOptions(streams=[1, 3], duration_s=1.0, warmup_s=0.2, max_tokens=12, prompt_chars=200)
        document = run_streams([Target(server.url, "tiny")], ["A fine film with a slow middle and a good end."],
                               options)
    for level in document["targets"][0]["levels"]:
        assert not level["errors"] and level["completion_tokens"] == 12 * level["ok"]
        assert 1 <= level["mean_decode_batch"] <= level["streams"]
        # each decode call takes >= step: inside them, never more than (rows per call) / step tokens/s
        assert 0 < level["server_decode_tokens_per_s"] <= level["mean_decode_batch"] / step + 1e-6
        assert level["stream_decode_tokens_per_s"] <= 1.1 / step  # its gaps add up to about a step each (client-timed)
