"""Static INT8 and the accuracy budget on tiny models: calibration methods, target formats read back
from the saved graph, bounded calibration memory, and the budget search (fallback, no fallback, and
the no-candidate path that writes the artifact and exits 1)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import make_ctx, run_cli, run_pass

CAL_LIMIT = 32  # calibration rows: enough for ranges on a tiny model, fast


def graph(path: Path):
    import onnx

    return onnx.load(str(path / "model.onnx"))


def initializers(model) -> dict:
    from onnx import numpy_helper

    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


# --------------------------------------------------------------------------- calibration methods


@pytest.mark.parametrize("method", ["minmax", "entropy", "percentile"])
def test_each_calibration_method(method, fused_classifier, tiny_classifier, tmp_path, sample_texts):
    ctx = make_ctx(tiny_classifier, sample_texts)
    record = run_pass("quantize", ctx, fused_classifier[0], tmp_path / "q", mode="static",
                      calibration_method=method, calibration_limit=CAL_LIMIT)
    cal = record["calibration"]
    assert cal["method"] == {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}[method]
    assert cal["rows"] == CAL_LIMIT and "train.jsonl" in cal["source"] and len(cal["row_ids_sha256"]) == 16
    assert cal["tensors"] > 0
    cov = record["coverage"]
    assert cov["int8"] == cov["weighted_gemms"] and cov["int8_ops"].get("QLinearMatMul")
    assert cov["int8_ops"].get("QAttention")  # fused Attention: dynamic QAttention (no static kernel)
    assert record["agreement"]["mean_agreement"] > 0.9
    assert not list((tmp_path / "q").glob(".quantize*"))  # scratch removed


def test_calibration_rows_disjoint_from_evaluation_rows(tiny_classifier):
    from xformopt import sources
    from xformopt.passes.quantize.calibration import load_split
    from xformopt.resources import vader_split_path

    spec = sources.resolve(str(tiny_classifier))
    cal = load_split(None, "train", spec, 256, 0, labels=False)
    budget = load_split(None, "validation", spec, 500, 0, labels=True)
    test = {r["text"] for r in map(json.loads, vader_split_path("test").read_text().splitlines())}
    assert not set(cal.texts) & test and not set(budget.texts) & test


# --------------------------------------------------------------------------- target formats, read back


def test_profile_formats_in_the_saved_graph(fused_encoder, tiny_encoder, tmp_path, sample_texts):
    """Each profile writes what it claims: zero-point dtypes, 7-bit weights, per-channel scales, op types."""
    out = {}
    for target in ("avx2", "avx512_vnni"):
        ctx = make_ctx(tiny_encoder, sample_texts, target=target)
        run_pass("quantize", ctx, fused_encoder, tmp_path / target, mode="static", calibration_limit=CAL_LIMIT)
        out[target] = graph(tmp_path / target)

    for target, model in out.items():
        ops = {n.op_type for n in model.graph.node}
        assert "QLinearMatMul" in ops and "MatMul" not in ops  # QOperator
        inits = initializers(model)
        qlinear = [n for n in model.graph.node if n.op_type == "QLinearMatMul"]
        for node in qlinear:
            a_zp, w, w_scale, w_zp = (inits.get(node.input[i]) for i in (2, 3, 4, 5))
            assert a_zp is not None and a_zp.dtype == np.uint8  # u8 activations
            assert w.dtype == np.int8 and w_zp.dtype == np.int8 and not w_zp.any()  # s8 symmetric weights
            assert w_scale.size == w.shape[1]  # per-channel on every x86 profile: one scale per output column
            if target == "avx2":  # reduce-range
                assert np.abs(w.astype(int)).max() <= 64
            else:  # full range
                assert np.abs(w.astype(int)).max() > 64


def test_qdq_and_symmetric_int8_activations(fused_encoder, tiny_encoder, tmp_path, sample_texts):
    ctx = make_ctx(tiny_encoder, sample_texts, target="avx512_vnni")
    record = run_pass("quantize", ctx, fused_encoder, tmp_path / "q", mode="static", calibration_limit=CAL_LIMIT,
                      quant_format="QDQ", activation_type="int8", activation_symmetric=True)
    assert record["formats"]["format"] == "QDQ" and record["formats"]["activation_type"] == "int8"
    model = graph(tmp_path / "q")
    ops = [n.op_type for n in model.graph.node]
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops and "QLinearMatMul" not in ops
    inits = initializers(model)
    zero_points = [inits[n.input[2]] for n in model.graph.node if n.op_type == "QuantizeLinear" and len(n.input) > 2]
    assert zero_points and all(z.dtype == np.int8 and not z.any() for z in zero_points)  # symmetric s8


# --------------------------------------------------------------------------- bounded calibration memory


def test_calibration_streams_bounded_chunks(fused_classifier, tiny_classifier, tmp_path, sample_texts, monkeypatch):
    """A large calibration set is tokenized batch by batch and flushed every chunk_batches batches."""
    from onnxruntime.quantization import calibrate as ort_cal

    from xformopt.passes.quantize import calibration

    big = tmp_path / "big.jsonl"
    big.write_text("".join(json.dumps({"text": f"{t} #{i}"}) + "\n" for i in range(40) for t in sample_texts))
    held, calls, yielded = [], [], []
    real_collect = ort_cal.MinMaxCalibrater.collect_data

    def collect(self, reader):
        calls.append(1)
        real_collect(self, reader)
        held.append(len(self.intermediate_outputs))  # cleared after each chunk

    real_next = calibration.TextBatchReader.get_next

    def get_next(self):
        feed = real_next(self)
        if feed is not None:
            yielded.append(feed["input_ids"].shape[0])
        return feed

    monkeypatch.setattr(ort_cal.MinMaxCalibrater, "collect_data", collect)
    monkeypatch.setattr(calibration.TextBatchReader, "get_next", get_next)
    ctx = make_ctx(tiny_classifier, sample_texts)
    record = run_pass("quantize", ctx, fused_classifier[0], tmp_path / "q", mode="static", calibration_data=str(big),
                      calibration_limit=None, calibration_batch_size=16, calibration_chunk_batches=8)
    cal = record["calibration"]
    assert cal["rows"] == 40 * len(sample_texts)
    assert cal["batches"] == len(yielded) == 160 and max(yielded) == cal["max_batch_rows"] == 16
    assert cal["chunks"] == len(calls) == 20 and held == [0] * 20  # flushed after every chunk of <= 8 batches


def test_ort_calib_max_intermediate_outputs_still_drops_chunks(fused_classifier, tiny_classifier, tmp_path, sample_texts):
    """Why calibration.py flushes chunks itself: ORT's own option discards them (1.32).

    If this fails, ORT computes the range before clearing again and CalibMaxIntermediateOutputs
    can be passed instead of the pass's own chunking."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator

    from xformopt.models import load_tokenizer
    from xformopt.passes.quantize.calibration import (
        TextBatchReader,
        graph_input_names,
        prepare_for_static,
    )

    prepared = tmp_path / "p.onnx"
    prepare_for_static(fused_classifier[0] / "model.onnx", prepared)
    reader = TextBatchReader(load_tokenizer(fused_classifier[0]), sample_texts[:32], graph_input_names(prepared), 8)
    calibrator = create_calibrator(prepared, ["MatMul"], augmented_model_path=str(tmp_path / "a.onnx"),
                                   calibrate_method=CalibrationMethod.MinMax, extra_options={"max_intermediate_outputs": 2})
    with pytest.raises(ValueError, match="No data is collected"):  # 4 batches, flushed at 2 and 4 without a range
        calibrator.collect_data(reader)


