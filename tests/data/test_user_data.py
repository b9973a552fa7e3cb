"""Your data, not ours: optimize's data and budget flags reach every pass that reads them, a
classifier whose labels the vendored splits do not have is refused before any work, the evaluation
size does not invalidate cached passes, and embedding artifacts are sentence-transformers drop-ins."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import _bert_config, _save, error_lines, run_cli, write_heldout

from xformopt import models, pipeline, recipe
from xformopt.errors import InputError
from xformopt.passes import get_pass

TWEET_LABELS = {0: "negative", 1: "neutral", 2: "positive"}


@pytest.fixture(scope="module")
def three_class(tmp_path_factory, tokenizer_dir) -> Path:
    """A tiny random 3-class classifier (negative/neutral/positive), like a tweet-sentiment model."""
    import torch
    from transformers import BertForSequenceClassification

    torch.manual_seed(3)
    config = _bert_config(tokenizer_dir, num_labels=3, id2label=TWEET_LABELS,
                          label2id={v: k for k, v in TWEET_LABELS.items()})
    return _save(BertForSequenceClassification(config).eval(), tokenizer_dir, tmp_path_factory.mktemp("tiny-3cls"))


@pytest.fixture(scope="module")
def tweets_file(tmp_path_factory, test_rows) -> Path:
    rows = [{"text": r["text"], "label": TWEET_LABELS[i % 3]} for i, r in enumerate(test_rows[:60])]
    return write_heldout(tmp_path_factory.mktemp("tweets") / "tweets.jsonl", rows)


@pytest.mark.parametrize(("recipe_name", "flag"), [("int8-accuracy", "--validation-data"),
                                                   ("prune-distill-int8", "--train-data")])
def test_vendored_labels_that_are_not_the_models_are_refused_up_front(
        recipe_name, flag, three_class, tweets_file, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = run_cli(["optimize", three_class, "--recipe", recipe_name, "--data", tweets_file, "-o", out],
                           capsys)
    assert code == 2
    lines = error_lines(err)
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "vendored movie-review" in lines[0] and flag in lines[0] and "neutral" in lines[0]
    assert not out.exists()  # refused before any work


def check_labelled_fallbacks(steps, task: str, label2id: dict) -> None:
    """Each step's labelled-fallback rule (``Pass.check_labelled_fallbacks``) for a model of ``task``."""
    spec = models.ModelSpec("model", Path("model"), "bert", task, 2, 2, 8, label2id=label2id)
    for name, options in steps:
        get_pass(name).check_labelled_fallbacks(spec, options)


def test_the_models_own_labels_pass_the_check(tweets_file):
    steps = [("prune", {"data": str(tweets_file)}), ("distill", {"train_data": str(tweets_file)}),
             ("quantize", {"max_accuracy_drop": 0.5, "budget_data": str(tweets_file)})]
    check_labelled_fallbacks(steps, "text-classification", {v: k for k, v in TWEET_LABELS.items()})
    # plain-text fallbacks (no budget, embeddings) need no labels
    check_labelled_fallbacks([("quantize", {"mode": "static"})], "text-classification", {"a": 0, "b": 1, "c": 2})
    check_labelled_fallbacks([("distill", {})], "feature-extraction", {})
    # vendored labels match case-insensitively
    check_labelled_fallbacks([("distill", {})], "text-classification", {"NEGATIVE": 0, "Positive": 1})
    with pytest.raises(InputError, match="LABEL_0"):
        check_labelled_fallbacks([("distill", {})], "text-classification", {"LABEL_0": 0, "LABEL_1": 1})
    # a config.json without id2label (transformers' LABEL_0/LABEL_1 default) is named as such, not "none"
    with pytest.raises(InputError, match=r"not this model's \(unnamed: LABEL_0, LABEL_1, \.\.\.\).*--validation-data"):
        check_labelled_fallbacks([("quantize", {"max_accuracy_drop": 1.0})], "text-classification", {})


def test_flags_reach_every_pass_that_reads_them():
    r = recipe.apply_overrides(recipe.load("prune-distill-int8"), {
        "train_data": "train.csv", "validation_data": "dev.csv", "max_accuracy_drop": "1%", "per_channel": False})
    options = {s.name: s.options for s in r.passes}
    assert options["prune"]["data"] == "train.csv" and options["distill"]["train_data"] == "train.csv"
    assert options["distill"]["eval_data"] == "dev.csv" and options["quantize"]["budget_data"] == "dev.csv"
    assert options["quantize"]["max_accuracy_drop"] == "1%" and options["quantize"]["per_channel"] is False


