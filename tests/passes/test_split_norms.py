"""fuse's split_norms candidates: SkipLayerNormalization written back as Sum + LayerNormalization."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import make_ctx, onnx_op_counts, run_pass
from onnx import TensorProto, helper, numpy_helper

from xformopt.passes.fuse.run import FUSION_ORDER, choose
from xformopt.passes.fuse.split_norms import SKIP_NORM_DEFAULT_EPSILON, split_skip_norms
from xformopt.runtime.session import ort_session

HIDDEN = 16


def _session(model_or_path, optimized: str | None = None):
    source = model_or_path.SerializeToString() if isinstance(model_or_path, onnx.ModelProto) else Path(model_or_path)
    return ort_session(source, threads=1, optimized_path=optimized)


def _skip_norm_graph(*, bias: bool, beta: bool, epsilon: float | None, outputs=("y",), read=("y",),
                     dtype=TensorProto.FLOAT) -> onnx.ModelProto:
    """One SkipLayerNormalization whose ``outputs`` are named and ``read`` become graph outputs (through Identity)."""
    rng = np.random.default_rng(0)
    np_type = np.float32 if dtype == TensorProto.FLOAT else np.float16
    weights = {name: (rng.standard_normal(HIDDEN) * scale + shift).astype(np_type)
               for name, scale, shift in (("gamma", 0.3, 1.0), ("beta", 0.5, 0.0), ("bias", 0.5, 0.0))}
    inputs = ["x", "skip", "gamma", "beta" if beta else "", *(["bias"] if bias else [])]
    attrs = {} if epsilon is None else {"epsilon": epsilon}
    nodes = [helper.make_node("SkipLayerNormalization", inputs, list(outputs), name="SkipLN_0",
                              domain="com.microsoft", **attrs)]
    nodes += [helper.make_node("Identity", [name], [f"out_{name}"]) for name in read]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, dtype, ["b", "s", HIDDEN]) for n in ("x", "skip")],
        [helper.make_tensor_value_info(f"out_{n}", dtype, ["b", "s", HIDDEN]) for n in read],
        [numpy_helper.from_array(v, k) for k, v in weights.items() if k != "bias" or bias])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])


def _feed(dtype=np.float32):
    rng = np.random.default_rng(1)
    return {n: (rng.standard_normal((2, 5, HIDDEN)) * 3).astype(dtype) for n in ("x", "skip")}


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("beta", [False, True])
@pytest.mark.parametrize("epsilon", [None, 1e-5])
def test_split_gives_the_fused_nodes_outputs(bias, beta, epsilon):
    fused = _skip_norm_graph(bias=bias, beta=beta, epsilon=epsilon, outputs=("y", "", "", "sum"), read=("y", "sum"))
    split = onnx.ModelProto()
    split.CopyFrom(fused)
    assert split_skip_norms(split) == 1
    ops = [n.op_type for n in split.graph.node]
    assert "SkipLayerNormalization" not in ops and ops.count("Sum") == 1 and ops.count("LayerNormalization") == 1
    norm = next(n for n in split.graph.node if n.op_type == "LayerNormalization")
    assert norm.name == "SkipLN_0"  # the layer a profile attributes it to is unchanged
    want_eps = SKIP_NORM_DEFAULT_EPSILON if epsilon is None else epsilon
    assert next(a.f for a in norm.attribute if a.name == "epsilon") == pytest.approx(want_eps)
    assert len(next(n for n in split.graph.node if n.op_type == "Sum").input) == (3 if bias else 2)
    onnx.checker.check_model(split)
    feed = _feed()
    for want, got in zip(_session(fused).run(None, feed), _session(split).run(None, feed), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)  # the output and the sum


def test_onnx_runtime_does_not_fuse_the_split_back(tmp_path):
    """ORT's SkipLayerNormFusion rewrites Add -> LayerNormalization at load time, not Sum."""
    split = _skip_norm_graph(bias=True, beta=True, epsilon=1e-5)
    assert split_skip_norms(split) == 1
    _session(split, optimized=str(tmp_path / "loaded.onnx"))
    loaded = [n.op_type for n in onnx.load(str(tmp_path / "loaded.onnx"), load_external_data=False).graph.node]
    assert "SkipLayerNormalization" not in loaded and "LayerNormalization" in loaded


def test_nodes_whose_statistics_are_read_or_not_float_stay():
    exposed = _skip_norm_graph(bias=False, beta=True, epsilon=1e-5, outputs=("y", "mean"), read=("y", "mean"))
    assert split_skip_norms(exposed) == 0
    assert [n.op_type for n in exposed.graph.node][0] == "SkipLayerNormalization"
    half = _skip_norm_graph(bias=False, beta=True, epsilon=1e-5, dtype=TensorProto.FLOAT16)
    assert split_skip_norms(half) == 0
    # named statistics nothing reads (onnxscript names them) do not stop the split
    named = _skip_norm_graph(bias=False, beta=True, epsilon=1e-5, outputs=("y", "mean", "inv"), read=("y",))
    assert split_skip_norms(named) == 1


def test_split_candidates_are_preferred_after_their_base():
    assert FUSION_ORDER.index("all") < FUSION_ORDER.index("all_split_norms") < FUSION_ORDER.index("no_attention")
    timing = {"all": {"median_ms": 1.0, "p90_ms": 1.0, "n": 3}, "all_split_norms": {"median_ms": 0.98, "p90_ms": 1.0, "n": 3}}
    assert choose(timing, 0.05)[0] == "all"  # within the tolerance: the fused node (fewer nodes) wins
    timing["all_split_norms"]["median_ms"] = 0.8
    assert choose(timing, 0.05)[0] == "all_split_norms"


def test_fuse_builds_split_candidates_that_match_the_fused_graph(exported_classifier, tiny_classifier, tmp_path,
                                                                 sample_texts):
    """Whatever the timing keeps, each split candidate is the fused candidate with its norms split,
    and gives the same logits (the choice itself is the host's: never asserted)."""
    from xformopt.passes.fuse import run as fuse_run

    ctx = make_ctx(tiny_classifier, sample_texts)
    record = run_pass("fuse", ctx, exported_classifier[0], tmp_path / "all", select="all")
    fused = tmp_path / "all" / "model.onnx"
    n_norms = onnx_op_counts(fused)["SkipLayerNormalization"]
    assert n_norms > 0 and record["split_norms"] == {}
    count, written = fuse_run.split_candidate(tmp_path / "all", tmp_path / "split")
    assert count == n_norms
    counts = onnx_op_counts(tmp_path / "split" / "model.onnx")
    assert written["SkipLayerNormalization"] == 0 and written["LayerNormalization"] == counts["LayerNormalization"]
    assert counts["SkipLayerNormalization"] == 0 and counts["Sum"] == n_norms
    assert counts["Attention"] == onnx_op_counts(fused)["Attention"]
    assert (tmp_path / "split" / "tokenizer.json").is_file()
    rng = np.random.default_rng(2)
    ids = rng.integers(5, 100, size=(2, 9))
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    want, got = _session(fused), _session(tmp_path / "split" / "model.onnx")
    names = {i.name for i in want.get_inputs()}
    feed = {k: v for k, v in feed.items() if k in names}
    np.testing.assert_allclose(got.run(None, feed)[0], want.run(None, feed)[0], atol=1e-5)
