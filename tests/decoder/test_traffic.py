"""Bytes per decode step (xformopt/decoder/traffic.py), on graphs and GGUF files built here, against
sizes worked out by hand from the formats (not from the code under test)."""

from __future__ import annotations

import numpy as np
import pytest

from xformopt.decoder.traffic import achieved_gb_per_s, gguf_step_bytes, onnx_step_bytes

H, V, FFN, BLOCK = 64, 100, 128, 32
KV_HEADS, HEAD_DIM = 2, 16


def _nbits(name: str, k: int, n: int, level: int):
    from onnx import helper, numpy_helper

    blocks = k // BLOCK
    b = numpy_helper.from_array(np.zeros((n, blocks, BLOCK // 2), np.uint8), f"{name}.B")
    scales = numpy_helper.from_array(np.ones(n * blocks, np.float32), f"{name}.scales")
    node = helper.make_node("MatMulNBits", ["x", b.name, scales.name], [f"{name}.out"], name=name, domain="com.microsoft",
                            K=k, N=n, bits=4, block_size=BLOCK, accuracy_level=level)
    return node, [b, scales]


def _write_decoder(directory, level: int):
    """A decoder-shaped graph: embedding Gather, a 4-bit qkv and down_proj, an fp32 lm_head behind a
    Transpose (as the genai builder ties it), a norm weight, one layer's past key/value and another's
    fixed-size state."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    embed = numpy_helper.from_array(np.zeros((V, H), np.float32), "embed")
    head = numpy_helper.from_array(np.zeros((V, H), np.float32), "lm_head.weight")
    norm = numpy_helper.from_array(np.ones(H, np.float32), "norm.weight")
    qkv, qkv_inits = _nbits("/model/layers.0/attn/qkv_proj/MatMul", H, 3 * H, level)
    down, down_inits = _nbits("/model/layers.0/mlp/down_proj/MatMul", FFN, H, level)
    nodes = [
        helper.make_node("Gather", ["embed", "input_ids"], ["x"], name="/model/embed_tokens/Gather"),
        qkv, down,
        helper.make_node("SimplifiedLayerNormalization", ["x", "norm.weight"], ["normed"], name="/model/norm"),
        helper.make_node("Transpose", ["lm_head.weight"], ["head_t"], perm=[1, 0], name="/lm_head/Transpose"),
        helper.make_node("MatMul", ["normed", "head_t"], ["logits"], name="/lm_head/MatMul"),
    ]
    past = [helper.make_tensor_value_info(f"past_key_values.0.{kind}", TensorProto.FLOAT,
                                          ["batch", KV_HEADS, "past", HEAD_DIM]) for kind in ("key", "value")]
    past.append(helper.make_tensor_value_info("past_key_values.1.conv", TensorProto.FLOAT, ["batch", 8, 4]))
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"]), *past],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)],
                              [embed, head, norm, *qkv_inits, *down_inits])
    directory.mkdir()
    onnx.save(helper.make_model(graph), str(directory / "model.onnx"))
    return directory


@pytest.mark.parametrize("level", [4, 0])
def test_onnx_step_bytes_by_role(tmp_path, level):
    step = onnx_step_bytes(_write_decoder(tmp_path / "d", level))
    # MatMulNBits at level 4: 4-bit data, an fp32 scale and an fp32 block sum per block; at level 0 the
    # scales as stored (fp32 here: also 4 bytes a block)
    per_block = 8 if level == 4 else 4
    assert step.weights["qkv"] == 3 * H * H // 2 + 3 * H * (H // BLOCK) * per_block
    assert step.weights["down_proj"] == H * FFN // 2 + H * (FFN // BLOCK) * per_block
    assert step.weights["embedding_row"] == H * 4  # one fp32 row per token, not the table
    assert step.weights["lm_head"] == V * H * 4  # the folded transpose is read whole by its MatMul
    assert step.weights["norms_and_other"] == H * 4
    assert step.kv_per_position == 2 * KV_HEADS * HEAD_DIM * 4 and step.kv_dtype == "float32"
    assert step.state_bytes == 8 * 4 * 4  # a linear-attention layer's fixed state: once a step
    at = step.at(10)
    assert at["total"] == sum(step.weights.values()) + 10 * step.kv_per_position + step.state_bytes


def _write_gguf(path, tied: bool):
    import gguf
    from gguf.quants import quantize

    Q = gguf.GGMLQuantizationType
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(3)
    writer.add_embedding_length(H)
    writer.add_head_count(4)
    writer.add_head_count_kv(KV_HEADS)
    tensors = {"token_embd.weight": ((V, H), Q.Q8_0), "blk.0.attn_q.weight": ((H, H), Q.Q4_0),
               "blk.0.ffn_down.weight": ((H, FFN), Q.Q4_1)}
    if not tied:
        tensors["output.weight"] = ((V, H), Q.Q4_0)
    for name, (shape, qtype) in tensors.items():
        writer.add_tensor(name, quantize(rng.standard_normal(shape).astype(np.float32), qtype), raw_dtype=qtype)
    writer.add_tensor("output_norm.weight", np.ones(H, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.extra("gguf")
def test_gguf_step_bytes_by_role(tmp_path, tied):
    step = gguf_step_bytes(_write_gguf(tmp_path / "m.gguf", tied))
    q8_0, q4_0, q4_1 = 34 / 32, 18 / 32, 20 / 32  # bytes per weight of each GGML block type
    assert step.weights["embedding_row"] == H * q8_0
    assert step.weights["lm_head"] == (V * H * q8_0 if tied else V * H * q4_0)  # tied: the table read whole
    assert step.weights["qkv"] == H * H * q4_0 and step.weights["down_proj"] == H * FFN * q4_1
    assert step.weights["norms_and_other"] == H * 4
    assert step.kv_per_position == 3 * 2 * KV_HEADS * (H // 4) * 2  # fp16 cache, head dim = width / heads
    assert step.kv_dtype == "float16"


def test_achieved_bandwidth():
    assert achieved_gb_per_s(2_000_000_000, 1000.0) == 2.0
    assert achieved_gb_per_s(100, None) is None