@pytest.mark.parametrize(("flag", "value"), [("train_data", "t.csv"), ("calibration_data", "c.csv"),
                                             ("validation_data", "v.csv")])
def test_a_flag_no_pass_reads_is_an_error(flag, value):
    with pytest.raises(InputError, match=f"--{flag.replace('_', '-')}: no pass of recipe 'default' reads it"):
        recipe.apply_overrides(recipe.load("default"), {flag: value})


def test_optimize_budget_flag_lands_in_the_manifest(tiny_classifier, heldout_file, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = run_cli(["optimize", tiny_classifier, "-o", out, "--data", heldout_file, "--limit", "16",
                            "--max-accuracy-drop", "1", "--validation-data", heldout_file, "--no-per-channel"], capsys)
    assert code in (0, 1), err  # 1: the budget may be missed on a random model; the artifact is written either way
    manifest = json.loads((out / "manifest.json").read_text())
    quantize = manifest["recipe"]["passes"][-1]["quantize"]
    assert quantize["max_accuracy_drop"] == 1.0 and quantize["budget_data"] == str(heldout_file)
    assert quantize["per_channel"] is False
    record = manifest["passes"][-1]["record"]
    assert record["budget"]["data"]["path"] == str(heldout_file)
    assert manifest["heldout"]["path"] == str(heldout_file)
    assert record["formats"]["per_channel"] is False
    assert manifest["recipe"]["name"] == "default"  # no --recipe is the default recipe


def test_evaluation_size_does_not_rerun_passes(tiny_classifier, heldout_file, tmp_path):
    def run(limit: int, name: str):
        r = recipe.validate({**recipe.load("default").to_dict(),
                             "evaluation": {"data": str(heldout_file), "limit": limit, "latency_rounds": 3,
                                            "warmup": 1, "repeats": 1}})
        return pipeline.run(str(tiny_classifier), r, tmp_path / name).manifest["passes"]

    first, second = run(8, "a"), run(12, "b")
    assert [p["reused"] for p in first] == [False, False, False]
    assert [p["reused"] for p in second] == [True, True, True]
    assert [p["cache_key"] for p in first] == [p["cache_key"] for p in second]


# --------------------------------------------------------------------------- sentence-transformers


@pytest.fixture(scope="module")
def tiny_sentence_transformer(tmp_path_factory, tiny_encoder) -> Path:
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers (the test extra) is not installed")
    from sentence_transformers import models

    modules = [models.Transformer(str(tiny_encoder), max_seq_length=48),
               models.Pooling(64, pooling_mode="mean"), models.Normalize()]
    directory = tmp_path_factory.mktemp("tiny-st")
    st.SentenceTransformer(modules=modules, device="cpu").save(str(directory))
    return directory


@pytest.mark.parametrize(("recipe_name", "floor"), [("fp32-fused", 0.999), ("default", 0.99)])  # default: INT8
def test_embedding_artifact_is_a_sentence_transformers_drop_in(recipe_name, floor, tiny_sentence_transformer,
                                                               heldout_file, sample_texts, tmp_path, capsys):
    from sentence_transformers import SentenceTransformer

    from xformopt.clients.sentence_transformers_module import onnx_sentence_transformer

    out = tmp_path / "out"
    code, _, err = run_cli(["optimize", tiny_sentence_transformer, "--recipe", recipe_name, "-o", out,
                            "--data", heldout_file, "--limit", "8"], capsys)
    assert code == 0, err
    assert (out / "modules.json").is_file() and (out / "1_Pooling" / "config.json").is_file()
    original = SentenceTransformer(str(tiny_sentence_transformer), device="cpu")
    onnx_model = onnx_sentence_transformer(out)  # ST's own backend="onnx" needs optimum (not beside transformers 5)
    assert onnx_model.max_seq_length == original.max_seq_length == 48
    texts = sample_texts[:16]
    a, b = original.encode(texts), onnx_model.encode(texts)
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)  # Normalize kept
    assert ((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min() >= floor
