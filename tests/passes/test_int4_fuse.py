"""Same-input projections packed as one MatMulNBits (passes/int4/fuse.py), on the tiny GGUF of
tests/sources/test_gguf.py: the exact Q4_1 carry of a fused gate/up writes one op and one minimum term for
both, computes what the two did, and the traffic count reads the same bytes. Nothing is timed here."""

from __future__ import annotations

from pathlib import Path

import extras
import numpy as np
import pytest

extras.require("gguf")

from tiny_gguf import HIDDEN, graph_over, write_tiny_gguf  # noqa: E402

MLP = ["model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"]  # both Q4_1 in the file
ATTN = ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",  # Q4_0, Q4_1,
        "model.layers.0.self_attn.v_proj.weight"]  # Q4_0: mixed types, never fused (the carry would miss)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-fuse")
    mp = pytest.MonkeyPatch()
    mp.setenv("XFORMOPT_CACHE_DIR", str(root / "cache"))
    from xformopt.sources.gguf import converted

    (root / "files").mkdir()
    src = write_tiny_gguf(root / "files" / "tiny.Q4_1.gguf")
    yield src, converted(src)
    mp.undo()


def _fused_copy(graph: Path, out: Path, gguf_path: Path | None) -> tuple[Path, dict]:
    import onnx

    from xformopt.passes.int4.fuse import fuse_projections, gguf_same_type

    model = onnx.load(graph)
    may_fuse = gguf_same_type(gguf_path, graph.parent, {i.name: i for i in model.graph.initializer}) if gguf_path else None
    record = fuse_projections(model, graph.parent, may_fuse)
    out.mkdir(parents=True)
    onnx.save(model, out / "model.onnx")
    return out / "model.onnx", record


def _run(model_path: Path, x: np.ndarray) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    names = sorted(o.name for o in session.get_outputs())
    return [session.run([n], {"X": x})[0] for n in names]


@pytest.mark.parametrize("accuracy_level", [0, 4])
def test_fused_gate_up_carry_is_one_op_and_one_minimum_term_with_the_same_outputs(tiny, tmp_path, accuracy_level):
    import onnx

    from xformopt.passes.int4.run import Int4Options, build_candidate

    src, folder = tiny
    graph = graph_over(folder, MLP + ATTN, tmp_path / "float")
    fused_graph, record = _fused_copy(graph, tmp_path / "fused", src)
    assert record["groups"] == 1 and record["matmuls_fused"] == 2  # gate/up; q/k/v mix Q4_0 and Q4_1
    assert record["fused"][0]["name"] == "/model.layers.0.mlp.gate_up_proj.weight/MatMul"
    assert record["float_nodes"] == {"before": 5, "after": 5}  # 2 MatMuls -> 1 MatMul + 1 Split

    options = Int4Options(accuracy_level=accuracy_level)
    plain = build_candidate(graph, tmp_path / "q" / "model.onnx", options, [], gguf=src)
    fused = build_candidate(fused_graph, tmp_path / "qf" / "model.onnx", options, [], gguf=src)
    carried = {row["name"]: row for row in fused["gguf_carried"]}
    assert carried[record["fused"][0]["name"]]["type"] == "Q4_1" and carried[record["fused"][0]["name"]]["N"] == 2 * 128
    assert len(fused["gguf_carried"]) == len(plain["gguf_carried"]) - 1 and not fused["gguf_not_carried"]

    ops = {}
    for name, path in (("plain", tmp_path / "q"), ("fused", tmp_path / "qf")):
        nodes = onnx.load(path / "model.onnx").graph.node
        ops[name] = [n.op_type for n in nodes]
    # gate and up: 2 MatMulNBits + 2 minimum MatMuls + 2 Adds -> 1 + 1 + 1 and a Split (block sums shared either way)
    assert len(ops["plain"]) - len(ops["fused"]) == 2
    assert ops["plain"].count("MatMulNBits") - ops["fused"].count("MatMulNBits") == 1
    assert ops["plain"].count("MatMul") - ops["fused"].count("MatMul") == 1 and ops["fused"].count("Split") == 1
    assert ops["fused"].count("ReduceSum") == ops["plain"].count("ReduceSum") == 1  # one input, one block sum

    x = np.random.default_rng(0).standard_normal((2, 3, HIDDEN)).astype(np.float32)
    for a, b in zip(_run(tmp_path / "q" / "model.onnx", x), _run(tmp_path / "qf" / "model.onnx", x)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)  # fp32 summation order only


