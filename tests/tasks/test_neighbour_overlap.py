"""feature-extraction's neighbour_overlap_at_10: the share of each text's 10 nearest neighbours that the fp32
embeddings also find (xformopt/scoring/retrieval.py), comparable across embedding widths."""

from __future__ import annotations

import numpy as np

from xformopt.data import TextDataset
from xformopt.scoring.retrieval import nearest, neighbour_overlap
from xformopt.tasks import TASKS


def clusters(seed: int = 0, n: int = 60, width: int = 16) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, width))


def test_the_same_geometry_overlaps_fully_in_any_width():
    base = clusters()
    rotation, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(16, 16)))
    assert neighbour_overlap(base, base)["value"] == 1.0
    # a rotation, or an isometric embedding into a wider space, keeps every cosine: the same neighbours
    wider = np.concatenate([base @ rotation, np.zeros((60, 8))], axis=1)
    result = neighbour_overlap(wider, base)
    assert result["value"] == 1.0 and result["k"] == 10 and result["n"] == 60


def test_unrelated_embeddings_overlap_little_and_the_interval_holds_the_mean():
    result = neighbour_overlap(clusters(2), clusters(3))
    assert result["value"] < 0.5  # 10 of 59 at random: about 0.17
    lo, hi = result["ci95"]
    assert lo <= result["value"] <= hi


def test_nearest_excludes_the_text_itself_and_too_few_texts_give_none():
    x = clusters(n=12)
    near = nearest(x, 10)
    assert near.shape == (12, 10) and all(i not in row for i, row in enumerate(near.tolist()))
    assert neighbour_overlap(x[:10], x[:10]) is None


def test_feature_extraction_reports_it_against_the_baseline():
    task = TASKS["feature-extraction"]
    base = clusters(n=40)
    data = TextDataset(texts=[f"t{i}" for i in range(40)], text_pairs=None, labels=None, label_names=None,
                       source="test", row_ids=list(range(40)))
    noisy = base + np.random.default_rng(5).normal(scale=0.05, size=base.shape)
    metrics = task.score(noisy.astype(np.float32), base.astype(np.float32), data)
    assert 0.5 < metrics["neighbour_overlap_at_10"]["value"] <= 1.0
    assert "neighbour_overlap_at_10" not in task.score(noisy, None, data)  # needs the fp32 embeddings


def test_an_embedding_run_reports_it_and_bench_reproduces_it(tiny_encoder, heldout_file, tmp_path, capsys):
    from helpers import check_bench_report_and_gate

    from xformopt import pipeline, recipe

    r = recipe.validate({"target": "avx512_vnni", "passes": ["export", "quantize"],
                         "evaluation": {"data": str(heldout_file), "limit": 24, "latency_rounds": 3, "warmup": 0,
                                        "repeats": 1}})
    report = pipeline.run(str(tiny_encoder), r, tmp_path / "out").report
    overlap = [s["metrics"]["neighbour_overlap_at_10"] for s in report["stages"]]
    assert overlap[0]["value"] == 1.0 and overlap[0]["n"] == 24  # the fp32 model against itself
    assert all(0.0 <= o["value"] <= 1.0 for o in overlap)
    check_bench_report_and_gate(tmp_path / "out", capsys)  # bench recomputes it exactly; the gate reads it
