"""distill's ``student:`` option: a pretrained student of another family and vocabulary (a tiny RoBERTa with a
byte-level BPE tokenizer, built here) learns a tiny BERT teacher's logits per text; the teacher's outputs are
cached per text (the teacher's own tokenization), so students of any tokenizer share them; terms that compare
token positions are refused across tokenizers; a student with the teacher's vocabulary keeps every term."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from harden_helpers import assert_distill_refuses
from helpers import LABELS, TINY, make_ctx, run_pass, train_tiny_classifier
from tiny_students import tiny_roberta_encoder

# soft targets only (no labels): the KL to the teacher is what moves
FAST = dict(train_samples=128, eval_samples=32, max_length=48, batch_size=16, patience=0, checkpoint_every=0,
            label_column="", select="kl_to_teacher", max_steps=40, eval_every=20, lr=1e-3, epochs=50)


def distill(ctx, src: Path, dst: Path, **options) -> dict:
    return run_pass("distill", ctx, src, dst, **{**FAST, **options})


def teacher_files() -> list[Path]:
    from xformopt.cache_stores import store

    return sorted(store("distill-teacher").glob("*.safetensors"))


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, tiny_classifier) -> Path:
    """The tiny BERT classifier trained for a few seconds on the vendored train split (its logits carry signal)."""
    return train_tiny_classifier(tiny_classifier, tmp_path_factory.mktemp("teacher") / "teacher", 640)


@pytest.fixture(scope="module")
def roberta_student(tmp_path_factory) -> Path:
    """A tiny RoBERTa encoder with its own BPE vocabulary (tests/tiny_students.py)."""
    return tiny_roberta_encoder(tmp_path_factory.mktemp("roberta-student") / "roberta")


@pytest.fixture(scope="module")
def same_vocab_student(tmp_path_factory, tokenizer_dir) -> Path:
    """A smaller pretrained BERT encoder (1 layer, hidden 32) with the teacher's tokenizer."""
    import torch
    from transformers import BertConfig, BertModel

    directory = tmp_path_factory.mktemp("bert-student")
    torch.manual_seed(6)
    vocab = len((tokenizer_dir / "vocab.txt").read_text().splitlines())
    BertModel(BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=128), add_pooling_layer=False).save_pretrained(directory)
    for item in tokenizer_dir.iterdir():
        shutil.copy2(item, directory / item.name)
    return directory


def test_a_student_of_another_family_and_vocabulary_learns_the_teachers_logits(teacher, roberta_student, sample_texts,
                                                                              tmp_path):
    ctx = make_ctx(teacher, sample_texts)
    rec = distill(ctx, teacher, tmp_path / "d", student=str(roberta_student))
    st = rec["student"]
    assert (st["kind"], st["model"], st["model_type"], st["same_tokenizer"]) == ("pretrained", str(roberta_student),
                                                                                "roberta", False)
    assert 0 < st["params_share_of_teacher"] < 1 and 0 < st["flops_share_of_teacher"] < 1
    assert rec["data"]["teacher_outputs"]["tokenized_by"].startswith("the teacher's own")
    before, after = rec["quality"]["before"], rec["quality"]["after"]
    assert after["kl_to_teacher"] < 0.5 * before["kl_to_teacher"], (before, after)  # it moved towards the teacher
    out = tmp_path / "d"
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "roberta" and config["architectures"] == ["RobertaForSequenceClassification"]
    assert {int(k): v for k, v in config["id2label"].items()} == LABELS  # the teacher's head
    assert (out / "merges.txt").is_file() and not (out / "vocab.txt").exists()  # the student's tokenizer, not the teacher's
    assert rec["reload_check"]["max_abs_diff"] <= 1e-4
    from xformopt.passes import get_pass

    assert get_pass("distill").summarize(rec).startswith(f"student pretrained {roberta_student}: 1 layers")


def test_the_teacher_cache_is_per_text_and_shared_by_students_of_any_tokenizer(teacher, roberta_student,
                                                                               same_vocab_student, sample_texts,
                                                                               tmp_path):
    ctx = make_ctx(teacher, sample_texts)
    pruned = distill(ctx, teacher, tmp_path / "a", student_layers=1, max_steps=2)  # a student cut from the teacher
    assert pruned["student"]["kind"] == "pruned" and not pruned["data"]["teacher_outputs"]["reused_from_disk"]
    (saved,) = teacher_files()
    other = distill(ctx, teacher, tmp_path / "b", student=str(roberta_student), max_steps=2)
    same = distill(ctx, teacher, tmp_path / "c", student=str(same_vocab_student), max_steps=2)
    for rec in (other, same):  # keyed by the teacher, its tokenization of the texts and the objective
        assert rec["data"]["teacher_outputs"]["reused_from_disk"] and rec["data"]["teacher_outputs"]["seconds"] == 0
    assert teacher_files() == [saved]
    fewer = distill(ctx, teacher, tmp_path / "e", student=str(roberta_student), max_steps=2, train_samples=96)
    assert not fewer["data"]["teacher_outputs"]["reused_from_disk"]  # other texts: another key


def test_a_student_with_the_teachers_vocabulary_keeps_the_hidden_state_term(teacher, same_vocab_student, sample_texts,
                                                                            tmp_path):
    ctx = make_ctx(teacher, sample_texts)
    rec = distill(ctx, teacher, tmp_path / "d", student=str(same_vocab_student), hidden_weight=1.0, max_steps=4,
                  eval_every=2)
    assert rec["student"]["same_tokenizer"] and rec["student"]["hidden"] == 32
    assert rec["losses"]["hidden_projection"] is True  # 32 -> the teacher's 64 through a learned projection
    assert "hidden_mse" in rec["evaluations"][-1]["train_terms"]
    assert rec["data"]["teacher_outputs"]["tokenized_by"].startswith("the student's")


def test_position_terms_across_tokenizers_and_other_misuse_exit_2(teacher, roberta_student, tmp_path, capsys):
    cases = [
        (["--student", roberta_student, "--hidden-weight", "1"], "another tokenizer"),
        (["--student", roberta_student, "--attention-weight", "0.5"], "attention_weight to 0"),
        (["--student", tmp_path / "nope"], "model path not found"),
    ]
    assert_distill_refuses(teacher, cases, tmp_path, capsys)


def test_a_pretrained_embedding_student_must_embed_in_the_teachers_width(tiny_encoder, roberta_student, sample_texts,
                                                                         tmp_path):
    from xformopt.errors import InputError

    ctx = make_ctx(tiny_encoder, sample_texts)
    with pytest.raises(InputError, match=f"embeds in 32 dimensions .* in {TINY['hidden']}"):
        distill(ctx, tiny_encoder, tmp_path / "d", student=str(roberta_student), select="auto")


def test_the_head_follows_a_teacher_config_that_leaves_its_default_labels_out(roberta_student):
    """transformers writes no id2label for its default two labels: the student still gets a two-label head."""
    from xformopt import tasks
    from xformopt.passes.distill import pretrained

    student = pretrained.PretrainedStudent("roberta", roberta_student, {"model_type": "roberta"}, False)
    model = pretrained.load(student, tasks.get("text-classification"), {"model_type": "bert"}, False, False)
    assert model.config.num_labels == 2 and model.classifier.out_proj.out_features == 2
    three = pretrained.load(student, tasks.get("text-classification"), {"id2label": {"0": "a", "1": "b", "2": "c"}},
                            False, False)
    assert three.config.id2label == {0: "a", 1: "b", 2: "c"} and three.classifier.out_proj.out_features == 3
