"""text-ranking (rerankers): NDCG@10 and MRR@10 on hand-made lists, a one-output pair model recognised as a
reranker (not refused for the vendored sentiment labels), the vendored review_rerank lists, `optimize` end
to end with the ranking metrics per stage and INT8 held to an NDCG budget, and the CrossEncoder drop-in
scoring as the PyTorch CrossEncoder of the same checkpoint does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import check_bench_report_and_gate, run_cli

from xformopt import sources, tasks
from xformopt.resources import review_rerank_path
from xformopt.scoring.ranking import mrr_at_k, ndcg_at_k, query_lists, top1_agreement
from xformopt.tasks.ranking import TASK


def test_ndcg_and_mrr_on_hand_made_lists():
    queries = ["a"] * 3 + ["b"] * 3 + ["c"] * 2 + ["d"]  # d: one passage, c: no relevant one: both left out
    labels = np.array([0, 1, 0, 1, 0, 0, 0, 0, 1])
    scores = np.array([0.9, 0.5, 0.1, 0.2, 0.8, 0.3, 0.5, 0.4, 0.7])
    lists = query_lists(queries)
    mrr = mrr_at_k(scores, labels, lists)
    assert mrr["n"] == 2 and mrr["value"] == pytest.approx((1 / 2 + 1 / 3) / 2)
    # a: the relevant passage second of three, b: third: DCG 1/log2(3) and 1/log2(4), ideal 1
    ndcg = ndcg_at_k(scores, labels, lists)
    assert ndcg["value"] == pytest.approx((1 / np.log2(3) + 1 / np.log2(4)) / 2) and ndcg["k"] == 10
    assert mrr_at_k(scores, labels, lists, k=2)["value"] == pytest.approx(0.5 / 2)  # b's rank 3 is past k
    tied = np.array([0.5, 0.5, 0.1, 0.2, 0.8, 0.3, 0.5, 0.4, 0.7])
    assert mrr_at_k(tied, labels, lists)["value"] == pytest.approx((1 / 2 + 1 / 3) / 2)  # a tie counts against
    assert top1_agreement(scores, -scores, lists).tolist() == [0.0, 0.0, 0.0]  # lists of one passage left out
    assert top1_agreement(scores, 2 * scores, lists).tolist() == [1.0, 1.0, 1.0]


def test_a_one_output_pair_model_is_a_reranker_and_two_outputs_a_classifier(tiny_reranker, tiny_classifier):
    assert sources.resolve(str(tiny_reranker)).task == "text-ranking"
    assert sources.resolve(str(tiny_classifier)).task == "text-classification"
    rows = TASK.load(review_rerank_path("test"), label2id=None, limit=None, seed=0)
    lists = query_lists(rows.texts)
    assert len(lists) == 120 and {len(r) for r in lists} == {10}
    assert all(np.asarray(rows.labels)[r].sum() == 1 for r in lists)  # one relevant passage per list
    assert tasks.get("text-ranking").default_data("validation") == review_rerank_path("validation")


def test_agreement_is_the_pairwise_order_kept():
    reference = np.array([0.1, 0.2, 0.3, 0.4])
    assert TASK.agreement(reference * 10 + 3, reference).tolist() == [1.0] * 4  # any monotone map keeps the order
    swapped = np.array([0.2, 0.1, 0.3, 0.4])  # rows 0 and 1 swapped: each disagrees with one of its three others
    assert TASK.agreement(swapped, reference).tolist() == pytest.approx([2 / 3, 2 / 3, 1.0, 1.0])


def test_optimize_a_reranker_reports_ndcg_per_stage_and_holds_int8_to_its_budget(tiny_reranker, tmp_path, capsys):
    recipe = tmp_path / "rerank.yaml"  # a random tiny model: its INT8 order agreement is far under the 0.9 floor
    recipe.write_text("name: rerank\ntarget: avx512_vnni\npasses:\n  - export\n  - fuse: {timing_rounds: 3}\n"
                      "  - quantize: {min_agreement: 0.5, max_accuracy_drop: 10}\n"
                      "evaluation:\n  latency_rounds: 3\n  warmup: 1\n  repeats: 1\n  limit: 300\n")
    out = tmp_path / "out"
    code, _, err = run_cli(["optimize", tiny_reranker, "-r", recipe, "-o", out], capsys)
    assert code == 0, err
    assert "review_rerank/test.jsonl" in err  # the ranking lists, not the sentiment labels
    report = json.loads((out / "report.json").read_text())
    assert report["headline_metric"] == "ndcg_at_10"
    stages = {s["name"]: s["metrics"] for s in report["stages"]}
    assert list(stages) == ["pytorch", "export", "fuse", "quantize"]
    for name, metrics in stages.items():
        assert set(metrics) == {"ndcg_at_10", "mrr_at_10", "top1_agreement"}, name
        assert 0 < metrics["ndcg_at_10"]["value"] <= 1 and metrics["ndcg_at_10"]["n"] > 0
    assert stages["export"]["ndcg_at_10"]["value"] == pytest.approx(stages["pytorch"]["ndcg_at_10"]["value"], abs=0.01)
    record = json.loads((out / "manifest.json").read_text())["passes"][-1]["record"]
    budget = json.dumps(record)
    assert "ndcg_at_10" in budget and record["coverage"]["int8"] > 0
    check_bench_report_and_gate(out, capsys)


def test_cross_encoder_drop_in_scores_as_the_pytorch_cross_encoder(tiny_reranker, served_reranker, sample_texts):
    from sentence_transformers import CrossEncoder

    import xformopt
    from xformopt.clients.cross_encoder_module import onnx_cross_encoder

    pairs = [(sample_texts[0], t) for t in sample_texts[1:9]]
    onnx = onnx_cross_encoder(served_reranker)
    torch_model = CrossEncoder(str(tiny_reranker), device="cpu", local_files_only=True)
    ours, theirs = onnx.predict(pairs, batch_size=1), torch_model.predict(pairs, batch_size=1)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)  # the float export: PyTorch's scores, sigmoid included
    loaded = [a[0]["score"] for a in xformopt.load(served_reranker).predict(pairs, batch_size=1)]
    np.testing.assert_allclose(ours, loaded, atol=1e-6)
    ranked = onnx.rank(sample_texts[0], [t for _, t in pairs])
    assert [r["corpus_id"] for r in ranked] == list(np.argsort(-np.asarray(theirs), kind="stable"))


def test_cross_encoder_drop_in_refuses_a_classifier(served_classifier):
    from xformopt.clients.cross_encoder_module import onnx_cross_encoder
    from xformopt.errors import InputError

    with pytest.raises(InputError, match="2 outputs"):
        onnx_cross_encoder(Path(served_classifier))


def test_rows_without_passages_are_refused_before_any_work(tiny_reranker, tmp_path, capsys):
    from harden_helpers import one_error

    rows = tmp_path / "queries.jsonl"
    rows.write_text('{"text": "a query", "label": 1}\n{"text": "another", "label": 0}\n')
    code, _, err = run_cli(["optimize", tiny_reranker, "--data", rows, "-o", tmp_path / "out"], capsys)
    one_error(code, err, "needs (query, passage) rows")
    assert not (tmp_path / "out").exists()
