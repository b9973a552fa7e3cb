"""Metrics and pooling: checked against worked examples and an independent library, not a copy."""

from __future__ import annotations

import numpy as np
import pytest

from xformopt.scoring.metrics import macro_f1, macro_f1_resampled, macro_f1_value
from xformopt.scoring.pooling import mean_pool


def test_macro_f1_worked_example():
    labels = np.array([0, 0, 0, 1, 1, 2])
    pred = np.array([0, 0, 1, 1, 1, 0])
    # class 0: tp 2 fp 1 fn 1 -> 2/3; class 1: tp 2 fp 1 fn 0 -> 0.8; class 2: never predicted -> 0
    assert macro_f1_value(pred, labels) == pytest.approx((2 / 3 + 0.8 + 0.0) / 3)


def test_macro_f1_counts_a_class_seen_only_in_predictions():
    labels = np.array([0, 0, 1, 1])
    pred = np.array([0, 0, 1, 3])  # class 3 is predicted once and never true: F1 0, it still counts
    assert macro_f1_value(pred, labels) == pytest.approx((1.0 + 2 / 3 + 0.0) / 3)
    assert macro_f1_value(labels, labels) == 1.0


def test_macro_f1_interval_is_seeded_and_brackets_the_value():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 120)
    pred = np.where(rng.random(120) < 0.7, labels, rng.integers(0, 3, 120))
    result = macro_f1(pred, labels, seed=1)
    assert result["n"] == 120 and result == macro_f1(pred, labels, seed=1)
    assert result["ci95"][0] < result["value"] < result["ci95"][1]
    assert macro_f1(pred, labels, seed=2)["ci95"] != result["ci95"]


@pytest.mark.parametrize("names", [False, True])
def test_macro_f1_bootstrap_at_once_equals_one_resample_at_a_time(names):
    """The bootstrap's vectorised macro-F1 is scikit-learn's on every resample (classes absent from a
    resample, a class only predicted, string labels)."""
    rng = np.random.default_rng(5)
    for n in (1, 2, 7, 60):
        labels = rng.integers(0, 3, n)
        pred = np.where(rng.random(n) < 0.6, labels, rng.integers(0, 4, n))
        if names:
            labels, pred = np.array(["neg", "neu", "pos"])[labels], np.array(["neg", "neu", "pos", "other"])[pred]
        picks = np.array([rng.integers(0, n, n) for _ in range(50)])
        want = [macro_f1_value(pred[idx], labels[idx]) for idx in picks]
        np.testing.assert_allclose(macro_f1_resampled(pred, labels, picks), want, rtol=0, atol=1e-12)


def test_mean_pool_matches_sentence_transformers_pooling():
    import torch
    from sentence_transformers import models

    torch.manual_seed(0)
    hidden = torch.randn(3, 5, 8)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    reference = models.Pooling(8, pooling_mode="mean")(
        {"token_embeddings": hidden, "attention_mask": mask})["sentence_embedding"]
    torch.testing.assert_close(mean_pool(hidden, mask), reference)
    np.testing.assert_allclose(mean_pool(hidden.numpy(), mask.numpy()), reference.numpy(), rtol=1e-6, atol=1e-6)


def test_probe_splits_stratified_and_scores_the_held_out_half():
    from xformopt.scoring.probe import Probe

    rng = np.random.default_rng(0)
    labels = [0] * 30 + [1] * 10 + [2] * 8
    centres = rng.normal(size=(3, 16)) * 4
    embeddings = centres[labels] + rng.normal(size=(len(labels), 16))
    probe = Probe(embeddings, labels, seed=3)
    train, test = probe.train_idx, probe.test_idx
    assert sorted(np.concatenate([train, test]).tolist()) == list(range(len(labels)))
    assert list(train) == sorted(train) and list(test) == sorted(test)
    assert np.bincount(np.asarray(labels)[train]).tolist() == [15, 5, 4]  # half of each class
    assert np.array_equal(Probe(embeddings, labels, seed=3).train_idx, train)
    result = probe.score(embeddings)
    assert result["n"] == len(test) == 24 and result["train_rows"] == 24 and result["value"] > 0.9