def test_traffic_counts_the_same_bytes_for_a_fused_matmulnbits(tiny, tmp_path):
    from xformopt.decoder.traffic import onnx_step_bytes
    from xformopt.passes.int4.run import Int4Options, build_candidate

    src, folder = tiny
    graph = graph_over(folder, MLP, tmp_path / "float")
    fused_graph, _ = _fused_copy(graph, tmp_path / "fused", src)
    for out, model in (("q", graph), ("qf", fused_graph)):
        build_candidate(model, tmp_path / out / "model.onnx", Int4Options(), [], gguf=src)
    plain, fused = onnx_step_bytes(tmp_path / "q").weights, onnx_step_bytes(tmp_path / "qf").weights
    assert fused["mlp_in"] == plain["mlp_in"]  # the rest: the block sums' shapes, the Split's sizes (int64s)
    assert fused["norms_and_other"] - plain["norms_and_other"] == 2 * 8
    k, n, blocks = HIDDEN, 2 * 128, HIDDEN // 32
    # packed 4-bit codes + fp32 scale and block sum per block (accuracy_level 4), and the fp32 minimums
    assert fused["mlp_in"] == k * n // 2 + blocks * n * 8 + blocks * n * 4


def test_random_weights_fuse_for_rtn_and_pack_to_the_same_codes(tmp_path):
    """Without a GGUF file: q/k/v and gate/up each fuse; RTN packs the fused weight into the members'
    codes side by side (per-column blocks along K), so the outputs agree to fp32 summation order."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from xformopt.passes.int4.run import Int4Options, build_candidate

    rng = np.random.default_rng(1)
    names = {"/attn/q_proj/MatMul": ("X", 64), "/attn/k_proj/MatMul": ("X", 32), "/attn/v_proj/MatMul": ("X", 32),
             "/mlp/gate_proj/MatMul": ("Z", 96), "/mlp/up_proj/MatMul": ("Z", 96), "/attn/o_proj/MatMul": ("X", 64)}
    nodes, inits, outs = [], [], []
    for i, (name, (x, n)) in enumerate(names.items()):
        inits.append(numpy_helper.from_array((0.1 * rng.standard_normal((64, n))).astype(np.float32), f"W{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"W{i}"], [f"Y{i}"], name=name))
        outs.append(helper.make_tensor_value_info(f"Y{i}", TensorProto.FLOAT, None))
    inputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, [None, 64]) for x in ("X", "Z")]
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outs, inits), opset_imports=[helper.make_opsetid("", 17)])
    (tmp_path / "float").mkdir()
    onnx.save(model, tmp_path / "float" / "model.onnx")
    fused_graph, record = _fused_copy(tmp_path / "float" / "model.onnx", tmp_path / "fused", None)
    assert sorted(f["name"] for f in record["fused"]) == ["/attn/qkv_proj/MatMul", "/mlp/gate_up_proj/MatMul"]
    assert record["matmuls_fused"] == 5  # o_proj reads X too but is another role
    for out, path in (("q", tmp_path / "float" / "model.onnx"), ("qf", fused_graph)):
        build_candidate(path, tmp_path / out / "model.onnx", Int4Options(accuracy_level=0), [])
    import onnxruntime as ort

    feeds = {"X": rng.standard_normal((3, 64)).astype(np.float32), "Z": rng.standard_normal((3, 64)).astype(np.float32)}
    got = [ort.InferenceSession(str(tmp_path / o / "model.onnx"), providers=["CPUExecutionProvider"]).run(
        [f"Y{i}" for i in range(len(names))], feeds) for o in ("q", "qf")]
    for a, b in zip(*got):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    ops = [n.op_type for n in onnx.load(tmp_path / "qf" / "model.onnx").graph.node]
    assert ops.count("MatMulNBits") == 3 and ops.count("Split") == 2


def test_block_sums_by_one_indicator_matmul_per_input(tiny, tmp_path):
    """``block_sums: matmul``: each input's 32-block sums are one MatMul against a 0/1 indicator shared by
    every input of that K (no Reshape, no ReduceSum), and the outputs are the ReduceSum form's."""
    import onnx

    from xformopt.passes.int4.run import Int4Options, build_candidate

    src, folder = tiny
    graph = graph_over(folder, MLP + ATTN, tmp_path / "float")
    fused_graph, _ = _fused_copy(graph, tmp_path / "fused", src)
    for out, sums in (("q", "reduce"), ("qm", "matmul")):
        build_candidate(fused_graph, tmp_path / out / "model.onnx", Int4Options(accuracy_level=0, block_sums=sums), [],
                        gguf=src)
    model = onnx.load(tmp_path / "qm" / "model.onnx")
    ops = [n.op_type for n in model.graph.node]
    assert "ReduceSum" not in ops and "Reshape" not in ops
    assert [i.name for i in model.graph.initializer if "indicator" in i.name] == [f"gguf_block_indicator_{HIDDEN}"]
    x = np.random.default_rng(2).standard_normal((1, 4, HIDDEN)).astype(np.float32)
    for a, b in zip(_run(tmp_path / "q" / "model.onnx", x), _run(tmp_path / "qm" / "model.onnx", x)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
