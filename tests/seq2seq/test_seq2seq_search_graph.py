"""The decode loop in ONNX Runtime's BeamSearch op (issue 55): ``generate.onnx`` over a tiny trained T5's graphs gives
the Python loop's tokens (float graphs: transformers' ``generate``'s), greedy and 4 beams, over the 100 held-out
sources of the vendored reverse split; quantize writes it over the INT8 graphs; what the op cannot run (beams over a
batch, settings it lacks, a family it has no branch for, graphs rewritten after it was built) falls back to the
Python loop and says so."""

from __future__ import annotations

import json
import logging

import pytest
from helpers import make_ctx, run_pass
from test_seq2seq import _cut, _export, _hf_generate
from tiny_seq2seq import build_seq2seq

from xformopt.resources import word_seq2seq_path
from xformopt.seq2seq.beam_search_graph import GENERATE_FILE
from xformopt.seq2seq.generate import ORT_LOOP, PYTHON_LOOP, GenerationSettings, decode_loop, generate
from xformopt.seq2seq.runner import OrtSeq2Seq
from xformopt.seq2seq.search_graph import open_search_graph, write_search_graph
from xformopt.seq2seq.text import Text2TextModel

pytestmark = pytest.mark.filterwarnings("ignore")
MAX_NEW = 16


