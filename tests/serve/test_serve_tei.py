"""text-embeddings-inference's route set on `xformopt serve`, by task, as TEI lays it out: the main route
again at POST / and /invocations, health at GET /, /health, /ping, OpenAI's route with and without /v1,
/embed_all, /similarity, /tokenize, /decode, token-id inputs, `dimensions` (cut, then normalised), and
TEI's status codes and error bodies for bad input. A real uvicorn server on a free local port, a real
HTTP client (httpx); every answer is checked against the artifact's own in-process outputs."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from serve_helpers import ServerThread

from xformopt.runtime.predictor import load_predictor
from xformopt.serve.app import ServeConfig, create_app
from xformopt.serve.tokenizer_routes import open_tokenizer

KEY = "tei-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def matryoshka_embedder(served_embedder, tmp_path_factory):
    """The served embedder with a card declaring Matryoshka sizes and named prompts, as
    sentence-transformers writes them."""
    import shutil

    dst = tmp_path_factory.mktemp("tei") / "embedder"
    shutil.copytree(served_embedder, dst)
    (dst / "README.md").write_text('# a card\n\n```json\n{"matryoshka_dims": [64, 32, 16, 100], '
                                   '"matryoshka_weights": [1, 1, 1]}\n```\n')
    (dst / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {"query": "query: "}}))
    return dst


@pytest.fixture(scope="module")
def embedder(matryoshka_embedder):
    config = ServeConfig(str(matryoshka_embedder), threads=1, api_key=KEY, max_inputs=8, model_name="tiny")
    with ServerThread(create_app(config)) as server:
        yield server, load_predictor(matryoshka_embedder)


@pytest.fixture(scope="module")
def classifier(served_classifier):
    with ServerThread(create_app(ServeConfig(str(served_classifier), threads=1, max_inputs=8))) as server:
        yield server, load_predictor(served_classifier)


def _cos(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_health_answers_on_every_tei_path_without_a_key_but_post_root_needs_it(embedder):
    server, _ = embedder
    for path in ("/", "/health", "/ping"):
        r = httpx.get(f"{server.url}{path}")
        assert r.status_code == 200 and r.json() == {"status": "ok"}, path
    r = httpx.post(f"{server.url}/", json={"inputs": "a film"})
    assert r.status_code == 401 and r.json()["error_type"] == "Unauthorized"


def test_embedder_main_route_is_embed_at_root_and_invocations(embedder, sample_texts):
    server, predictor = embedder
    want = predictor.embed(sample_texts[:3], batch_size=1)
    for path in ("/embed", "/", "/invocations"):
        r = httpx.post(f"{server.url}{path}", json={"inputs": sample_texts[:3]}, headers=AUTH)
        assert r.status_code == 200, (path, r.text)
        np.testing.assert_allclose(np.array(r.json()), want, atol=1e-5)
    one = httpx.post(f"{server.url}/", json={"inputs": sample_texts[0]}, headers=AUTH).json()
    assert np.shape(one) == (1, want.shape[1])  # TEI: one input still answers a batch of one


def test_openai_route_with_and_without_v1_takes_texts_and_token_ids(embedder, sample_texts):
    server, predictor = embedder
    text = sample_texts[1]
    ids = predictor.tokenizer(text)["input_ids"]
    want = predictor.embed([text], batch_size=1)[0]
    for path in ("/v1/embeddings", "/embeddings"):
        for payload in (text, ids, [ids], [text, ids]):
            r = httpx.post(f"{server.url}{path}", json={"input": payload}, headers=AUTH)
            assert r.status_code == 200, (path, payload, r.text)
            for item in r.json()["data"]:
                assert _cos(item["embedding"], want) >= 0.9999  # the ids of a text embed as the text does
    r = httpx.post(f"{server.url}/embed", json={"inputs": [ids, text]}, headers=AUTH)
    assert r.status_code == 200 and all(_cos(v, want) >= 0.9999 for v in r.json())
    # the text "[2, 3]" and the ids [2, 3] are different inputs (the result cache keeps them apart)
    as_text = httpx.post(f"{server.url}/embed", json={"inputs": "[5, 6, 7]"}, headers=AUTH).json()[0]
    as_ids = httpx.post(f"{server.url}/embed", json={"inputs": [5, 6, 7]}, headers=AUTH).json()[0]
    assert _cos(as_text, as_ids) < 0.9999


def test_dimensions_cut_then_normalise_and_info_lists_the_matryoshka_sizes(embedder, sample_texts):
    server, predictor = embedder
    raw = predictor.embed(sample_texts[:2], batch_size=1, normalize=False)
    width = raw.shape[1]
    info = httpx.get(f"{server.url}/info", headers=AUTH).json()
    assert info["dimensions"] == width and info["matryoshka_dimensions"] == [64, 32, 16]  # 100 > width: dropped
    assert info["max_input_length"] == 32 and info["max_client_batch_size"] == 8 and info["model_id"] == "tiny"
    cut = raw[:, :16] / np.linalg.norm(raw[:, :16], axis=1, keepdims=True)
    r = httpx.post(f"{server.url}/v1/embeddings", json={"input": sample_texts[:2], "dimensions": 16}, headers=AUTH)
    np.testing.assert_allclose([d["embedding"] for d in r.json()["data"]], cut, atol=1e-5)
    r = httpx.post(f"{server.url}/embed", json={"inputs": sample_texts[:2], "dimensions": 16}, headers=AUTH)
    np.testing.assert_allclose(r.json(), cut, atol=1e-5)  # the model's Normalize module, after the cut
    r = httpx.post(f"{server.url}/embed", json={"inputs": sample_texts[:2], "dimensions": 16, "normalize": False},
                   headers=AUTH)
    np.testing.assert_allclose(r.json(), raw[:, :16], atol=1e-5)


def test_embed_all_similarity_and_prompts(embedder, sample_texts):
    server, predictor = embedder
    r = httpx.post(f"{server.url}/embed_all", json={"inputs": sample_texts[:2]}, headers=AUTH)
    assert r.status_code == 200
    for text, states in zip(sample_texts[:2], r.json()):
        states = np.array(states)
        assert states.shape == (len(predictor.tokenizer(text)["input_ids"]), predictor.spec.hidden_size)
        pooled = states.mean(axis=0)  # the model pools by the mean: the per-token vectors are what it pools
        assert _cos(pooled, predictor.embed([text], batch_size=1)[0]) >= 0.9999
    body = {"inputs": {"source_sentence": sample_texts[0], "sentences": sample_texts[1:4]}}
    r = httpx.post(f"{server.url}/similarity", json=body, headers=AUTH)
    vectors = predictor.embed(sample_texts[:4], batch_size=1)
    np.testing.assert_allclose(r.json(), vectors[1:] @ vectors[0], atol=1e-5)
    prompted = httpx.post(f"{server.url}/embed", json={"inputs": "a film", "prompt_name": "query"}, headers=AUTH)
    np.testing.assert_allclose(prompted.json()[0], predictor.embed(["query: a film"], batch_size=1)[0], atol=1e-5)


def test_tokenize_and_decode_answer_as_tei(embedder, matryoshka_embedder):
    server, predictor = embedder
    text = "a fine film"
    r = httpx.post(f"{server.url}/tokenize", json={"inputs": text}, headers=AUTH)
    tokens = r.json()[0]
    encoding = open_tokenizer(matryoshka_embedder).encode(text)
    assert [t["id"] for t in tokens] == encoding.ids
    assert tokens[0] == {"id": encoding.ids[0], "text": "[CLS]", "special": True, "start": None, "stop": None}
    words = [t for t in tokens if not t["special"]]
    assert words[0] == {"id": encoding.ids[1], "text": "a", "special": False, "start": 0, "stop": 1}
    assert all(t["text"] == text[t["start"]:t["stop"]] for t in words)  # ASCII: byte offsets are characters
    assert "".join(t["text"] for t in words) == text.replace(" ", "") and words[-1]["stop"] == len(text)
    plain = httpx.post(f"{server.url}/tokenize", json={"inputs": [text], "add_special_tokens": False},
                       headers=AUTH).json()[0]
    assert not any(t["special"] for t in plain) and len(plain) == len(tokens) - 2
    r = httpx.post(f"{server.url}/decode", json={"ids": encoding.ids}, headers=AUTH)
    assert r.json() == [predictor.tokenizer.decode(encoding.ids, skip_special_tokens=True)]
    r = httpx.post(f"{server.url}/decode", json={"ids": [encoding.ids, encoding.ids[1:2]],
                                                 "skip_special_tokens": False}, headers=AUTH)
    assert r.json()[0].startswith("[CLS]") and r.json()[1] == "a"


def test_truncation_direction_left_cuts_the_start_as_the_predictor_does(embedder, classifier):
    """TEI's ``truncation_direction: left`` keeps an over-long input's end: the served vector (or label) is the
    in-process one with ``truncate="left"``, which differs from the right-cut one; token ids are cut alike."""
    server, predictor = embedder
    long = "the film opens slowly " * 20 + "and the end is a triumph of wit and warmth"
    left, right = predictor.embed([long], truncate="left")[0], predictor.embed([long], truncate=True)[0]
    assert _cos(left, right) < 0.9999  # the two cuts keep different tokens
    for direction, want in (("left", left), ("Left", left), ("right", right)):
        r = httpx.post(f"{server.url}/embed", json={"inputs": long, "truncation_direction": direction}, headers=AUTH)
        assert r.status_code == 200 and _cos(r.json()[0], want) >= 0.9999, (direction, r.text)
    ids = predictor.tokenizer(long)["input_ids"]
    assert len(ids) > predictor.max_length
    cut = httpx.post(f"{server.url}/embed", json={"inputs": [ids], "truncation_direction": "left"}, headers=AUTH)
    tail = httpx.post(f"{server.url}/embed", json={"inputs": [ids[-predictor.max_length:]]}, headers=AUTH)
    head = httpx.post(f"{server.url}/embed", json={"inputs": [ids]}, headers=AUTH)
    assert _cos(cut.json()[0], tail.json()[0]) >= 0.9999 and _cos(cut.json()[0], head.json()[0]) < 0.9999
    server, predictor = classifier
    want = predictor.predict([long], truncate="left")[0]
    r = httpx.post(f"{server.url}/predict", json={"inputs": long, "truncation_direction": "left"})
    assert r.status_code == 200 and r.json()[0]["label"] == want[0]["label"], r.text
    assert abs(r.json()[0]["score"] - want[0]["score"]) < 1e-4


def test_classifier_main_route_is_predict_and_tokenize_serves_it_too(classifier, sample_texts):
    server, predictor = classifier
    want = predictor.predict(sample_texts[0])
    for path in ("/predict", "/", "/invocations"):
        got = httpx.post(f"{server.url}{path}", json={"inputs": sample_texts[0]}).json()
        assert [a["label"] for a in got] == [a["label"] for a in want]
        assert [a["score"] for a in got] == pytest.approx([a["score"] for a in want], abs=1e-5)
    assert httpx.post(f"{server.url}/tokenize", json={"inputs": "a film"}).status_code == 200
    for path, kind in [("/embed", "an embedding"), ("/v1/embeddings", "an embedding"), ("/embed_all", "an embedding"),
                       ("/similarity", "an embedding"), ("/rerank", "a re-ranker")]:  # TEI: 424, the model's kind
        r = httpx.post(f"{server.url}{path}", json={"inputs": "x"})
        want = ({"message": f"model is not {kind} model", "code": 424, "type": "Backend"} if "embeddings" in path
                else {"error": f"model is not {kind} model", "error_type": "Backend"})  # TEI's OpenAI body there
        assert r.status_code == 424 and r.json() == want, path
    assert httpx.post(f"{server.url}/nothing", json={"inputs": "x"}).status_code == 404


BAD = [  # (path, body, status, error_type, words): TEI's code for each fault
    ("/embed", {"inputs": []}, 400, "Empty", "cannot be empty"),
    ("/embed", {"inputs": ["x"] * 9}, 422, "Validation", "more than the limit of 8"),
    ("/embed", {"inputs": "x", "dimensions": 0}, 422, "Validation", "should be positive"),
    ("/embed", {"inputs": "x", "dimensions": 65}, 422, "Validation", "more than the model's 64"),
    ("/embed", {"inputs": [[1, 99999]]}, 422, "Validation", "outside the model's vocabulary"),
    ("/embed", {"inputs": [[1, -2]]}, 422, "Validation", "inputs"),
    ("/embed", {"inputs": "film " * 80, "truncate": False}, 422, "Validation", "more than the model's 32"),
    ("/embed", {"inputs": "x", "prompt_name": "passage"}, 422, "Validation", "not one of the model's prompts"),
    ("/embed", {"inputs": "x", "truncation_direction": "middle"}, 422, "Validation", "truncation_direction"),
    ("/", {"inputs": []}, 400, "Empty", "cannot be empty"),
    ("/invocations", {"inputs": 3}, 422, "Validation", "inputs"),
    ("/similarity", {"inputs": {"source_sentence": "a", "sentences": []}}, 400, "Empty", "sentences"),
    ("/embed_all", {"inputs": []}, 400, "Empty", "cannot be empty"),
    ("/tokenize", {"inputs": []}, 400, "Empty", "cannot be empty"),
    ("/decode", {"ids": [[1, 99999]]}, 422, "Tokenizer", "outside the vocabulary"),
    ("/decode", {"ids": "abc"}, 422, "Validation", "ids"),
]


@pytest.mark.parametrize("path, body, status, kind, words", BAD, ids=[f"{b[0]}-{b[3]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_gets_teis_status_and_error_body(embedder, path, body, status, kind, words):
    server, _ = embedder
    r = httpx.post(f"{server.url}{path}", json=body, headers=AUTH)
    assert r.status_code == status, r.text
    assert r.json() == {"error": r.json()["error"], "error_type": kind} and words in r.json()["error"]


def test_openai_routes_answer_errors_in_teis_openai_shape(embedder):
    server, _ = embedder
    for path in ("/v1/embeddings", "/embeddings"):
        r = httpx.post(f"{server.url}{path}", json={"input": []}, headers=AUTH)
        assert r.status_code == 400 and r.json() == {"message": r.json()["message"], "code": 400, "type": "Empty"}
        r = httpx.post(f"{server.url}{path}", json={"input": "x", "dimensions": 0}, headers=AUTH)
        assert r.status_code == 422 and r.json()["type"] == "Validation" and r.json()["code"] == 422


def test_matryoshka_sizes_come_from_the_config_before_the_card(tmp_path):
    from xformopt.models.matryoshka import declared_dimensions

    assert declared_dimensions(tmp_path, 64) is None  # nothing declared
    (tmp_path / "README.md").write_text("loss: MatryoshkaLoss\nmatryoshka_dims: [64, 8, 32]\n")
    assert declared_dimensions(tmp_path, 64) == [64, 32, 8]
    (tmp_path / "config.json").write_text(json.dumps({"matryoshka_dimensions": [16, 48, 0, 128]}))
    assert declared_dimensions(tmp_path, 64) == [48, 16]  # the config wins; sizes outside 1..width dropped
