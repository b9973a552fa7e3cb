"""`xformopt generate` and `xformopt serve` (POST /v1/completions) on a tiny trained encoder-decoder."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from helpers import run_cli
from serve_helpers import ServerThread
from tiny_seq2seq import reverse_pairs

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, trained_bart_src):
    from transformers import AutoModelForSeq2SeqLM

    from xformopt.seq2seq.export import export_seq2seq
    from xformopt.seq2seq.stage import copy_config_files

    root = tmp_path_factory.mktemp("s2s-serve")
    src = trained_bart_src
    out = root / "onnx"
    out.mkdir()
    export_seq2seq(AutoModelForSeq2SeqLM.from_pretrained(src).eval(), out, 18)
    copy_config_files(src, out)
    return out


@pytest.fixture(scope="module")
def server(artifact):
    from xformopt.serve.app import ServeConfig, create_app
    from xformopt.serve.scheduler import Settings

    app = create_app(ServeConfig(str(artifact), threads=1, scheduler=Settings(max_batch=8, max_wait_ms=200)))
    with ServerThread(app) as running:
        yield running, app


def test_cli_generate_translates(artifact, capsys):
    code, out, err = run_cli(["generate", artifact, "w1 w2 w3 w4"], capsys)
    assert code == 0 and out == "w4 w3 w2 w1\n" and "beam(s)" in err
    code, out, _ = run_cli(["generate", artifact, "w5 w6 w7", "--num-beams", "3", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["text"] == "w7 w6 w5" and doc["num_beams"] == 3 and doc["stopped"] == "eos"
    code, _, err = run_cli(["generate", artifact, "w1", "--num-beams", "0"], capsys)
    assert code == 2 and "--num-beams" in err


def test_completions_single_and_list(server):
    running, _ = server
    r = httpx.post(f"{running.url}/v1/completions", json={"prompt": "w3 w9 w12"}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["text"] == "w12 w9 w3" and body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] > 0
    rows = reverse_pairs(5, 77)
    r = httpx.post(f"{running.url}/v1/completions", json={"prompt": [x["source"] for x in rows], "num_beams": 2}, timeout=30)
    assert [c["text"] for c in r.json()["choices"]] == [x["target"] for x in rows]


def test_concurrent_requests_share_a_batch(server):
    running, app = server
    rows = reverse_pairs(8, 78)
    service = app.state.serve["predictor"]
    before = len(service.batches)

    def ask(row):
        return httpx.post(f"{running.url}/v1/completions", json={"prompt": row["source"]}, timeout=60).json()

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, rows))
    assert [a["choices"][0]["text"] for a in answers] == [x["target"] for x in rows]
    assert max(service.batches[before:]) > 1  # requests that waited together ran as one padded batch


def test_refusals_and_info(server):
    running, _ = server
    for body, word in (({"prompt": ""}, "non-empty"), ({"prompt": "w1", "stream": True}, "stream"),
                       ({"prompt": "w1", "max_tokens": 10_000}, "positions")):
        r = httpx.post(f"{running.url}/v1/completions", json=body, timeout=30)
        assert r.status_code == 422 and word in r.json()["error"], r.text
    info = httpx.get(f"{running.url}/info", timeout=10).json()
    assert info["task"] == "translation" and info["model_type"] == "bart"
    assert httpx.get(f"{running.url}/v1/models", timeout=10).json()["data"][0]["object"] == "model"


def test_api_load_and_bench_of_a_bare_export(artifact):
    from xformopt import api
    from xformopt.errors import InputError

    model = api.load(artifact, threads=1)
    assert [g.text for g in model.generate(["w1 w2 w3", "w4 w5 w6 w7"], model.options(num_beams=2))] == \
        ["w3 w2 w1", "w7 w6 w5 w4"]
    with pytest.raises(InputError, match="no manifest.json"):  # bench measures optimize's output (tests/seq2seq/test_seq2seq_bench.py)
        api.bench(artifact)


def test_serve_command_accepts_the_artifact(artifact):
    """`xformopt serve DIR` checks the artifact before binding: an encoder-decoder passes that check."""
    from xformopt.cli.serve import build_config

    config = build_config(artifact, threads=1, max_batch=4, max_wait_ms=5.0, cache_size=0, api_key_env=None,
                          max_queue=64, timeout_ms=10_000, max_inputs=16, max_body_bytes=1 << 20)
    assert config.artifact.endswith("onnx") and config.scheduler.max_batch == 4