@pytest.fixture(scope="module")
def graphs(trained_t5_src, tmp_path_factory):
    """The trained T5's float export with its search graph, and dynamic INT8 of it (the quantize pass writes its own)."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("t5-search")
    stage = _export(trained_t5_src, root / "onnx")
    sources = [json.loads(line)["source"] for line in word_seq2seq_path("reverse", "test").read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(trained_t5_src)
    written = write_search_graph(stage, sources[:4], tokenizer, 1)
    record = run_pass("quantize", make_ctx(trained_t5_src, sources[:8]), stage, root / "int8", outlier_rules=False)
    return stage, root / "int8", written, record, tokenizer, sources, trained_t5_src


def _one_by_one(runner, tokenizer, sources, settings) -> list[list[int]]:
    rows = []
    for text in sources:
        enc = tokenizer([text], return_tensors="np")
        rows += generate(runner, enc["input_ids"], enc["attention_mask"], settings)
    return rows


def _runners(path):
    return OrtSeq2Seq(path, threads=1), OrtSeq2Seq(path, threads=1, search=open_search_graph(path, 1))


@pytest.mark.parametrize("beams", [1, 4])
def test_float_search_graph_gives_the_python_loops_and_transformers_tokens(graphs, beams):
    stage, _, written, _, tokenizer, sources, src = graphs
    assert written["file"] == GENERATE_FILE and (stage / GENERATE_FILE).is_file(), written
    settings = GenerationSettings.from_model_dir(stage).with_(max_new_tokens=MAX_NEW, num_beams=beams)
    python, search = _runners(stage)
    assert decode_loop(search, settings) == ORT_LOOP and decode_loop(python, settings) == PYTHON_LOOP
    ours = _one_by_one(search, tokenizer, sources, settings)
    assert ours == _one_by_one(python, tokenizer, sources, settings)
    theirs = [_hf_generate(src, tokenizer([t], return_tensors="np"), max_new_tokens=MAX_NEW, num_beams=beams)[0]
              for t in sources]
    assert len(ours) == 100 and ours == theirs
    assert any(row[-1] == 1 for row in ours) and all(0 < len(row) <= MAX_NEW for row in ours)


def test_float_search_graph_decodes_a_padded_greedy_batch_as_the_python_loop(graphs):
    """The op itself over padded batches of 10 (generate() keeps batches in the Python loop: faster there)."""
    stage, _, _, _, tokenizer, sources, _ = graphs
    settings = GenerationSettings.from_model_dir(stage).with_(max_new_tokens=MAX_NEW, num_beams=1)
    python, search = _runners(stage)
    assert decode_loop(search, settings, batch=10) == PYTHON_LOOP
    for i in range(0, len(sources), 10):
        enc = tokenizer(sources[i:i + 10], padding=True, return_tensors="np")
        assert search.search.generate(enc["input_ids"], enc["attention_mask"], settings) == \
            _cut(generate(python, enc["input_ids"], enc["attention_mask"], settings))


@pytest.mark.parametrize("beams", [1, 4])
def test_quantize_writes_a_search_graph_over_the_int8_graphs(graphs, beams):
    """INT8 through the op against INT8 through the Python loop, one source at a time: at most one of the 100 rows
    may differ (where two beams' float32 scores, summed in C++ and in numpy, tie within rounding)."""
    _, int8, _, record, tokenizer, sources, _ = graphs
    assert record["search_graph"]["file"] == GENERATE_FILE and (int8 / GENERATE_FILE).is_file()
    settings = GenerationSettings.from_model_dir(int8).with_(max_new_tokens=MAX_NEW, num_beams=beams)
    python, search = _runners(int8)
    ours, theirs = _one_by_one(search, tokenizer, sources, settings), _one_by_one(python, tokenizer, sources, settings)
    differing = [(i, a, b) for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    assert len(ours) == 100 and len(differing) <= 1, differing


def test_what_the_op_cannot_run_falls_back_to_the_python_loop_and_says_why(graphs, caplog):
    stage, _, _, _, tokenizer, sources, _ = graphs
    _, search = _runners(stage)
    settings = GenerationSettings.from_model_dir(stage).with_(max_new_tokens=MAX_NEW, num_beams=4)
    enc = tokenizer(sources[:3], padding=True, return_tensors="np")
    with caplog.at_level(logging.INFO, logger="xformopt"):
        assert decode_loop(search, settings, batch=3) == PYTHON_LOOP  # beams over a batch: ORT's stop check
        assert decode_loop(search, settings.with_(num_beams=1), batch=3) == PYTHON_LOOP  # slower in the op
        assert decode_loop(search, settings.with_(early_stopping=True)) == PYTHON_LOOP
        assert decode_loop(search, settings.with_(forced_eos_token_id=(1,))) == PYTHON_LOOP
        assert decode_loop(search, settings.with_(max_new_tokens=1)) == PYTHON_LOOP
        assert decode_loop(search, settings.with_(max_new_tokens=1, num_beams=1)) == ORT_LOOP
        rows = generate(search, enc["input_ids"], enc["attention_mask"], settings)
    said = caplog.text
    assert "beam search over a batch" in said and "greedy batch" in said and "early_stopping=True" in said and "forced BOS/EOS" in said
    assert "one new token with several beams" in said
    python, _ = _runners(stage)
    assert rows == generate(python, enc["input_ids"], enc["attention_mask"], settings)


@pytest.mark.parametrize("beams", [2, 4])
def test_one_new_token_with_several_beams_gives_the_python_loops_tokens(graphs, beams):
    """ORT's op with several beams and max_length 2 decodes from an unset buffer (an error or other tokens, by what
    memory held): such calls run in the Python loop, one source at a time as served."""
    stage, _, _, _, tokenizer, sources, _ = graphs
    python, search = _runners(stage)
    settings = GenerationSettings.from_model_dir(stage).with_(max_new_tokens=1, num_beams=beams)
    assert _one_by_one(search, tokenizer, sources[:20], settings) == _one_by_one(python, tokenizer, sources[:20], settings)


def test_a_search_graph_over_other_graphs_is_not_used(graphs, tmp_path, caplog):
    """A later step that rewrites the two graphs without rebuilding generate.onnx leaves a stale one: not opened."""
    import shutil

    import onnx

    stage = graphs[0]
    copy = tmp_path / "copy"
    shutil.copytree(stage, copy)
    decoder = onnx.load(str(copy / "decoder.onnx"))
    onnx.helper.set_model_props(decoder, {"rewritten": "yes"})
    onnx.save(decoder, str(copy / "decoder.onnx"))
    with caplog.at_level(logging.INFO, logger="xformopt"):
        assert open_search_graph(copy, 1) is None
        assert Text2TextModel(copy, threads=1).runner.search is None
    assert "embeds other graphs" in caplog.text


def test_bart_gets_no_search_graph_and_decodes_in_the_python_loop(tmp_path, caplog):
    from transformers import AutoTokenizer

    src = build_seq2seq(tmp_path / "hf", "bart")
    stage = _export(src, tmp_path / "onnx")
    with caplog.at_level(logging.INFO, logger="xformopt"):
        written = write_search_graph(stage, ["w1 w2 w3"], AutoTokenizer.from_pretrained(src), 1)
        model = Text2TextModel(stage, threads=1)
    assert written["file"] is None and written["reason"].startswith("bart: ") and not (stage / GENERATE_FILE).exists()
    assert model.runner.search is None and decode_loop(model.runner, model.settings) == PYTHON_LOOP
    assert f"has no {GENERATE_FILE}" in caplog.text
    assert model.generate(["w1 w2 w3"])[0].ids  # it generates, in Python


def test_serve_answers_one_row_requests_through_the_search_graph(graphs):
    """`xformopt serve` on the T5 artifact with generate.onnx, a real server on a free local port, httpx: one source
    (greedy and 4 beams) answered through the op with the Python loop's text; a list of sources (one batch) still
    answered, by the Python loop."""
    import httpx
    from serve_helpers import ServerThread

    from xformopt.serve.app import ServeConfig, create_app
    from xformopt.serve.scheduler import Settings

    stage, _, _, _, _, sources, _ = graphs
    reference = Text2TextModel(stage, threads=1, search_graph=False)
    app = create_app(ServeConfig(str(stage), threads=1, scheduler=Settings(max_batch=8, max_wait_ms=0)))
    with ServerThread(app) as running:
        model = app.state.serve["predictor"].model
        assert model.runner.search is not None
        for beams in (1, 4):
            settings = model.options(num_beams=beams)
            assert decode_loop(model.runner, settings) == ORT_LOOP
            for text in sources[:5]:
                r = httpx.post(f"{running.url}/v1/completions", json={"prompt": text, "num_beams": beams}, timeout=30)
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["text"] == reference.generate([text], settings)[0].text
        r = httpx.post(f"{running.url}/v1/completions", json={"prompt": sources[:3], "num_beams": 4}, timeout=30)
        assert [c["text"] for c in r.json()["choices"]] == [g.text for g in reference.generate(sources[:3], settings)]
