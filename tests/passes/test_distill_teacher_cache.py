"""distill's teacher outputs on disk (logits or embeddings, and the hidden states the losses use): reused when
the teacher and the data are the same, recomputed when either changes; and a width-pruned student (narrower
residual stream) learning the teacher's hidden states through a learned projection."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import make_ctx, run_pass

FAST = dict(train_samples=64, eval_samples=16, max_length=32, batch_size=16, patience=0, checkpoint_every=0,
            max_steps=2, eval_every=2)


def distill(ctx, src: Path, dst: Path, **options) -> dict:
    return run_pass("distill", ctx, src, dst, **{**FAST, **options})


def teacher_files() -> list[Path]:
    from xformopt.cache_stores import store

    return sorted(store("distill-teacher").glob("*.safetensors"))


@pytest.fixture
def other_teacher(tiny_encoder, tmp_path) -> Path:
    """The tiny encoder with one weight changed: another teacher, the same config and tokenizer."""
    import torch
    from transformers import AutoModel

    out = tmp_path / "other-teacher"
    model = AutoModel.from_pretrained(tiny_encoder)
    with torch.no_grad():
        model.encoder.layer[0].output.dense.weight[0, 0] += 0.5
    model.save_pretrained(out)
    for item in tiny_encoder.iterdir():
        if not (out / item.name).exists():
            shutil.copy2(item, out / item.name)
    return out


def test_teacher_hidden_states_are_cached_reused_and_invalidated(tiny_encoder, other_teacher, sample_texts, tmp_path):
    from safetensors import safe_open

    ctx = make_ctx(tiny_encoder, sample_texts)
    first = distill(ctx, tiny_encoder, tmp_path / "a", student_layers=1, hidden_weight=1.0)
    assert first["data"]["teacher_outputs"]["mode"] == "cached" and not first["data"]["teacher_outputs"]["reused_from_disk"]
    (saved,) = teacher_files()
    with safe_open(str(saved), "pt") as f:
        keys = set(f.keys())
    layer = first["losses"]["layer_map"][0]
    assert {"train", "eval", "offsets", f"hidden.{layer}"} <= keys  # the states the hidden term reads are on disk

    again = distill(ctx, tiny_encoder, tmp_path / "b", student_layers=1, hidden_weight=1.0)
    assert again["data"]["teacher_outputs"]["reused_from_disk"] and again["data"]["teacher_outputs"]["seconds"] == 0
    assert again["weights_sha256"] == first["weights_sha256"]  # the cached states are the ones computed
    assert teacher_files() == [saved]

    other_data = distill(ctx, tiny_encoder, tmp_path / "c", student_layers=1, hidden_weight=1.0, train_samples=48)
    assert not other_data["data"]["teacher_outputs"]["reused_from_disk"]
    other = distill(ctx, tiny_encoder, tmp_path / "d", student_layers=1, hidden_weight=1.0, teacher=str(other_teacher))
    assert not other["data"]["teacher_outputs"]["reused_from_disk"]
    assert len(teacher_files()) == 3


def test_width_pruned_student_learns_hidden_states_through_a_projection(tiny_classifier, sample_texts, tmp_path):
    pruned = tmp_path / "p"
    run_pass("prune", make_ctx(tiny_classifier, sample_texts), tiny_classifier, pruned, hidden_size=32, layers=1,
             measure_latency=False, samples=16, eval_samples=16)
    ctx = make_ctx(pruned, sample_texts)
    record = distill(ctx, pruned, tmp_path / "d", teacher=str(tiny_classifier), hidden_weight=1.0)
    assert record["losses"]["hidden_projection"] is True
    assert record["evaluations"][-1]["train_terms"].keys() >= {"hidden_mse"}
    import json

    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["hidden_size"] == 32  # the projection is a training aid, not part of the student


def test_width_pruning_an_embedding_model_is_refused(tiny_encoder, sample_texts, tmp_path):
    from xformopt.errors import InputError

    with pytest.raises(InputError, match="narrows the embedding itself"):
        run_pass("prune", make_ctx(tiny_encoder, sample_texts), tiny_encoder, tmp_path / "p", hidden_fraction=0.5,
                 measure_latency=False, samples=16, eval_samples=16)
