"""`xformopt serve`: a real uvicorn server on a free local port and a real HTTP client (httpx; the
OpenAI client where it is installed). Answers under concurrency equal the artifact's own unbatched
outputs, in order; overload, deadlines, failing batches, bad inputs, auth, caching and SIGTERM."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
from serve_helpers import ServerThread, free_port, metric, slowed_factory

from xformopt.runtime.predictor import load_predictor
from xformopt.serve.app import ServeConfig, create_app
from xformopt.serve.scheduler import Settings, length_groups

KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def embedder_server(served_embedder):
    config = ServeConfig(str(served_embedder), threads=1, api_key=KEY, max_inputs=64, model_name="tiny")
    with ServerThread(create_app(config)) as server:
        yield server


@pytest.fixture(scope="module")
def classifier_server(served_classifier):
    # max_queue_s=0: the burst tests below send hundreds at once and check answers, not admission
    config = ServeConfig(str(served_classifier), threads=1, scheduler=Settings(max_batch=16, max_wait_ms=10,
                                                                               max_queue_s=0),
                         max_body_bytes=4096, max_inputs=8)
    with ServerThread(create_app(config)) as server:
        yield server


def test_embeddings_routes_speak_openai_and_tei(embedder_server, served_embedder, sample_texts):
    want = load_predictor(served_embedder).embed(sample_texts[:5], batch_size=1)
    url = embedder_server.url
    r = httpx.post(f"{url}/v1/embeddings", json={"input": sample_texts[:5], "model": "m"}, headers=AUTH)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "m" and body["usage"]["prompt_tokens"] > 5
    assert [d["index"] for d in body["data"]] == list(range(5)) and body["data"][0]["object"] == "embedding"
    np.testing.assert_allclose(np.array([d["embedding"] for d in body["data"]]), want, atol=1e-5)
    r = httpx.post(f"{url}/v1/embeddings", json={"input": sample_texts[0], "encoding_format": "base64"}, headers=AUTH)
    vector = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vector, want[0], atol=1e-5)
    r = httpx.post(f"{url}/embed", json={"inputs": sample_texts[:2], "normalize": False}, headers=AUTH)
    raw = np.array(r.json())
    assert raw.shape == want[:2].shape and not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), want[:2], atol=1e-5)
    long_text = " ".join(["film"] * 80)
    assert httpx.post(f"{url}/embed", json={"inputs": long_text}, headers=AUTH).status_code == 200  # truncated
    r = httpx.post(f"{url}/embed", json={"inputs": long_text, "truncate": False}, headers=AUTH)
    assert r.status_code == 422 and "more than the model's 32" in r.json()["error"]
    for dims in (0, want.shape[1] + 1):  # TEI's checks; the OpenAI route's error body is TEI's there
        r = httpx.post(f"{url}/v1/embeddings", json={"input": "x", "dimensions": dims}, headers=AUTH)
        assert r.status_code == 422 and r.json()["type"] == "Validation" and "`dimensions`" in r.json()["message"]
    r = httpx.post(f"{url}/predict", json={"inputs": "x"}, headers=AUTH)  # TEI: a route for another kind of model
    assert r.status_code == 424 and r.json() == {"error": "model is not a classifier model", "error_type": "Backend"}


def test_openai_client_reads_the_embeddings_unchanged(embedder_server, served_embedder, sample_texts):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{embedder_server.url}/v1", api_key=KEY)
    result = client.embeddings.create(input=sample_texts[:3], model="tiny")  # the client asks for base64
    got = np.array([d.embedding for d in result.data])
    np.testing.assert_allclose(got, load_predictor(served_embedder).embed(sample_texts[:3], batch_size=1), atol=1e-5)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{embedder_server.url}/v1", api_key="wrong").embeddings.create(input="x", model="tiny")


def test_auth_health_info_metrics_and_openapi(embedder_server):
    url = embedder_server.url
    assert httpx.get(f"{url}/health").status_code == 200  # open: load balancers probe it
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {KEY}"}):
        r = httpx.post(f"{url}/embed", json={"inputs": "x"}, headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer" and "API key" in r.json()["error"]
    info = httpx.get(f"{url}/info", headers=AUTH).json()
    assert info["task"] == "feature-extraction" and info["model"] == "tiny" and info["max_tokens"] == 32
    assert info["settings"]["auth"] is True and KEY not in json.dumps(info)
    batching = info["batching"]  # no flags: measured at start-up, the timings shown
    assert batching["source"] == {"max_batch": "measured", "max_wait_ms": "measured"}
    assert str(batching["max_batch"]) in batching["session_call_ms"] and batching["max_wait_ms"] > 0
    page = httpx.get(f"{url}/metrics", headers=AUTH).text
    assert metric(page, "xformopt_requests_total", route="/embed", status="401") >= 3
    schema = httpx.get(f"{url}/openapi.json", headers=AUTH).json()
    assert {"/v1/embeddings", "/embed", "/health", "/info", "/metrics"} <= set(schema["paths"])
    ref = schema["paths"]["/v1/embeddings"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    fields = schema["components"]["schemas"][ref.rsplit("/", 1)[-1]]["properties"]
    assert {"input", "model", "encoding_format", "dimensions"} <= set(fields)
    assert fields["encoding_format"]["enum"] == ["float", "base64"]


def test_hundreds_of_concurrent_requests_get_their_own_answers_in_order(classifier_server, served_classifier,
                                                                         test_rows):
    texts = [r["text"] for r in test_rows[:120]]
    alone = load_predictor(served_classifier)
    rng = random.Random(0)
    requests = [[rng.choice(texts) for _ in range(rng.choice((1, 3, 4)))] for _ in range(300)]  # two texts: a pair
    requests += [[t] for t in texts]  # every text at least once

    async def fire():
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=200)) as client:
            return await asyncio.gather(*(client.post(f"{classifier_server.url}/predict", json={"inputs": r})
                                          for r in requests))

    before = httpx.get(f"{classifier_server.url}/metrics").text
    replies = asyncio.run(fire())
    assert [r.status_code for r in replies] == [200] * len(requests)
    reference = {t: alone.predict([t], batch_size=1)[0] for t in texts}
    for sent, reply in zip(requests, replies):
        got = reply.json()
        assert len(got) == len(sent)
        for text, answer in zip(sent, got):
            assert [a["label"] for a in answer] == [a["label"] for a in reference[text]]
            assert [a["score"] for a in answer] == pytest.approx([a["score"] for a in reference[text]], abs=1e-5)
    page = httpx.get(f"{classifier_server.url}/metrics").text
    calls = metric(page, "xformopt_batch_size_count") - metric(before, "xformopt_batch_size_count")
    rows = metric(page, "xformopt_batch_size_sum") - metric(before, "xformopt_batch_size_sum")
    assert 0 < calls and rows / calls > 1.0  # batched: fewer session calls than rows
    assert metric(page, "xformopt_cache_total", result="hit") > 0  # repeated texts came from the cache


def test_bad_inputs_get_one_json_error_line(classifier_server):
    url = f"{classifier_server.url}/predict"
    cases = [
        (dict(content=b"{not json", headers={"content-type": "application/json"}), 400, "not valid JSON"),
        (dict(json=[1, 2]), 400, "JSON object"),
        (dict(json={"inputs": 3}), 422, "inputs"),
        (dict(json={"inputs": ["ok"], "extra": 1}), 422, "extra"),
        (dict(json={"inputs": ["ok"], "raw_scores": "yes"}), 422, "raw_scores"),
        (dict(json={"inputs": []}), 400, "cannot be empty"),  # TEI: an empty batch is 400
        (dict(json={"inputs": ["fine", " "] + ["x"]}), 422, "input 1 is empty"),
        (dict(json={"inputs": ["x"] * 9}), 422, "more than the limit of 8"),
        (dict(json={"inputs": ["film " * 200], "truncate": False}), 422, "tokens, more than the model's"),
        (dict(json={"inputs": ["x" * 5000]}), 413, "over 4096 bytes"),
    ]
    for kwargs, status, words in cases:
        r = httpx.post(url, **kwargs)
        assert r.status_code == status, (kwargs, r.text)
        body = r.json()
        assert set(body) == {"error", "error_type"} and words in body["error"] and "\n" not in body["error"]
        assert "Traceback" not in r.text
    pair = httpx.post(url, json={"inputs": ["a good film", "a bad film"]}).json()
    assert isinstance(pair[0], dict)  # TEI: two texts are one (text, text_pair) input
    batch = httpx.post(url, json={"inputs": [["a good film", "a bad film"], "a good film"]}).json()
    assert batch[0] == pair and isinstance(batch[1], list) and batch[1] != pair
    info = httpx.get(f"{classifier_server.url}/info").json()["batching"]
    assert info["source"] == {"max_batch": "flag", "max_wait_ms": "flag"} and info["max_batch"] == 16


def test_result_cache_hits_and_cache_size_zero_turns_it_off(classifier_server, served_classifier):
    url = classifier_server.url
    page = httpx.get(f"{url}/metrics").text
    hits = metric(page, "xformopt_cache_total", result="hit")
    first = httpx.post(f"{url}/predict", json={"inputs": ["a unique text for the cache test"]}).json()
    again = httpx.post(f"{url}/predict", json={"inputs": ["a unique text for the cache test"]}).json()
    assert again == first
    assert metric(httpx.get(f"{url}/metrics").text, "xformopt_cache_total", result="hit") == hits + 1
    config = ServeConfig(str(served_classifier), threads=1, scheduler=Settings(cache_size=0))
    with ServerThread(create_app(config)) as server:
        for _ in range(2):
            httpx.post(f"{server.url}/predict", json={"inputs": ["same"]})
        page = httpx.get(f"{server.url}/metrics").text
        assert metric(page, "xformopt_cache_total", result="hit") == 0
        assert metric(page, "xformopt_tokenization_cache_total", result="hit") == 0


def test_overload_answers_every_request_with_200_or_429(served_classifier):
    config = ServeConfig(str(served_classifier), threads=1,
                         scheduler=Settings(max_batch=4, max_wait_ms=1, max_queue=8, cache_size=0))
    with ServerThread(create_app(config, slowed_factory(seconds=0.05))) as server:
        async def fire():
            async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=300)) as client:
                return await asyncio.gather(*(client.post(f"{server.url}/predict", json={"inputs": [f"text {i}"]})
                                              for i in range(200)))

        replies = asyncio.run(fire())
        statuses = [r.status_code for r in replies]
        assert set(statuses) <= {200, 429} and statuses.count(200) >= 8 and statuses.count(429) > 0  # TEI's 429
        refused = [r for r in replies if r.status_code == 429]
        assert all(int(r.headers["retry-after"]) >= 1 and r.json()["error_type"] == "Overloaded" for r in refused)
        page = httpx.get(f"{server.url}/metrics").text
        assert metric(page, "xformopt_queue_depth") == 0
        assert httpx.post(f"{server.url}/predict", json={"inputs": ["after"]}).status_code == 200


def test_the_queue_holds_at_most_max_queue_s_of_work_at_the_measured_rate(served_classifier):
    """A long queue (max_queue 1024) still refuses once the waiting inputs are more than max_queue_s of work
    at the rate batches run (here 1 input per 50 ms call: 0.2 s is about 4 inputs), so an overload leaves a
    short backlog; every request gets 200 or 429."""
    config = ServeConfig(str(served_classifier), threads=1,
                         scheduler=Settings(max_batch=1, max_wait_ms=0, max_queue=1024, max_queue_s=0.2, cache_size=0))
    with ServerThread(create_app(config, slowed_factory(seconds=0.05))) as server:
        async def fire():
            async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=100)) as client:
                first = await client.post(f"{server.url}/predict", json={"inputs": ["measure the rate"]})
                rest = await asyncio.gather(*(client.post(f"{server.url}/predict", json={"inputs": [f"text {i}"]})
                                              for i in range(60)))
                return [first, *rest]

        statuses = [r.status_code for r in asyncio.run(fire())]
        assert set(statuses) <= {200, 429} and statuses[0] == 200
        assert statuses.count(429) > 0 and statuses.count(200) >= 4  # refused long before 1024 were queued


def test_deadline_gives_504_and_a_failing_batch_424_while_serving_goes_on(served_classifier):
    """Each call takes 0.5 s, the deadline is 0.2 s: the first request is admitted (nothing ahead of it) and
    times out (504); the two sent while it runs are refused at once (429: 0.5 s of work ahead of them, more
    than their deadline), not left to time out."""
    config = ServeConfig(str(served_classifier), threads=1,
                         scheduler=Settings(max_batch=1, max_wait_ms=0, timeout_s=0.2, cache_size=0))
    with ServerThread(create_app(config, slowed_factory(seconds=0.5, fail_on="boom"))) as server:
        async def fire():
            async with httpx.AsyncClient(timeout=30) as client:
                first = asyncio.create_task(client.post(f"{server.url}/predict", json={"inputs": ["slow one"]}))
                await asyncio.sleep(0.1)
                started = time.monotonic()
                behind = await asyncio.gather(*(client.post(f"{server.url}/predict", json={"inputs": [t]})
                                                for t in ("slow two", "boom")))
                return [await first, *behind], time.monotonic() - started

        replies, behind_s = asyncio.run(fire())
        assert replies[0].status_code == 504 and replies[0].json()["error_type"] == "Timeout"
        assert [r.status_code for r in replies[1:]] == [429, 429] and behind_s < 0.2
        assert all(r.json()["error_type"] == "Overloaded" and int(r.headers["retry-after"]) >= 1 for r in replies[1:])
    config = ServeConfig(str(served_classifier), threads=1, scheduler=Settings(max_batch=8, cache_size=0))
    with ServerThread(create_app(config, slowed_factory(fail_on="boom"))) as server:
        r = httpx.post(f"{server.url}/predict", json={"inputs": ["boom"]})
        assert r.status_code == 424 and r.json()["error_type"] == "Backend" and "injected failure" in r.json()["error"]
        assert httpx.post(f"{server.url}/predict", json={"inputs": ["fine"]}).status_code == 200
        assert metric(httpx.get(f"{server.url}/metrics").text, "xformopt_batch_failures_total") == 1


def test_length_groups_bound_padding_and_rows():
    lengths = [5, 50, 6, 48, 7, 52, 5, 5]
    groups = length_groups(lengths, max_rows=3, max_padding=0.25)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        assert len(group) <= 3
        longest = max(lengths[i] for i in group)
        assert (longest * len(group) - sum(lengths[i] for i in group)) <= 0.25 * longest * len(group)
    assert length_groups(lengths, max_rows=1, max_padding=0.25) == [[i] for i in sorted(range(8), key=lengths.__getitem__)]


def _start_cli_server(artifact, *flags):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen([sys.executable, "-m", "xformopt.cli.app", "serve", str(artifact), "--port", str(port),
                                *flags], env=env, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.02)
    process.kill()
    raise AssertionError("the server did not become healthy")


def test_sigterm_right_after_readiness_answers_every_request_fresh_or_pooled(served_classifier, test_rows):
    """200 requests sent as /health turns 200, half on a connection each and half through a keep-alive pool
    of 16 connections (opened, then idle, before the burst: a balancer's), SIGTERM 0.2 s after readiness
    (most are still in the listen backlog or the pool's queue then). Readiness-first drain: /health says
    503 and answers carry Connection: close while requests are still answered, then the listener closes,
    exit 0, and the log has no unretrieved future. Every request on its own connection (in the backlog
    within milliseconds) is answered; a pooled one is answered, or refused a connection after the listener
    closed (on a loaded host the pool may not have sent it by then), never reset. (uvicorn's own shutdown
    closed the listener at once: the backlog's requests were reset, the pool's refused.)"""
    drain = 5
    process, url = _start_cli_server(served_classifier, "--threads", "1", "--cache-size", "0", "--drain-seconds",
                                     str(drain))
    ready = time.monotonic()
    texts = [r["text"] for r in test_rows[:400]]
    try:
        async def one(client, inputs):
            try:
                return await client.post(f"{url}/predict", json={"inputs": inputs}), time.monotonic()
            except httpx.HTTPError as exc:
                return exc, time.monotonic()

        async def scenario():
            fresh = httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=None))
            pooled = httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=16, max_keepalive_connections=16))
            async with fresh, pooled:
                opened = await asyncio.gather(*(pooled.get(f"{url}/health") for _ in range(16)))
                assert {r.status_code for r in opened} == {200}
                pending = [asyncio.create_task(one(fresh if i % 2 else pooled, texts[i * 2:i * 2 + 2]))
                           for i in range(200)]
                await asyncio.sleep(max(0.0, ready + 0.2 - time.monotonic()))
                process.send_signal(signal.SIGTERM)
                signalled = time.monotonic()
                await asyncio.sleep(0.3)
                async with httpx.AsyncClient(timeout=10) as probe:  # a new connection, during the grace period
                    health = await probe.get(f"{url}/health")
                    during = await probe.post(f"{url}/predict", json={"inputs": ["during the drain"]})
                replies = await asyncio.gather(*pending)
                return signalled, health, during, replies

        signalled, health, during, replies = asyncio.run(scenario())
        assert process.wait(timeout=60) == 0
        log = process.stderr.read()
        fresh, pooled = replies[1::2], replies[0::2]
        failed = [r for r, _ in fresh if not isinstance(r, httpx.Response)]
        assert not failed, failed[:3]  # in the backlog before SIGTERM: every one answered, none reset
        refused = [(r, t) for r, t in pooled if not isinstance(r, httpx.Response)]
        assert all(isinstance(r, httpx.ConnectError) and t >= signalled + drain for r, t in refused), refused[:3]
        answered = [r for r, _ in replies if isinstance(r, httpx.Response)]
        assert {r.status_code for r in answered} <= {200, 429, 503, 504} and len(answered) >= 100 + 16
        assert health.status_code == 503 and health.json()["error_type"] == "Unhealthy"
        assert during.status_code == 200 and during.headers["connection"] == "close"
        assert time.monotonic() - signalled >= drain  # the grace period was kept
        assert "never retrieved" not in log and "Traceback" not in log, log[-2000:]
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health", timeout=2)
    finally:
        if process.poll() is None:
            process.kill()


def test_serve_refuses_bad_setups_before_binding(tmp_path, served_classifier, capsys, monkeypatch):
    from helpers import run_cli

    from xformopt.serve.server import open_bind_warning

    code, _, err = run_cli(["serve", tmp_path / "missing"], capsys)
    assert code == 2 and "artifact not found" in err
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    code, _, err = run_cli(["serve", served_classifier, "--api-key-env", "NO_SUCH_KEY_VAR"], capsys)
    assert code == 2 and "NO_SUCH_KEY_VAR" in err
    code, _, err = run_cli(["serve", served_classifier, "--replicas", "2"], capsys)
    assert code == 2 and "--replicas needs --ray" in err
    assert "WITHOUT an API key" in open_bind_warning("0.0.0.0", has_key=False)
    assert open_bind_warning("0.0.0.0", has_key=True) is None and open_bind_warning("127.0.0.1", False) is None
    assert open_bind_warning("::1", False) is None and open_bind_warning("localhost", False) is None
