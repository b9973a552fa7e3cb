"""What each ONNX operator is: its category in the profile, its arithmetic precision, and its FLOPs.

One table per question, so a new fused op is added in one place. The categories partition the op
types: every op type is in exactly one, and an op type in no table is "other".
"""

from __future__ import annotations

import math

# category -> op types (ONNX standard and ONNX Runtime's com.microsoft contrib ops).
CATEGORIES: dict[str, frozenset[str]] = {
    "gemm": frozenset({
        "MatMul", "Gemm", "FusedMatMul", "FusedGemm", "MatMulInteger", "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat", "QLinearMatMul", "QGemm", "MatMulNBits", "MatMulBnb4", "GatherBlockQuantized",
    }),
    # Fused attention does its Q/K/V projection GEMMs inside. In an unfused graph, Softmax and the
    # matmuls of two activations (Q K^T, scores x V: see kernel_category) are the attention.
    "attention": frozenset({
        "Attention", "QAttention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention",
        "PackedMultiHeadAttention", "DecoderMaskedMultiHeadAttention", "RotaryEmbedding", "Softmax",
    }),
    "layer norm": frozenset({
        "LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
        "SkipSimplifiedLayerNormalization", "RMSNormalization",
    }),
    "embeddings": frozenset({"EmbedLayerNormalization", "Gather", "GatherElements", "GatherND"}),
    "quantize overhead": frozenset({"DynamicQuantizeLinear", "QuantizeLinear", "DequantizeLinear"}),
    "activation": frozenset({
        "Gelu", "BiasGelu", "FastGelu", "QuickGelu", "Relu", "Tanh", "Erf", "Sigmoid", "Silu", "HardSigmoid",
        "BiasFastGelu",
    }),
    "elementwise": frozenset({
        "Add", "Sum", "Sub", "Mul", "Div", "Pow", "Sqrt", "Neg", "Exp", "Log", "Reciprocal", "Cast", "Where", "Equal",
        "Not", "And", "Or", "Less", "Greater", "Min", "Max", "Clip", "BiasAdd", "BiasDropout",
    }),
    "reduce": frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceL2", "ArgMax", "TopK", "CumSum"}),
    "data movement": frozenset({
        "Reshape", "Transpose", "Concat", "Slice", "Shape", "Unsqueeze", "Squeeze", "Expand", "Split", "Identity",
        "Flatten", "ConstantOfShape", "Range", "Constant", "Tile", "Pad", "Trilu", "ScatterND",
    }),
}
OTHER = "other"
ORDER = (*CATEGORIES, OTHER)

# GEMM precision by op type (what peak the achieved GFLOP/s is compared with).
INT8_GEMMS = frozenset({"MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QLinearMatMul", "QGemm",
                        "QAttention"})
INT4_GEMMS = frozenset({"MatMulNBits", "MatMulBnb4"})
FUSED_ATTENTION = frozenset({"Attention", "QAttention", "MultiHeadAttention", "GroupQueryAttention",
                             "PackedAttention", "PackedMultiHeadAttention"})

_BY_OP = {op: name for name, ops in CATEGORIES.items() for op in ops}


def category(op_type: str) -> str:
    return _BY_OP.get(op_type, OTHER)


def kernel_category(op_type: str, weight_inputs: bool | None, input_shapes: list[list[int]]) -> str:
    """The category of one kernel call: its op type's, except that a GEMM multiplying two
    activations (no weight among its inputs) is an unfused graph's attention (Q K^T, scores x V).
    ``weight_inputs``: whether the graph gives the node an initializer input (None: graph unknown,
    then two batched inputs of rank >= 3 tell, since weights are rank 2)."""
    kind = category(op_type)
    if kind != "gemm":
        return kind
    if weight_inputs is None:
        weight_inputs = not (len(input_shapes) >= 2 and all(len(s) >= 3 for s in input_shapes[:2]))
    return kind if weight_inputs else "attention"


def precision(op_type: str, input_dtypes: list[str]) -> str | None:
    """'int8', 'int4', 'fp32' or 'fp16' for an op that does GEMM work (None for one that does not)."""
    if op_type in INT8_GEMMS:
        return "int8"
    if op_type in INT4_GEMMS:
        return "int4"
    if category(op_type) == "gemm" or op_type in FUSED_ATTENTION:
        return "fp16" if input_dtypes[:1] == ["float16"] else "fp32"
    return None


def _numel(shape: list[int]) -> int:
    return math.prod(int(d) for d in shape)


def flops(op_type: str, inputs: list[list[int]], outputs: list[list[int]], attrs: dict | None = None) -> float | None:
    """Multiply-add FLOPs (2 per MAC) of one GEMM or fused-attention call from the shapes in the
    trace, or None when they do not tell. ONNX Runtime leaves prepacked weights out of a node's
    input shapes, so K is read from the activation (input 0) and N from the output."""
    attrs = attrs or {}
    if not inputs or not outputs or not inputs[0] or not outputs[0]:
        return None
    a, out = inputs[0], outputs[0]
    if op_type in FUSED_ATTENTION:
        if len(a) != 3 or len(out) != 3:
            return None
        batch, seq, hidden_in = a
        hidden = out[-1]
        s_kv = seq
        if op_type in ("MultiHeadAttention", "GroupQueryAttention") and len(inputs) > 1 and len(inputs[1]) == 3:
            s_kv = inputs[1][1]
        scores = 4.0 * batch * seq * s_kv * hidden  # Q K^T and softmax(.) V
        if op_type in ("MultiHeadAttention", "GroupQueryAttention", "PackedMultiHeadAttention"):
            return scores  # Q, K and V come in projected
        qkv = attrs.get("qkv_hidden_sizes")
        width = sum(qkv) if qkv else 3 * hidden
        return 2.0 * batch * seq * hidden_in * width + scores
    if category(op_type) != "gemm" or op_type == "GatherBlockQuantized":
        return None
    if op_type in ("Gemm", "FusedGemm", "QGemm"):
        k = a[0] if attrs.get("transA") else a[-1]
    elif op_type == "FusedMatMul" and attrs.get("transA"):
        k = a[-2] if len(a) >= 2 else a[-1]
    elif op_type in INT4_GEMMS and attrs.get("K"):
        k = attrs["K"]
    else:
        k = a[-1]
    return 2.0 * _numel(out) * int(k)
