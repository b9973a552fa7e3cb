"""fill-mask: data formats, the vendored fallback, top-5 outputs against transformers' own fill-mask
pipeline, metrics on hand-made cases, and optimize end to end (export, fuse, INT8) on a tiny
BertForMaskedLM whose artifact runs in transformers' fill-mask pipeline (OnnxPipelineModel)."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
from harden_helpers import one_error
from helpers import (
    _bert_config,
    _save,
    check_bench_report_and_gate,
    run_cli,
    write_tiny_recipe,
)

from xformopt import sources
from xformopt.errors import InputError
from xformopt.resources import vader_split_path
from xformopt.tasks import fill_mask
from xformopt.tasks.fill_mask import MULTI_TOKEN, NO_TARGET, TASK


@pytest.fixture(scope="session")
def tiny_mlm(tmp_path_factory, tokenizer_dir) -> Path:
    """A tiny random BertForMaskedLM with the shared fast WordPiece tokenizer."""
    import torch
    from transformers import BertForMaskedLM

    torch.manual_seed(3)
    return _save(BertForMaskedLM(_bert_config(tokenizer_dir)).eval(), tokenizer_dir, tmp_path_factory.mktemp("tiny-mlm"))


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from xformopt.models import load_tokenizer

    return load_tokenizer(tokenizer_dir)


@pytest.fixture(scope="session")
def masked_file(tmp_path_factory, tokenizer_dir, test_rows) -> Path:
    """Vendored test texts with their first in-vocabulary word masked (a one-token target); every
    fourth row written with <mask> and without a target."""
    vocab = set((tokenizer_dir / "vocab.txt").read_text().split())
    rows = []
    for i, r in enumerate(test_rows[:40]):
        word = next((m for m in re.finditer(r"[a-z]{3,}", r["text"]) if m.group() in vocab), None)
        if word is None:
            continue
        literal = "<mask>" if i % 4 == 0 else "[MASK]"
        row = {"text": r["text"][:word.start()] + literal + r["text"][word.end():]}
        if i % 4:
            row["target"] = word.group()
        rows.append(row)
    path = tmp_path_factory.mktemp("fill-mask") / "masked.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:24]))
    return path


def load(path, **kw):
    return TASK.load(path, label2id=None, limit=kw.pop("limit", None), seed=kw.pop("seed", 0), **kw)


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip())
    return path


# --------------------------------------------------------------------------- registry


def test_registered_and_detected_from_the_config(tiny_mlm):
    spec = sources.resolve(str(tiny_mlm))
    assert spec.task == "fill-mask" and spec.task_def is TASK
    assert (TASK.auto_model, TASK.export_outputs) == ("AutoModelForMaskedLM", ("logits",))
    from xformopt.passes import get_pass

    with pytest.raises(InputError, match="support export, fuse, quantize"):
        get_pass("prune").check(spec, {})


# --------------------------------------------------------------------------- data


def test_reads_jsonl_csv_and_json_with_either_mask_literal(tmp_path):
    jsonl = write(tmp_path / "a.jsonl", """
        {"text": "a [MASK] film", "target": "good"}
        {"text": "a <mask> film"}
    """)
    csv = write(tmp_path / "a.csv", """
        sentence,answer
        a [MASK] film,good
        a <mask> film,
    """)
    array = tmp_path / "a.json"
    array.write_text(json.dumps([{"text": "a [MASK] film", "word": "good"}, {"text": "a <mask> film", "word": None}]))
    for path in (jsonl, csv, array):
        data = load(path)
        assert data.texts == ["a [MASK] film", "a <mask> film"], path
        assert data.extra["target"] == ["good", None], path


def test_a_row_without_a_mask_is_one_line_naming_the_row(tmp_path):
    path = write(tmp_path / "a.jsonl", """
        {"text": "a [MASK] film"}
        {"text": "a fine film"}
    """)
    with pytest.raises(InputError, match=r"line 2: no mask in column 'text'; write \[MASK\]"):
        load(path)


def test_target_column_flags(tmp_path):
    path = write(tmp_path / "a.jsonl", """
        {"text": "a [MASK] film", "expected": "good", "target": "bad"}
    """)
    assert load(path).extra["target"] == ["bad"]
    assert load(path, columns={"label": "expected"}).extra["target"] == ["good"]
    assert load(path, columns={"label": ""}).extra["target"] == [None]
    with pytest.raises(InputError, match="column 'nope' not found"):
        load(path, columns={"label": "nope"})
    bad = write(tmp_path / "b.jsonl", '{"text": "a [MASK] film", "target": ["good"]}\n')
    with pytest.raises(InputError, match="line 1: target in column 'target' is a list"):
        load(bad)
    none = write(tmp_path / "c.jsonl", '{"text": "a [MASK] film"}\n')
    with pytest.raises(InputError, match="no target words"):
        load(none, require_labels=True)


def test_limit_samples_like_every_other_loader(masked_file):
    from xformopt.data import load_text_dataset

    ours = load(masked_file, limit=5, seed=3)
    theirs = load_text_dataset(masked_file, label_column="", limit=5, seed=3)
    assert ours.row_ids == theirs.row_ids and ours.texts == theirs.texts


def test_vendored_fallback_masks_one_content_word_per_text_seeded():
    path = vader_split_path("test")
    a, b = load(path, limit=30, seed=0), load(path, limit=30, seed=0)
    other = load(path, seed=1)  # every row: the rows of `a` are among them
    assert a.texts == b.texts and a.extra == b.extra
    originals = {r: json.loads(line)["text"] for r, line in enumerate(path.read_text().splitlines())}
    for text, target, row in zip(a.texts, a.extra["target"], a.row_ids):
        assert text.count("[MASK]") == 1
        assert text.replace("[MASK]", target) == originals[row]
        assert target.lower() not in fill_mask.STOPWORDS
    reseeded = dict(zip(other.row_ids, other.texts))
    assert sum(reseeded[r] != t for t, r in zip(a.texts, a.row_ids)) >= 10  # another seed, other words


# --------------------------------------------------------------------------- tokens


def test_literals_map_to_the_models_mask_and_the_position_is_found(tokenizer):
    enc = TASK.encode(tokenizer, ["a <mask> film", "the [MASK] is a long film"], max_length=32)
    ids = enc["input_ids"]
    assert [int(ids[i, p]) for i, p in enumerate(enc[fill_mask.MASK_POSITION])] == [tokenizer.mask_token_id] * 2
    assert list(enc[fill_mask.MASK_POSITION]) == [2, 2]


def test_target_ids_in_context(tokenizer):
    texts = ["a [MASK] film", "a [MASK] film", "a [MASK] film", "[MASK] film"]
    got = fill_mask.target_ids(tokenizer, texts, ["movie", "zyzzyva", None, "Movie"], 32)
    movie = tokenizer.convert_tokens_to_ids("movie")
    assert movie != tokenizer.unk_token_id
    assert list(got) == [movie, MULTI_TOKEN, NO_TARGET, movie]  # uncased: "Movie" is "movie"


# --------------------------------------------------------------------------- metrics


def test_top_k_on_hand_made_logits():
    logits = np.array([[0.0, 3.0, 1.0, 2.0, -1.0, 0.5], [5.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    out = fill_mask.top_k(logits)
    assert out.shape == (2, 2, 5) and out.dtype == np.float32
    assert out[0, 0].tolist() == [1, 3, 2, 5, 0]
    p = np.exp(logits[0]) / np.exp(logits[0]).sum()
    assert np.allclose(out[0, 1], p[[1, 3, 2, 5, 0]], atol=1e-6)
    assert out[1, 0].tolist() == [0, 1, 2, 3, 4]  # ties keep the lower id


def _rows(*ids_rows):
    ids = np.array(ids_rows, dtype=np.float32)
    return np.stack([ids, np.full_like(ids, 0.1)], axis=1)


def test_score_on_hand_made_cases():
    from xformopt.data import TextDataset

    baseline = _rows([1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [1, 2, 3, 4, 5], [1, 2, 3, 4, 5])
    outputs = _rows([1, 2, 3, 4, 5], [7, 6, 8, 9, 10], [2, 1, 30, 40, 50], [9, 8, 7, 6, 0])
    data = TextDataset(texts=["[MASK]"] * 4, text_pairs=None, labels=None, label_names=None, source="hand",
                       row_ids=[0, 1, 2, 3], extra={"target_id": [1, 6, MULTI_TOKEN, NO_TARGET]})
    m = TASK.score(outputs, baseline, data)
    assert m["agreement_with_baseline"]["value"] == 0.25 and m["agreement_with_baseline"]["n"] == 4
    assert m["top5_overlap"]["value"] == pytest.approx((1 + 1 + 0.4 + 0) / 4)
    # targets: row 0 top-1 hit, row 1 top-5 hit only; row 2 multi-token (skipped), row 3 none
    assert (m["top1_accuracy"]["value"], m["top1_accuracy"]["n"]) == (0.5, 2)
    assert (m["top5_accuracy"]["value"], m["top5_accuracy"]["n"]) == (1.0, 2)
    assert m["top1_accuracy"]["skipped_multi_token"] == 1
    assert 0 <= m["top1_accuracy"]["ci95"][0] <= 0.5 <= m["top1_accuracy"]["ci95"][1] <= 1
    assert TASK.budget_points(outputs, baseline, data) == ("top1_accuracy", 50.0)
    assert np.allclose(TASK.agreement(outputs, baseline), [1, 1, 0.4, 0])
    plain = TextDataset(texts=["[MASK]"] * 4, text_pairs=None, labels=None, label_names=None, source="hand", row_ids=[0, 1, 2, 3])
    assert set(TASK.score(outputs, baseline, plain)) == {"agreement_with_baseline", "top5_overlap"}
    assert TASK.headline in TASK.score(outputs, baseline, plain)


# --------------------------------------------------------------------------- running


def test_outputs_match_the_transformers_fill_mask_pipeline(tiny_mlm, masked_file):
    from transformers import pipeline

    from xformopt.runtime.encoder import TorchPredictor

    spec = sources.resolve(str(tiny_mlm))
    predictor = TorchPredictor(spec)
    data = load(masked_file)
    out = predictor.predict_data(data, batch_size=5)
    assert out.shape == (len(data), 2, 5)
    fill = pipeline("fill-mask", model=predictor.model, tokenizer=predictor.tokenizer, top_k=5)
    for i in (0, 1, 7):
        text = fill_mask.with_model_mask(data.texts[i], predictor.tokenizer.mask_token)
        expected = fill(text)
        assert out[i, 0].astype(int).tolist() == [e["token"] for e in expected]
        assert np.allclose(out[i, 1], [e["score"] for e in expected], atol=1e-5)
    assert len(data.extra["target_id"]) == len(data)
    assert sum(t >= 0 for t in data.extra["target_id"]) >= 10  # the fixture's targets are one token


def test_a_mask_truncated_away_names_the_row(tiny_mlm, tmp_path):
    from xformopt.runtime.encoder import TorchPredictor

    path = write(tmp_path / "long.jsonl", '{"text": "a [MASK] film"}\n' + json.dumps({"text": "film " * 200 + "[MASK]"}) + "\n")
    with pytest.raises(InputError, match="row 1: the mask is past the model's 128 tokens"):
        TorchPredictor(sources.resolve(str(tiny_mlm))).predict_data(load(path))


# --------------------------------------------------------------------------- end to end


@pytest.fixture
def recipe(tmp_path, masked_file) -> Path:
    return write_tiny_recipe(tmp_path / "tiny.yaml", masked_file)


def test_optimize_writes_an_int8_artifact_with_fill_mask_metrics(tiny_mlm, recipe, masked_file, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = run_cli(["optimize", tiny_mlm, "-r", recipe, "-o", out], capsys)
    assert code == 0, err
    report = json.loads((out / "report.json").read_text())
    stages = {s["name"]: s["metrics"] for s in report["stages"]}
    assert list(stages) == ["pytorch", "export", "fuse", "quantize"]
    for name, metrics in stages.items():
        assert {"top1_accuracy", "top5_accuracy", "agreement_with_baseline", "top5_overlap"} <= set(metrics), name
        assert metrics["top1_accuracy"]["n"] >= 10
    assert stages["pytorch"]["agreement_with_baseline"]["value"] == 1.0
    assert stages["export"]["agreement_with_baseline"]["value"] == 1.0  # parity-checked fp32 graph
    assert stages["export"]["top5_overlap"]["value"] == 1.0
    manifest = json.loads((out / "manifest.json").read_text())
    quantize = manifest["passes"][-1]["record"]
    assert quantize["coverage"]["int8"] > 0
    assert np.load(out / "reference" / "baseline_outputs.npy").shape == (24, 2, 5)
    check_bench_report_and_gate(out, capsys)

    # The artifact serves: as a transformers model (OnnxPipelineModel) in the fill-mask pipeline it gives
    # the top-1 token our evaluation recorded for the quantized stage.
    from transformers import AutoTokenizer, pipeline

    from xformopt.clients.transformers_pipeline import OnnxPipelineModel
    from xformopt.runtime.encoder import OrtPredictor

    # One row at a time: dynamic INT8 scales activations per call, so both must see the same batch.
    data = load(masked_file)
    predictor = OrtPredictor(sources.resolve(str(tiny_mlm)), out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    fill = pipeline("fill-mask", model=OnnxPipelineModel(out), tokenizer=tokenizer, top_k=5)
    for i in (0, 3):
        ours = predictor.predict_data(data.subset([i]))[0]
        got = fill(fill_mask.with_model_mask(data.texts[i], tokenizer.mask_token))
        assert [g["token"] for g in got] == ours[0].astype(int).tolist()
        assert np.allclose([g["score"] for g in got], ours[1], atol=1e-6)


def test_optimize_on_rows_without_a_mask_is_exit_2(tiny_mlm, tmp_path, capsys):
    bad = write(tmp_path / "bad.jsonl", '{"text": "a [MASK] film"}\n{"text": "no mask here"}\n')
    code, _, err = run_cli(["optimize", tiny_mlm, "--data", bad, "-o", tmp_path / "out"], capsys)
    one_error(code, err, "line 2: no mask in column 'text'")
    assert not (tmp_path / "out").exists()
