"""distill's intermediate-layer terms and extra text: MiniLM relation loss by hand, projected hidden
states for a narrower student, the family table's offered terms, teacher-labelled unlabelled and
augmented text."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from helpers import make_ctx, run_pass

from xformopt.errors import InputError
from xformopt.families import FAMILIES
from xformopt.passes.distill import augment as A
from xformopt.passes.distill import losses as L
from xformopt.passes.distill.relations import relation_heads

FAST = dict(train_samples=64, eval_samples=32, max_length=32, batch_size=16, patience=0, checkpoint_every=0,
            label_column="", select="agreement")


def test_relation_kl_by_hand():
    """Zero for identical vectors; one relation head, one row, two real keys: the KL of two softmaxes; padding
    keys and queries do not count."""
    import torch

    a = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]]])  # [B=1, L=3, width=2]; position 2 is padding
    mask = torch.tensor([[1, 1, 0]])
    assert float(L.relation_kl([a, a, a], [a, a, a], mask, 1)) == pytest.approx(0.0, abs=1e-7)
    b = torch.tensor([[[2.0, 0.0], [0.0, 1.0], [-9.0, 3.0]]])
    got = float(L.relation_kl([a], [b], mask, 1))

    def rows(x):
        s = (x[0, :2] @ x[0, :2].T) / math.sqrt(2)
        return torch.log_softmax(s, -1)

    lt, ls = rows(b), rows(a)
    want = float((lt.exp() * (lt - ls)).sum(-1).mean())
    assert got == pytest.approx(want, rel=1e-5)


def test_relation_heads_divide_both_widths():
    assert relation_heads(8 * 32, 12 * 32, 32) == 4
    assert relation_heads(12 * 64, 12 * 64, 64) == 12


def test_family_table_offers_terms():
    assert "relation_kl" in FAMILIES["bert"].layout.distill_terms
    assert FAMILIES["bert"].layout.attn_query == "attention.self.query"
    assert "attention_mse" not in FAMILIES["mpnet"].layout.distill_terms


def test_augmented_copies_are_seeded_and_different():
    texts = ["a truly fine film with great acting and a weak ending", "bad", "not my kind of thing at all"]
    one, two = A.augmented(texts, 2, 0), A.augmented(texts, 2, 0)
    assert one == two and one and not set(one) & set(texts)
    assert all(len(t.split()) >= 1 for t in one)


def test_relation_loss_trains_and_is_recorded(tiny_classifier, sample_texts, tmp_path):
    ctx = make_ctx(tiny_classifier, sample_texts)
    rec = run_pass("distill", ctx, tiny_classifier, tmp_path / "d", **FAST, max_steps=4, eval_every=2,
                   relation_weight=1.0)
    assert rec["losses"]["weights"]["relation_kl"] == 1.0
    assert rec["losses"]["relation_layers"][0] == rec["student"]["layers"] - 1 and rec["losses"]["relation_heads"] >= 1
    assert rec["data"]["teacher_outputs"]["mode"] == "online"
    terms = rec["evaluations"][-1]["train_terms"]
    assert terms["relation_kl"] > 0 and math.isfinite(terms["relation_kl"])


def test_hidden_states_projected_for_a_narrower_student(tiny_classifier, sample_texts, tmp_path):
    """A teacher with a wider hidden size: the student's states go through a learned projection, which is
    not saved with the student."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    cfg = AutoConfig.from_pretrained(tiny_classifier)
    wide = AutoConfig.from_pretrained(tiny_classifier, hidden_size=cfg.hidden_size * 2,
                                      intermediate_size=cfg.intermediate_size * 2)
    torch.manual_seed(0)
    teacher = tmp_path / "wide"
    AutoModelForSequenceClassification.from_config(wide).save_pretrained(teacher)
    for item in tiny_classifier.iterdir():
        if not (teacher / item.name).exists():
            shutil.copy2(item, teacher / item.name)
    ctx = make_ctx(tiny_classifier, sample_texts)
    rec = run_pass("distill", ctx, tiny_classifier, tmp_path / "d", **FAST, max_steps=3, eval_every=3,
                   teacher=str(teacher), hidden_weight=1.0, student_layers=1)
    assert rec["losses"]["hidden_projection"] is True
    from safetensors import safe_open

    with safe_open(tmp_path / "d" / "model.safetensors", "pt") as f:
        assert not any("distill_projection" in k for k in f.keys())
    assert json.loads((tmp_path / "d" / "config.json").read_text())["hidden_size"] == cfg.hidden_size


def test_unlabeled_and_augmented_text_join_the_training_rows(tiny_classifier, sample_texts, tmp_path):
    extra = tmp_path / "more.txt"
    extra.write_text("".join(f"an unlabelled sentence number {i} about a film\n" for i in range(20)))
    ctx = make_ctx(tiny_classifier, sample_texts)
    rec = run_pass("distill", ctx, tiny_classifier, tmp_path / "u", **{**FAST, "label_column": None, "select": "auto"},
                   max_steps=2, eval_every=2, unlabeled_data=str(extra))
    assert rec["data"]["extra_texts"]["rows"] == 20 and rec["data"]["train"]["labelled"]
    rec = run_pass("distill", ctx, tiny_classifier, tmp_path / "a", **FAST, max_steps=2, eval_every=2, augment=1)
    assert rec["data"]["extra_texts"]["rows"] > 0 and "augmented" in rec["data"]["extra_texts"]["source"]


def test_term_the_family_does_not_offer_is_refused(tiny_classifier, sample_texts, tmp_path, monkeypatch):
    import dataclasses

    from xformopt import families

    bert = families.FAMILIES["bert"]
    monkeypatch.setitem(families.FAMILIES, "bert", dataclasses.replace(
        bert, layout=dataclasses.replace(bert.layout, distill_terms=("hidden_mse",))))
    ctx = make_ctx(tiny_classifier, sample_texts)
    with pytest.raises(InputError, match="relation_kl is not offered"):
        run_pass("distill", ctx, tiny_classifier, tmp_path / "d", **FAST, max_steps=2, relation_weight=1.0)
