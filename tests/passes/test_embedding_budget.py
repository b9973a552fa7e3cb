"""Embedder INT8 budget and scores: retrieval recall@k on pair sets, the probe, and the worst drop."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import make_ctx, read_jsonl, run_pass

from xformopt.data import TextDataset
from xformopt.scoring.retrieval import partner_ranks, recall_at_k
from xformopt.tasks import get

TASK = get("feature-extraction")


def _dataset(n: int, pairs: bool = True, labels=None) -> TextDataset:
    return TextDataset(texts=[f"t{i}" for i in range(n)], text_pairs=[f"p{i}" for i in range(n)] if pairs else None,
                       labels=labels, label_names=None, source="test", row_ids=list(range(n)))


def _twins(n_groups: int = 4, dim: int = 16, eps: float = 0.01, seed: int = 0):
    """Candidates in near-identical twins (b_j +- eps e_1); queries equal to their own candidate, and the
    same queries with the twins' sign swapped: cosine ~1 to the originals, yet recall@1 falls to 0."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n_groups, dim))
    e1 = np.eye(dim)[0]
    cands = np.stack([base[i // 2] + (eps if i % 2 == 0 else -eps) * e1 for i in range(2 * n_groups)])
    swapped = np.stack([base[i // 2] - (eps if i % 2 == 0 else -eps) * e1 for i in range(2 * n_groups)])
    return np.stack([cands, cands], axis=1), np.stack([swapped, cands], axis=1)


def test_partner_ranks_and_recall():
    q = np.array([[1, 0, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], dtype=float)
    c = np.array([[1, 0, 0, 0], [1, 0.1, 0, 0], [0, 0, 1, 0], [0, 0, 0.5, 1]], dtype=float)
    ranks = partner_ranks(q, c)
    assert list(ranks) == [0, 1, 0, 0]  # query 1's partner is outranked by candidate 0
    r1 = recall_at_k(q, c, 1)
    assert r1["value"] == 0.75 and r1["n"] == 4 and r1["candidates"] == 4 and len(r1["ci95"]) == 2
    assert recall_at_k(q, c, 2)["value"] == 1.0


def test_ties_count_against_the_query():
    q = np.array([[1.0, 0.0], [1.0, 0.0]])
    c = np.array([[1.0, 0.0], [1.0, 0.0]])  # two identical candidates: neither query is sure of its own
    assert list(partner_ranks(q, c)) == [1, 1]


def test_pair_sets_are_embedded_side_by_side():
    calls = []

    class Fake:
        def predict(self, texts, pairs, batch_size=32, progress=None):
            calls.append((list(texts), pairs))
            return np.arange(len(texts), dtype=np.float32)[:, None].repeat(3, 1)

    out = TASK.predict(Fake(), _dataset(3))
    assert calls == [(["t0", "t1", "t2", "p0", "p1", "p2"], None)]  # one text per input, never joined
    assert out.shape == (3, 2, 3) and out[1, 0, 0] == 1 and out[1, 1, 0] == 4
    assert TASK.timing_inputs(_dataset(3)) == (["t0", "t1", "t2"], None)


def test_score_reports_recall_on_pairs_only():
    reference, _ = _twins()
    data = _dataset(len(reference))
    metrics = TASK.score(reference, reference, data)
    assert metrics["recall_at_1"]["value"] == 1.0 and metrics["recall_at_1"]["n"] == len(reference)
    assert metrics["recall_at_5"]["value"] == 1.0
    assert metrics["cosine_to_baseline"]["n"] == 2 * len(reference)  # both sides compared
    assert set(metrics) <= set(TASK.metrics)
    assert "recall_at_1" in TASK.score(reference, None, data)  # recall needs no baseline
    flat = TASK.score(reference[:, 0], reference[:, 0], _dataset(len(reference), pairs=False))
    assert "recall_at_1" not in flat


def test_budget_holds_the_worst_drop_not_only_cosine():
    reference, swapped = _twins()
    data = _dataset(len(reference))
    parts = TASK.budget_components(swapped, reference, data)
    assert parts["cosine_to_float"]["drop"] < 0.1  # cosine alone would pass this graph
    assert parts["recall_at_1"] == {"float": 100.0, "value": 0.0, "drop": 100.0}
    assert parts["recall_at_5"]["drop"] == 0.0
    name, points = TASK.budget_points(swapped, reference, data)
    assert name == "worst_of(cosine_to_float,recall_at_1,recall_at_5)"
    assert points == 0.0
    assert TASK.budget_points(reference, reference, data) == (name, 100.0)


def test_budget_includes_the_probe_where_labelled():
    rng = np.random.default_rng(0)
    labels = [i % 2 for i in range(40)]
    reference = rng.normal(size=(40, 8)) + np.array(labels)[:, None] * 3.0
    damaged = reference.copy()
    damaged[:, :] = rng.normal(size=(40, 8))  # the class signal is gone
    data = _dataset(40, pairs=False, labels=labels)
    parts = TASK.budget_components(damaged, reference, data)
    assert set(parts) == {"cosine_to_float", "probe_accuracy"}
    assert parts["probe_accuracy"]["float"] > 90 and parts["probe_accuracy"]["drop"] > 20
    name, points = TASK.budget_points(damaged, reference, data)
    assert name == "worst_of(cosine_to_float,probe_accuracy)"
    assert points == pytest.approx(100 - max(p["drop"] for p in parts.values()), abs=1e-3)


def test_quantize_budget_on_a_pair_file_records_each_measure(fused_encoder, tiny_encoder, sample_texts, tmp_path):
    from xformopt.resources import vader_split_path

    rows = read_jsonl(vader_split_path("validation"))[::25][:40]  # both classes (the file is grouped by label)
    pairs = tmp_path / "pairs.jsonl"  # each text paired with its own second half: near, not equal
    pairs.write_text("".join(json.dumps({"text": r["text"], "text_pair": " ".join(r["text"].split()[len(r["text"].split()) // 2:]) or r["text"],
                                         "label": r["label"]}) + "\n" for r in rows))
    ctx = make_ctx(tiny_encoder, sample_texts)
    record = run_pass("quantize", ctx, fused_encoder, tmp_path / "q", max_accuracy_drop=100, budget_data=str(pairs))
    budget = record["budget"]
    assert budget["metric"] == "worst_of(cosine_to_float,recall_at_1,recall_at_5,probe_accuracy)"
    assert budget["float_metric"] == 100.0 and budget["budget_met"]
    first = budget["search"][0]
    assert set(first["components"]) == {"cosine_to_float", "recall_at_1", "recall_at_5", "probe_accuracy"}
    assert first["drop"] == pytest.approx(max(0.0, *(c["drop"] for c in first["components"].values())), abs=1e-3)


def test_optimize_on_a_pair_file_reports_recall(tiny_encoder, tmp_path, capsys):
    from helpers import run_cli

    from xformopt.resources import vader_split_path

    rows = read_jsonl(vader_split_path("test"))[::50][:24]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"text": r["text"], "text_pair": r["text"].lower()}) + "\n" for r in rows))
    out = tmp_path / "o"
    code, _, err = run_cli(["optimize", tiny_encoder, "-o", out, "--data", data, "--no-cache"], capsys)
    assert code == 0, err
    report = json.loads((out / "report.json").read_text())
    for stage in report["stages"]:
        recall = stage["metrics"]["recall_at_1"]
        assert recall["n"] == 24 and 0 <= recall["value"] <= 1
    assert report["stages"][-1]["metrics"]["cosine_to_baseline"]["n"] == 48  # both sides of every pair
    assert "Recall@1" in (out / "report.md").read_text()
