"""multiple-choice: SWAG-like data formats, [batch, choices, tokens] inputs through both predictors,
metrics on hand-made cases, and optimize end to end (export, fuse, INT8) on a tiny
BertForMultipleChoice whose artifact runs as a transformers model (OnnxPipelineModel).
"""

from __future__ import annotations

import json
import random
import textwrap
from pathlib import Path

import numpy as np
import pytest
from harden_helpers import one_error
from helpers import (
    _bert_config,
    _save,
    check_bench_report_and_gate,
    make_ctx,
    run_cli,
    run_pass,
    write_tiny_recipe,
)

from xformopt import sources
from xformopt.errors import InputError
from xformopt.tasks.multiple_choice import CHOICE_SEP, TASK


@pytest.fixture(scope="session")
def tiny_mc(tmp_path_factory, tokenizer_dir) -> Path:
    """A tiny random BertForMultipleChoice with the shared fast WordPiece tokenizer."""
    import torch
    from transformers import BertForMultipleChoice

    torch.manual_seed(4)
    return _save(BertForMultipleChoice(_bert_config(tokenizer_dir)).eval(), tokenizer_dir, tmp_path_factory.mktemp("tiny-mc"))


@pytest.fixture(scope="session")
def swag_file(tmp_path_factory, tokenizer_dir) -> Path:
    """30 SWAG-shaped rows (sent1, sent2, ending0..3, label) of in-vocabulary words, lengths 2-14."""
    words = [w for w in (tokenizer_dir / "vocab.txt").read_text().split() if w.isalpha() and len(w) > 2]
    rng = random.Random(0)

    def phrase(lo, hi):
        return " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))

    rows = [{"sent1": phrase(2, 12), "sent2": phrase(1, 2), **{f"ending{j}": phrase(1, 6) for j in range(4)},
             "label": rng.randint(0, 3)} for _ in range(30)]
    path = tmp_path_factory.mktemp("mc") / "swag.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def load(path, **kw):
    return TASK.load(path, label2id=None, limit=kw.pop("limit", None), seed=kw.pop("seed", 0), **kw)


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip())
    return path


# --------------------------------------------------------------------------- registry


def test_registered_and_detected_from_the_config(tiny_mc):
    spec = sources.resolve(str(tiny_mc))
    assert spec.task == "multiple-choice" and spec.task_def is TASK
    assert (TASK.auto_model, TASK.export_outputs, TASK.input_axes) == (
        "AutoModelForMultipleChoice", ("logits",), ("batch_size", "num_choices", "sequence_length"))
    from xformopt.passes import get_pass

    with pytest.raises(InputError, match="support export, fuse, quantize"):
        get_pass("prune").check(spec, {})


# --------------------------------------------------------------------------- data


def test_swag_columns_with_the_sent2_prefix(swag_file):
    data = load(swag_file)
    first = json.loads(swag_file.read_text().splitlines()[0])
    assert len(data) == 30 and data.texts[0] == first["sent1"]
    assert data.extra["endings"][0] == [f"{first['sent2']} {first[f'ending{j}']}" for j in range(4)]
    assert data.labels[0] == first["label"]
    assert load(swag_file, columns={"text_pair": ""}).extra["endings"][0][0] == first["ending0"]


def test_list_columns_in_jsonl_json_and_csv(tmp_path):
    jsonl = write(tmp_path / "a.jsonl", """
        {"question": "pick one", "choices": ["a cat", "a dog", "a cow"], "answer": 2}
        {"question": "and now", "choices": {"label": ["A", "B", "C"], "text": ["x", "y", "z"]}, "answer": "0"}
    """)
    array = tmp_path / "a.json"
    array.write_text(json.dumps([{"context": "pick one", "endings": ["a cat", "a dog", "a cow"], "label": 2},
                                 {"context": "and now", "endings": ["x", "y", "z"], "label": 0}]))
    csv = write(tmp_path / "a.csv", """
        context,endings,label
        pick one,"[""a cat"", ""a dog"", ""a cow""]",2
        and now,"[""x"", ""y"", ""z""]",0
    """)
    for path in (jsonl, array, csv):
        data = load(path)
        assert data.texts == ["pick one", "and now"], path
        assert data.extra["endings"] == [["a cat", "a dog", "a cow"], ["x", "y", "z"]], path
        assert data.labels == [2, 0], path


