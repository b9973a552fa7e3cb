"""xformopt/passes/quantize/outliers.py on a graph built in code whose activations carry outlier channels: the
rewrites are exact in float, and dynamic INT8 of the treated graph is closer to float than of the
plain one."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from xformopt.errors import PassFailed
from xformopt.passes.quantize import outliers

D, F, O = 32, 64, 16
RULES = ((r"ffn_in", "smooth"), (r"ffn_out", "split"))


def ffn_graph(path, rng) -> None:
    """x -> MatMul(ffn_in) -> Add(bias) -> Relu -> MatMul(ffn_out) -> y; a few FFN units have much larger
    weights, so their activations dwarf the others'."""
    w1 = rng.normal(0, 0.2, (D, F)).astype(np.float32)
    w1[:, :3] *= 60
    b1 = rng.normal(0, 0.1, F).astype(np.float32)
    w2 = rng.normal(0, 0.2, (F, O)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="ffn_in"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="bias"),
             helper.make_node("Relu", ["hb"], ["a"], name="act"),
             helper.make_node("MatMul", ["a", "w2"], ["y"], name="ffn_out")]
    graph = helper.make_graph(nodes, "ffn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, None, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None, O])],
                              [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"))])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def feeds(rng, n):
    rows = []
    for _ in range(n):
        x = rng.normal(0, 1, (1, int(rng.integers(4, 12)), D)).astype(np.float32)
        x[..., 5] *= 40  # an outlier input channel, as layer norms produce
        rows.append({"x": x})
    return rows


def run(path, rows):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [session.run(None, r)[0] for r in rows]


def int8_error(path, tmp_path, rows, reference) -> float:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = tmp_path / f"{path.stem}-int8.onnx"
    quantize_dynamic(str(path), str(out), weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"])
    got = run(out, rows)
    return float(np.mean([np.abs(g - r).mean() / np.abs(r).mean() for g, r in zip(got, reference)]))


def test_treatment_is_exact_in_float_and_helps_int8(tmp_path):
    rng = np.random.default_rng(0)
    plain, treated = tmp_path / "plain.onnx", tmp_path / "treated.onnx"
    ffn_graph(plain, rng)
    calibration, held_out = feeds(rng, 16), feeds(rng, 16)
    record = outliers.treat(plain, treated, RULES, calibration, held_out[:4], channels=3)

    assert record["nodes"]["ffn_in"]["treatment"] == "smooth" and record["nodes"]["ffn_out"]["treatment"] == "split"
    assert record["float_parity_max_abs_diff"] <= 1e-5
    reference = run(plain, held_out)
    for a, b in zip(run(treated, held_out), reference):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    graph = onnx.load(str(treated)).graph
    known = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    for node in graph.node:  # topologically sorted: ORT's static quantizer walks the nodes in order
        assert all(i in known for i in node.input if i), node.name
        known.update(node.output)
    counts = {}
    for node in graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    assert counts["MatMul"] == 3 and counts["Slice"] == 2 and counts["Mul"] == 1
    # the three outlier units were moved to the end and cut off into their own GEMM
    split_weight = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(treated)).graph.initializer}["ffn_out/weight_outliers"]
    assert split_weight.shape == (3, O)

    plain_error, treated_error = int8_error(plain, tmp_path, held_out, reference), int8_error(treated, tmp_path, held_out, reference)
    assert treated_error < 0.5 * plain_error, (plain_error, treated_error)


def test_a_shape_the_split_does_not_know_is_skipped_and_said(tmp_path):
    """ffn_out's input has a second consumer: permuting it would change that consumer, so no split."""
    rng = np.random.default_rng(1)
    plain = tmp_path / "plain.onnx"
    ffn_graph(plain, rng)
    model = onnx.load(str(plain))
    model.graph.node.append(helper.make_node("Identity", ["a"], ["a_copy"], name="second_consumer"))
    model.graph.output.append(helper.make_tensor_value_info("a_copy", TensorProto.FLOAT, None))
    onnx.save(model, str(plain))
    record = outliers.treat(plain, tmp_path / "t.onnx", RULES, feeds(rng, 4), feeds(rng, 2))
    assert "ffn_out" in record["skipped"] and "consumers" in record["skipped"]["ffn_out"]
    assert list(record["nodes"]) == ["ffn_in"]


def test_float_rule_only_names_the_gemm(tmp_path):
    rng = np.random.default_rng(2)
    plain = tmp_path / "plain.onnx"
    ffn_graph(plain, rng)
    record = outliers.treat(plain, tmp_path / "t.onnx", ((r"ffn_.*", "float"),), feeds(rng, 2), feeds(rng, 2))
    assert record["kept_float"] == ["ffn_in", "ffn_out"] and record["nodes"] == {}


def test_a_rewrite_that_changes_float_fails(tmp_path):
    rng = np.random.default_rng(3)
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    ffn_graph(a, rng)
    ffn_graph(b, np.random.default_rng(4))
    with pytest.raises(PassFailed, match="changed the float outputs"):
        outliers.parity(a, b, feeds(rng, 2))