# --------------------------------------------------------------------------- the accuracy budget


def fake_metric(harmful: set[str], drop_per_node: float = 1.0):
    """A budget evaluation (points, components) that drops by ``drop_per_node`` points for every
    ``harmful`` node still quantized: patched over ``int8_budget.budget_evaluation``, which scores the float
    graph and every candidate."""
    from xformopt.onnx_graph import load_graph, weighted_gemms

    def evaluation(ctx, model_dir, tokenizer_dir, dataset, reference):
        model = load_graph(model_dir / "model.onnx")
        still_float = {g["name"].removesuffix("_MatMul") for g in weighted_gemms(model) if g["has_weight"]}
        return 90.0 - drop_per_node * len(harmful - still_float), {}

    return evaluation


def harm_in_order(order: list[str]):
    def scores(model_path, nodes, reader, formats, ranges, scratch_dir, max_batches=4):
        return {g["name"]: (len(order) - order.index(g["name"]) if g["name"] in order else 0.0) for g in nodes}

    return scores


def gemm_names(stage: Path) -> list[str]:
    from xformopt.onnx_graph import load_graph, weighted_gemms

    return [g["name"] for g in weighted_gemms(load_graph(stage / "model.onnx")) if g["has_weight"]]


def test_budget_generous_no_fallback(fused_classifier, tiny_classifier, tmp_path, sample_texts):
    ctx = make_ctx(tiny_classifier, sample_texts)
    record = run_pass("quantize", ctx, fused_classifier[0], tmp_path / "q", max_accuracy_drop=100, budget_limit=48)
    b = record["budget"]
    assert record["budget_met"] is True and b["budget_met"] is True
    assert b["kept_float"] == [] and len(b["search"]) == 1 and b["harm_ranking"] == []
    assert b["metric"] == "accuracy" and "validation.jsonl" in b["data"]["source"] and b["data"]["rows"] == 48
    assert record["coverage"]["kept_float"] == []


