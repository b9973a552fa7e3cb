"""A tiny random Llama GGUF file written with the gguf package's writer, and ONNX graphs over its
weights: shared by tests/sources/test_gguf.py (GGUF input) and tests/passes/test_int4_fuse.py."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

HIDDEN, HEADS, KV_HEADS, FFN = 64, 4, 2, 128
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h i", "Ġ t"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# GGUF name -> (numpy shape [out, in], type)
TENSORS = {
    "token_embd.weight": ((256 + 2 + 3, HIDDEN), Q.Q8_0),  # bytes, merges, specials
    "blk.0.attn_q.weight": ((HIDDEN, HIDDEN), Q.Q4_0),
    "blk.0.attn_k.weight": ((HIDDEN // HEADS * KV_HEADS, HIDDEN), Q.Q4_1),
    "blk.0.attn_v.weight": ((HIDDEN // HEADS * KV_HEADS, HIDDEN), Q.Q4_0),
    "blk.0.attn_output.weight": ((HIDDEN, HIDDEN), Q.Q8_0),
    "blk.0.ffn_gate.weight": ((FFN, HIDDEN), Q.Q4_1),
    "blk.0.ffn_up.weight": ((FFN, HIDDEN), Q.Q4_1),
    "blk.0.ffn_down.weight": ((HIDDEN, FFN), Q.Q4_0),
}


def write_tiny_gguf(path: Path, seed: int = 0) -> Path:
    from gguf.quants import quantize
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # transformers 5 moved it here

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    tokens = list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in MERGES] + SPECIALS
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (256 + len(MERGES)) + [3] * len(SPECIALS))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_chat_template(TEMPLATE)
    for name in ("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"):
        writer.add_tensor(name, (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
    for name, (shape, qtype) in TENSORS.items():
        writer.add_tensor(name, quantize((0.2 * rng.standard_normal(shape)).astype(np.float32), qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def graph_over(folder: Path, names: list[str], out: Path, shift: dict | None = None, declared: bool = True) -> Path:
    """An ONNX graph of one MatMul per HF Linear in ``names`` (weights as MatMul's [K, N] B); the
    input's rank is declared unless ``declared`` is false."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from safetensors.numpy import load_file

    weights = load_file(str(folder / "model.safetensors"))
    nodes, inits, outputs = [], [], []
    for i, name in enumerate(names):
        w = weights[name].T.astype(np.float32) + (shift or {}).get(name, 0.0)
        inits.append(numpy_helper.from_array(np.ascontiguousarray(w), f"W{i}"))
        nodes.append(helper.make_node("MatMul", ["X", f"W{i}"], [f"Y{i}"], name=f"/{name}/MatMul"))
        outputs.append(helper.make_tensor_value_info(f"Y{i}", TensorProto.FLOAT, None))
    shape = [None, None, HIDDEN] if declared else None
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(model, out / "model.onnx")
    return out / "model.onnx"
