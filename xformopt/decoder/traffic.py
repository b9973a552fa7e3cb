"""Bytes one decode step reads, for an ONNX decoder and for a GGUF file: the figure batch-1 decoding's
speed follows on a memory-bound host (every weight once per token, the KV cache at the current length).

Written here because neither runtime reports it: ONNX Runtime's profiler gives times, not bytes, and
llama.cpp prints its file size, not what a step reads. The count is of the weights as each kernel reads
them, by role (``qkv``, ``attention_output``, ``mlp_in``, ``down_proj``, ``lm_head``, from the names
both sides use), plus one embedding row, the norms and biases, and the KV cache per cached position.

ONNX Runtime's ``MatMulNBits`` prepacks its weights at load (``qnbitgemm.h``): with ``accuracy_level``
4 (int8 dot products) each block keeps an fp32 scale and an fp32 block sum into which uint8 zero points
fold, so a 4-bit step reads ``K*N/2 + blocks*N*8`` bytes (6.0 bits per weight at block 32, 5.0 at 64,
4.5 at 128) and an 8-bit one ``K*N + blocks*N*8``, not the file's bytes. llama.cpp reads its blocks as stored (Q4_0: 4.5 bits
per weight, Q4_1: 5.0, Q8_0: 8.5) and keeps its KV cache in fp16 unless told otherwise.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# Role of a weight, from its ONNX node name (onnxruntime-genai's builder, the dynamo exporter, optimum)
ROLES = {
    "lm_head": r"lm_head",
    "attention_output": r"(o_proj|out_proj|attn/dense|attention/dense)",
    "down_proj": r"(down_proj|fc2)",
    "qkv": r"(qkv_proj|q_proj|k_proj|v_proj)",
    "mlp_in": r"(gate_up_proj|gate_proj|up_proj|fc1)",
}
# ... and of a GGUF tensor, from llama.cpp's tensor names
GGUF_ROLES = {
    "lm_head": r"^output\.weight$",
    "attention_output": r"\.attn_output\.",
    "down_proj": r"\.ffn_down\.",
    "qkv": r"\.attn_(q|k|v|qkv)\.",
    "mlp_in": r"\.ffn_(gate|up|gate_up)\.",
    "embedding_row": r"^token_embd\.weight$",
}
MATMULS = {"MatMul", "MatMulNBits", "MatMulInteger", "DynamicQuantizeMatMul", "Gemm", "FusedMatMul",
           "MatMulIntegerToFloat", "QAttention", "Attention"}
FOLDED = {"Transpose", "Cast", "Reshape", "Unsqueeze", "Squeeze"}  # on an initializer: constant-folded at load
ROTARY = {"GroupQueryAttention", "RotaryEmbedding"}
DTYPE_BYTES = {1: 4, 10: 2, 16: 2, 3: 1, 2: 1, 11: 8, 7: 8, 6: 4}  # onnx TensorProto element types


def role_of(name: str, table: dict[str, str] = ROLES) -> str | None:
    return next((role for role, pattern in table.items() if re.search(pattern, name)), None)


@dataclass
class StepBytes:
    """What one decode step reads: weights by role, and the KV cache per cached position."""

    source: str
    weights: dict[str, int] = field(default_factory=dict)  # role -> bytes read per step
    kv_per_position: int = 0  # K and V of every layer, per cached position
    kv_dtype: str = ""
    state_bytes: int = 0  # fixed-size recurrent state (linear-attention layers), read every step
    notes: list[str] = field(default_factory=list)

    def add(self, role: str, nbytes: int) -> None:
        self.weights[role] = self.weights.get(role, 0) + int(nbytes)

    def at(self, positions: int) -> dict:
        """The step at ``positions`` cached tokens: bytes by part and in all."""
        weights = sum(self.weights.values())
        kv = self.kv_per_position * positions
        return {"source": self.source, "positions": positions, "weights_by_role": dict(sorted(self.weights.items())),
                "weights": weights, "kv": kv, "kv_dtype": self.kv_dtype, "state": self.state_bytes,
                "total": weights + kv + self.state_bytes, "notes": list(self.notes)}


# --------------------------------------------------------------------------- ONNX


@dataclass
class _Sized:  # an initializer's size and shape, without its data
    nbytes: int
    dims: tuple


def _nbits_packed(node, inits: dict) -> int:
    """Bytes ORT's MatMulNBits reads per step once prepacked (see the module docstring)."""
    attrs = {a.name: a for a in node.attribute}
    k, n = attrs["K"].i, attrs["N"].i
    bits, block = attrs["bits"].i, attrs["block_size"].i
    level = attrs["accuracy_level"].i if "accuracy_level" in attrs else 0
    blocks = math.ceil(k / block)
    data = n * blocks * block * bits // 8
    if level == 4:
        return data + n * blocks * 8  # fp32 scale + fp32 block sum (zero points folded in)
    stored = sum(inits[name].nbytes for name in node.input[2:4] if name in inits)  # scales, zero points
    return data + stored