@pytest.mark.host_sensitive
def test_budget_falls_back_most_harmful_first(fused_classifier, tiny_classifier, tmp_path, sample_texts, monkeypatch):
    import xformopt.passes.quantize.budget as q_mod
    import xformopt.passes.quantize.calibration as cal_mod

    names = gemm_names(fused_classifier[0])
    order = [names[3], names[0], names[5], names[1]] + [n for i, n in enumerate(names) if i not in (0, 1, 3, 5)]
    harmful = set(order[:3])  # the three most harmful must return to float; each costs 1 point
    monkeypatch.setattr(q_mod, "budget_evaluation", fake_metric(harmful))
    monkeypatch.setattr(cal_mod, "harm_scores", harm_in_order(order))
    ctx = make_ctx(tiny_classifier, sample_texts, host_flags={"avx512f", "avx512bw", "avx512_vnni"})
    record = run_pass("quantize", ctx, fused_classifier[0], tmp_path / "q", max_accuracy_drop=0.0, budget_limit=16,
                      max_float_nodes=len(names), timing_rounds=3)
    b = record["budget"]
    assert b["budget_met"] is True and b["drop"] == 0
    assert b["chosen"] in (3, 4)  # 4 only if clearly (> 5%) faster than 3
    assert [k["name"] for k in b["kept_float"]] == order[:b["chosen"]]  # most harmful first, with scores
    assert all(k["harm"] > 0 and k["why"].startswith("harm rank") for k in b["kept_float"])
    tried = [(r["float_nodes"], r["passes"]) for r in b["search"]]
    assert tried == [(0, False), (1, False), (2, False), (4, True), (3, True)]  # doubling, then bisection
    assert all("median_ms" in r for r in b["search"] if r["passes"])  # passing candidates timed interleaved
    assert {k["name"] for k in record["coverage"]["kept_float"]} >= set(order[:3])


def test_budget_relative_percent(fused_classifier, tiny_classifier, tmp_path, sample_texts, monkeypatch):
    import xformopt.passes.quantize.budget as q_mod

    names = gemm_names(fused_classifier[0])
    monkeypatch.setattr(q_mod, "budget_evaluation", fake_metric({names[0]}, drop_per_node=0.8))  # 0.8 of 90 points
    ctx = make_ctx(tiny_classifier, sample_texts)
    record = run_pass("quantize", ctx, fused_classifier[0], tmp_path / "q", max_accuracy_drop="1%", budget_limit=16)
    assert record["budget"]["allowed_drop_points"] == pytest.approx(0.9)
    assert record["budget_met"] and record["budget"]["kept_float"] == []