def test_labels_are_optional_and_hidden_labels_mean_none(tmp_path):
    path = write(tmp_path / "a.jsonl", """
        {"ctx": "a", "ending0": "x", "ending1": "y", "label": -1}
        {"ctx": "b", "ending0": "x", "ending1": "y", "label": -1}
    """)
    assert load(path).labels is None
    with pytest.raises(InputError, match="no labels"):
        load(path, require_labels=True)
    assert load(write(tmp_path / "b.jsonl", '{"ctx": "a", "ending0": "x", "ending1": "y"}\n')).labels is None


@pytest.mark.parametrize("rows, message", [
    (['{"ctx": "a", "endings": ["x", "y"]}', '{"ctx": "b", "endings": ["x", "y", "z"]}'],
     r"line 2: 3 choices in column 'endings', but the first row has 2"),
    (['{"ctx": "a", "endings": ["x", "y"], "label": 2}'], r"line 1: label 2 in column 'label' is not one of the 2 choices"),
    (['{"ctx": "a", "endings": ["x", "y"], "label": "first"}'], r"line 1: label 'first' .* is not a choice index"),
    (['{"ctx": "a", "endings": ["x", ""]}'], r"line 1: an empty or non-text choice"),
    (['{"ctx": "a", "endings": "x"}'], r"line 1: column 'endings' holds a str, not a list"),
    (['{"ctx": "a", "endings": ["x"]}'], r"a question needs at least 2"),
    (['{"ctx": "a", "ending_a": "x"}'], r"no choices in .*give an 'endings' list column or ending0, ending1"),
    (['{"body": "a", "endings": ["x", "y"]}'], r"no context column .*pass --text-column NAME"),
    (['{"ctx": "a", "endings": ["x", "y"], "label": 1}', '{"ctx": "b", "endings": ["x", "y"]}'],
     r"line 2: no label in column 'label'"),
])
def test_bad_rows_are_one_line_naming_the_row(tmp_path, rows, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(InputError, match=message):
        load(path)


def test_limit_samples_like_every_other_loader(swag_file):
    from xformopt.data import load_text_dataset

    ours = load(swag_file, limit=7, seed=2)
    theirs = load_text_dataset(swag_file, text_column="sent1", label_column="", limit=7, seed=2)
    assert ours.row_ids == theirs.row_ids and ours.texts == theirs.texts
    assert len(ours.extra["endings"]) == 7


# --------------------------------------------------------------------------- inputs and outputs


def test_encode_shapes(tokenizer_dir):
    from xformopt.models import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    enc = TASK.encode(tokenizer, ["the film", "a long film it was"], [CHOICE_SEP.join(["good", "bad", "ok"])] * 2)
    assert {k: v.shape[:2] for k, v in enc.items()} == {k: (2, 3) for k in ("input_ids", "token_type_ids", "attention_mask")}
    second = tokenizer("a long film it was", "bad")["input_ids"]
    assert enc["input_ids"][1, 1, :len(second)].tolist() == second
    plain = TASK.encode(tokenizer, ["the film", "a long film"])  # a plain text: a one-choice question
    assert plain["input_ids"].shape[:2] == (2, 1)


def test_both_predictors_take_3d_inputs_and_agree_with_the_model_row_by_row(tiny_mc, swag_file, tmp_path):
    import torch

    from xformopt.runtime.encoder import OrtPredictor, TorchPredictor
    from xformopt.runtime.session import ort_feed

    spec = sources.resolve(str(tiny_mc))
    torch_predictor = TorchPredictor(spec)
    data = load(swag_file, limit=9)
    out = torch_predictor.predict_data(data, batch_size=4)
    assert out.shape == (9, 4) and out.dtype == np.float32
    tok, model = torch_predictor.tokenizer, torch_predictor.model
    for i in (0, 5, 8):  # one row alone, unpadded: what the batched, padded, re-ordered run must equal
        enc = tok([data.texts[i]] * 4, data.extra["endings"][i], return_tensors="pt", padding=True)
        with torch.inference_mode():
            logits = model(**{k: v.unsqueeze(0) for k, v in enc.items()}).logits[0].numpy()
        assert np.allclose(out[i], logits, atol=1e-5)

    feed = ort_feed({"input_ids": np.ones((2, 4, 7), dtype=np.int32)}, ["input_ids", "attention_mask"])
    assert feed["input_ids"].shape == feed["attention_mask"].shape == (2, 4, 7)

    ctx = make_ctx(tiny_mc, load(swag_file).texts)
    ctx.sample = load(swag_file)  # parity on each context with its choices, as the model receives them
    record = run_pass("export", ctx, tiny_mc, tmp_path / "onnx")
    assert record["parity"]["max_abs_diff"] < 1e-3 and len(record["parity"]["pair_lengths"]) >= 3
    onnx_out = OrtPredictor(spec, tmp_path / "onnx").predict_data(data, batch_size=4)
    assert np.abs(onnx_out - out).max() < 1e-4


def test_score_on_hand_made_cases():
    from xformopt.data import TextDataset

    baseline = np.array([[0.0, 1.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 3.0], [0.0, 1.0, 0.0]])
    outputs = np.array([[0.0, 1.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 3.0], [4.0, 1.0, 0.0]])
    labels = [1, 1, 0, 0]

    def dataset(labels):
        return TextDataset(texts=["q"] * 4, text_pairs=None, labels=labels, label_names=None, source="hand",
                           row_ids=[0, 1, 2, 3], extra={"endings": [["a", "b", "c"]] * 4})

    m = TASK.score(outputs, baseline, dataset(labels))
    assert (m["accuracy"]["value"], m["accuracy"]["n"]) == (0.75, 4)
    assert (m["agreement_with_baseline"]["value"], m["agreement_with_baseline"]["n"]) == (0.5, 4)
    assert 0 < m["accuracy"]["ci95"][0] < 0.75 < m["accuracy"]["ci95"][1] <= 1
    assert set(TASK.score(outputs, baseline, dataset(None))) == {"agreement_with_baseline"}
    assert TASK.budget_points(outputs, baseline, dataset(labels)) == ("accuracy", 75.0)
    assert TASK.budget_points(outputs, baseline, dataset(None)) == ("agreement_with_float", 50.0)
    texts, pairs = TASK.timing_inputs(dataset(labels))
    assert texts == ["q"] * 4 and pairs == [CHOICE_SEP.join("abc")] * 4


# --------------------------------------------------------------------------- end to end


@pytest.fixture
def recipe(tmp_path, swag_file) -> Path:
    return write_tiny_recipe(tmp_path / "tiny.yaml", swag_file, text_column="sent1", limit=24)


def test_optimize_writes_an_int8_artifact_with_multiple_choice_metrics(tiny_mc, recipe, swag_file, tmp_path,
                                                                       capsys):
    out = tmp_path / "out"
    code, _, err = run_cli(["optimize", tiny_mc, "-r", recipe, "-o", out], capsys)
    assert code == 0, err
    report = json.loads((out / "report.json").read_text())
    stages = {s["name"]: s["metrics"] for s in report["stages"]}
    assert list(stages) == ["pytorch", "export", "fuse", "quantize"]
    for name, metrics in stages.items():
        assert set(metrics) == {"accuracy", "agreement_with_baseline"}, name
        assert metrics["accuracy"]["n"] == 24
    assert stages["export"]["agreement_with_baseline"]["value"] == 1.0
    assert stages["export"]["accuracy"]["value"] == stages["pytorch"]["accuracy"]["value"]
    record = json.loads((out / "manifest.json").read_text())["passes"][-1]["record"]
    assert record["coverage"]["int8"] > 0
    assert np.load(out / "reference" / "baseline_outputs.npy").shape == (24, 4)
    check_bench_report_and_gate(out, capsys)

    # The artifact runs as a transformers model (OnnxPipelineModel) and gives what our evaluation gave.
    from transformers import AutoTokenizer

    from xformopt.clients.transformers_pipeline import OnnxPipelineModel
    from xformopt.runtime.encoder import OrtPredictor

    # One row at a time: dynamic INT8 scales activations per call, so both must see the same batch.
    data = load(swag_file, limit=3)
    predictor = OrtPredictor(sources.resolve(str(tiny_mc)), out)
    model = OnnxPipelineModel(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    for i in range(3):
        ours = predictor.predict_data(data.subset([i]))[0]
        enc = tokenizer([data.texts[i]] * 4, data.extra["endings"][i], return_tensors="np", padding=True)
        logits = model(**{k: v[None] for k, v in enc.items()}).logits
        assert np.allclose(np.asarray(logits)[0], ours, atol=1e-5)


def test_optimize_on_ragged_choices_is_exit_2(tiny_mc, tmp_path, capsys):
    bad = write(tmp_path / "bad.jsonl", """
        {"question": "a", "endings": ["x", "y"]}
        {"question": "b", "endings": ["x", "y", "z"]}
    """)
    code, _, err = run_cli(["optimize", tiny_mc, "--data", bad, "-o", tmp_path / "out"], capsys)
    one_error(code, err, "line 2: 3 choices in column 'endings', but the first row has 2")
    assert not (tmp_path / "out").exists()