def onnx_step_bytes(model_dir: Path) -> StepBytes:
    """The ONNX decoder in ``model_dir`` (``model.onnx``, external data allowed): weights read per step by role,
    the KV cache's bytes per position from its past inputs (``past_key_values.{i}.key/value``)."""
    import onnx

    path = Path(model_dir) / "model.onnx"
    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    inits = {}
    for t in graph.initializer:  # sizes only: external data is not read
        count = int(np.prod(t.dims)) if t.dims else 1
        inits[t.name] = _Sized(count * DTYPE_BYTES.get(t.data_type, 4), tuple(t.dims))
    out = StepBytes(str(path))
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    seen: set[str] = set()
    for node in graph.node:
        weights = [name for name in node.input if name in inits and name not in seen]
        if not weights:
            continue
        seen.update(weights)
        nbytes = sum(inits[w].nbytes for w in weights)
        if node.op_type in FOLDED:  # folded into a constant at load: what reads it is the consumer
            node = next(iter(consumers.get(node.output[0], [])), node)
        if node.op_type == "MatMulNBits":
            out.add(role_of(node.name) or "other_matmul", _nbits_packed(node, inits))
        elif node.op_type in ("Gather", "GatherBlockQuantized"):
            out.add("embedding_row", nbytes // max(max(inits[weights[0]].dims, default=1), 1))  # one row per token
        elif node.op_type in MATMULS:
            out.add(role_of(node.name) or "other_matmul", nbytes)
        elif node.op_type in ROTARY:  # cos/sin caches: the current position's rows
            out.add("rotary_rows", sum(inits[w].nbytes // max(inits[w].dims[0], 1) for w in weights if inits[w].dims))
        else:
            out.add("norms_and_other", nbytes)
    _kv_from_inputs(graph, out)
    return out


def _kv_from_inputs(graph, out: StepBytes) -> None:
    """The past inputs: a KV cache (a dimension that grows with the cached positions: ``past_key_values.{i}.key``
    as (batch, heads, positions, head dim), GPT-2's ``past_{i}`` as (2, batch, heads, positions, head dim))
    counts per position; one without such a dimension (Qwen3.5's conv / recurrent states) once a step."""
    per_position, dtypes = 0, set()
    for inp in graph.input:
        if not inp.name.startswith("past"):
            continue
        tensor = inp.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim]
        symbolic = [d for d in dims if isinstance(d, str)]
        fixed = int(np.prod([d for d in dims if isinstance(d, int)])) * DTYPE_BYTES.get(tensor.elem_type, 4)
        grows = [d for d in symbolic if re.search(r"past|seq|len|total|cache|position", d, re.I)]
        if grows or len(symbolic) >= 2:  # batch and positions free: a cache, read at every cached position
            per_position += fixed
            dtypes.add({1: "float32", 10: "float16", 16: "bfloat16", 3: "int8"}.get(tensor.elem_type, str(tensor.elem_type)))
        else:
            out.state_bytes += fixed
    out.kv_per_position = per_position
    out.kv_dtype = "/".join(sorted(dtypes))


# --------------------------------------------------------------------------- GGUF (llama.cpp)


def gguf_step_bytes(path: Path, kv_bytes_per_value: int = 2) -> StepBytes:
    """A GGUF file as llama.cpp decodes it: each tensor's stored bytes by role (the embedding: one row),
    an untied-less file's ``token_embd`` read whole as the head, the KV cache at ``kv_bytes_per_value``
    (2: llama.cpp's default fp16 cache)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    out = StepBytes(str(path), kv_dtype={2: "float16", 4: "float32", 1: "q8_0"}.get(kv_bytes_per_value, "?"))
    names = {t.name for t in reader.tensors}
    for t in reader.tensors:
        role = role_of(t.name, GGUF_ROLES)
        if role == "embedding_row":
            rows = int(t.shape[-1]) if len(t.shape) > 1 else 1  # gguf shapes are (columns, rows)
            out.add("embedding_row", int(t.n_bytes) // max(rows, 1))
            if "output.weight" not in names:  # a tied head reads the whole table every step
                out.add("lm_head", int(t.n_bytes))
        else:
            out.add(role or "norms_and_other", int(t.n_bytes))
    arch = _field(reader, "general.architecture")
    layers = _field(reader, f"{arch}.block_count")
    heads = _field(reader, f"{arch}.attention.head_count")
    kv_heads = _field(reader, f"{arch}.attention.head_count_kv") or heads
    head_dim = _field(reader, f"{arch}.attention.key_length") or (
        _field(reader, f"{arch}.embedding_length") // heads if heads else None)
    if layers and kv_heads and head_dim:
        out.kv_per_position = int(layers) * 2 * int(kv_heads) * int(head_dim) * kv_bytes_per_value
    else:
        out.notes.append("KV cache not counted: the file's metadata lacks block_count/head counts")
    return out


def _field(reader, key: str):
    f = reader.fields.get(key)
    if f is None:
        return None
    value = f.contents()
    return value[0] if isinstance(value, list) and value else value


def achieved_gb_per_s(step_bytes: int, per_token_ms: float | None) -> float | None:
    """Bytes per step over the step's time, in GB/s (1e9 bytes)."""
    if not per_token_ms:
        return None
    return round(step_bytes / (per_token_ms / 1000) / 1e9, 2)