def test_budget_unmet_writes_artifact_and_exits_1(fused_classifier, tiny_classifier, tmp_path, sample_texts, monkeypatch, capsys):
    import xformopt.passes.quantize.budget as q_mod

    names = gemm_names(fused_classifier[0])
    monkeypatch.setattr(q_mod, "budget_evaluation", fake_metric(set(names)))  # every node hurts: half in float is not enough
    out = tmp_path / "q"
    code, _, stderr = run_cli(["quantize", fused_classifier[0], "-o", out, "--mode", "static",
                                    "--max-accuracy-drop", "0.5", "--target", "avx512_vnni"], capsys)
    assert code == 1, stderr
    assert "accuracy budget not met" in stderr
    assert (out / "model.onnx").is_file() and (out / "manifest.json").is_file()  # written before the exit
    entry = json.loads((out / "manifest.json").read_text())["passes"][-1]
    b = entry["record"]["budget"]
    assert entry["record"]["budget_met"] is False and b["budget_met"] is False
    assert b["chosen"] == b["max_float_nodes"] == len(names) // 2  # the smallest drop was written
    assert len(b["kept_float"]) == b["max_float_nodes"]


def test_budget_option_validation():
    from xformopt.passes.quantize.budget import allowed_drop
    from xformopt.passes.quantize.run import QuantizeOptions

    assert QuantizeOptions(max_accuracy_drop="0.5").max_accuracy_drop == 0.5
    assert QuantizeOptions(max_accuracy_drop="2%").max_accuracy_drop == "2%"
    assert allowed_drop("2%", 80.0) == pytest.approx(1.6)
    for bad in ("-1", "lots", -0.5, "5 %x"):
        with pytest.raises(ValueError):
            QuantizeOptions(max_accuracy_drop=bad)


def test_harm_scores_rank_a_damaged_layer_first(fused_classifier, tiny_classifier, tmp_path, sample_texts):
    """The real harm score: a weight with one huge outlier quantizes worst and ranks first."""
    import onnx
    from onnx import numpy_helper

    from xformopt.models import load_tokenizer
    from xformopt.onnx_graph import weighted_gemms
    from xformopt.passes.quantize.calibration import (
        TextBatchReader,
        graph_input_names,
        harm_scores,
    )

    model = onnx.load(str(fused_classifier[0] / "model.onnx"))
    nodes = [g for g in weighted_gemms(model) if g["has_weight"] and g["op"] == "MatMul"]
    victim = next(n for n in model.graph.node if n.name == nodes[1]["name"])
    init = next(i for i in model.graph.initializer if i.name == victim.input[1])
    w = numpy_helper.to_array(init).copy()
    w[0, 0] = 1000.0 * np.abs(w).max()  # one outlier: the per-tensor scale rounds the rest to zero
    init.CopyFrom(numpy_helper.from_array(w, init.name))
    damaged = tmp_path / "m.onnx"
    onnx.save(model, str(damaged))
    reader = TextBatchReader(load_tokenizer(fused_classifier[0]), sample_texts[:16], graph_input_names(damaged), 8)
    formats = {"reduce_range": False, "per_channel": False, "activation_type": "uint8", "activation_symmetric": False}
    scores = harm_scores(damaged, nodes, reader, formats, None, tmp_path)
    assert set(scores) == {n["name"] for n in nodes}
    assert max(scores, key=scores.get) == victim.name
    assert not (tmp_path / "harm.onnx").exists()


def test_recipes_validate():
    from xformopt import recipe

    static = recipe.load("int8-static")
    budgeted = recipe.load("int8-accuracy")
    assert static.passes[-1].options["mode"] == "static"
    assert budgeted.passes[-1].options["max_accuracy_drop"] == 0.5
