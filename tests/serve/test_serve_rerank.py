"""`xformopt serve` of a text-ranking artifact (a tiny one-output cross-encoder built in code): TEI's
``POST /rerank`` (query, texts, return_text, raw_scores, truncate), the same at ``POST /`` and
``/invocations``, ``/predict`` of pairs, batched by the scheduler, TEI's codes for bad bodies. A real uvicorn
server on a free port and a real HTTP client; every score equals ``xformopt.load``'s in-process one."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
from serve_helpers import ServerThread, metric

import xformopt
from xformopt.serve.app import ServeConfig, create_app
from xformopt.serve.scheduler import Settings


@pytest.fixture(scope="module")
def reranker(served_reranker):
    config = ServeConfig(str(served_reranker), threads=1, max_inputs=16,
                         scheduler=Settings(max_batch=16, max_wait_ms=20, cache_size=0))
    with ServerThread(create_app(config)) as server:
        yield server, xformopt.load(served_reranker)


def _scores(model, query, texts, raw=False):
    return [a[0]["score"] for a in model.predict([(query, t) for t in texts], batch_size=1, raw_scores=raw)]


def test_rerank_orders_the_passages_by_the_in_process_scores(reranker, sample_texts):
    server, model = reranker
    query, texts = sample_texts[0], sample_texts[1:7]
    want = _scores(model, query, texts)
    for path in ("/rerank", "/", "/invocations"):
        r = httpx.post(f"{server.url}{path}", json={"query": query, "texts": texts})
        assert r.status_code == 200, (path, r.text)
        ranks = r.json()
        assert [x["index"] for x in ranks] == sorted(range(len(texts)), key=lambda i: -want[i])
        assert [x["score"] for x in ranks] == pytest.approx(sorted(want, reverse=True), abs=1e-5)
        assert all(set(x) == {"index", "score"} for x in ranks)  # no text unless asked
    raw = httpx.post(f"{server.url}/rerank", json={"query": query, "texts": texts, "raw_scores": True,
                                                   "return_text": True}).json()
    logits = _scores(model, query, texts, raw=True)
    assert {x["index"]: x["score"] for x in raw} == pytest.approx(dict(enumerate(logits)), abs=1e-5)
    assert all(x["text"] == texts[x["index"]] for x in raw)
    assert want == pytest.approx(1 / (1 + np.exp(-np.array(logits))), abs=1e-6)  # the score: the logit's sigmoid


def test_predict_takes_pairs_and_concurrent_reranks_are_batched(reranker, sample_texts):
    server, model = reranker
    pair = [sample_texts[0], sample_texts[1]]
    got = httpx.post(f"{server.url}/predict", json={"inputs": pair}).json()  # TEI: two texts are one pair
    assert got[0]["score"] == pytest.approx(_scores(model, *pair[:1], pair[1:])[0], abs=1e-5)
    queries = sample_texts[10:30]

    async def fire():
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(client.post(f"{server.url}/rerank", json={"query": q, "texts": sample_texts[:4]})
                                          for q in queries))

    before = httpx.get(f"{server.url}/metrics").text
    replies = asyncio.run(fire())
    for query, reply in zip(queries, replies):
        want = _scores(model, query, sample_texts[:4])
        assert {x["index"]: x["score"] for x in reply.json()} == pytest.approx(dict(enumerate(want)), abs=1e-5)
    page = httpx.get(f"{server.url}/metrics").text
    calls = metric(page, "xformopt_batch_size_count") - metric(before, "xformopt_batch_size_count")
    rows = metric(page, "xformopt_batch_size_sum") - metric(before, "xformopt_batch_size_sum")
    assert rows == 4 * len(queries) and calls < rows  # pairs of several requests shared session calls


@pytest.mark.parametrize("body, status, kind, words", [
    ({"query": "a film", "texts": []}, 400, "Empty", "`texts` cannot be empty"),
    ({"query": "a film", "texts": ["x"] * 17}, 422, "Validation", "more than the limit of 16"),
    ({"query": "a film"}, 422, "Validation", "texts"),
    ({"query": "a film", "texts": ["ok", " "]}, 422, "Validation", "input 1 is empty"),
    ({"query": "a film", "texts": ["film " * 200], "truncate": False}, 422, "Validation", "more than the model's"),
    ({"query": "a film", "texts": ["ok"], "truncation_direction": "up"}, 422, "Validation", "truncation_direction"),
])
def test_bad_rerank_bodies_get_teis_codes(reranker, body, status, kind, words):
    server, _ = reranker
    r = httpx.post(f"{server.url}/rerank", json=body)
    assert r.status_code == status and r.json()["error_type"] == kind and words in r.json()["error"], r.text


def test_a_reranker_answers_424_on_embedding_routes_and_info_names_its_task(reranker):
    server, _ = reranker
    r = httpx.post(f"{server.url}/embed", json={"inputs": "x"})
    assert r.status_code == 424 and r.json()["error"] == "model is not an embedding model"
    assert httpx.get(f"{server.url}/info").json()["task"] == "text-ranking"
    assert httpx.post(f"{server.url}/tokenize", json={"inputs": "a film"}).status_code == 200
