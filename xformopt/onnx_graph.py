"""Small facts about an ONNX graph that passes and reports need: op counts, INT8 coverage, size."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

# Operators ONNX Runtime's transformer optimizer produces; reported before/after `fuse`.
FUSED_OPS = (
    "Attention",
    "MultiHeadAttention",
    "EmbedLayerNormalization",
    "SkipLayerNormalization",
    "LayerNormalization",
    "BiasGelu",
    "FastGelu",
    "Gelu",
    "GemmFastGelu",
    "BiasSkipLayerNormalization",
    # decoders (ORT's GPT-2 optimizer on GPT-2 / Llama graphs)
    "RotaryEmbedding",
    "SimplifiedLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "GroupQueryAttention",
)

# Float ops that carry a weight matrix and are candidates for INT8.
FLOAT_GEMM_OPS = ("MatMul", "Gemm", "Attention")
# What those ops become once quantized (QOperator dynamic/static, or the runtime's fused forms).
INT8_GEMM_OPS = ("MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QAttention", "QGemm", "QLinearMatMul")


def load_graph(model_path: Path):
    import onnx

    return onnx.load(str(model_path), load_external_data=False)


def producers(graph) -> dict:
    """Each tensor name -> the node that writes it (a graph proto)."""
    return {out: node for node in graph.node for out in node.output}


def drop_dead(graph) -> None:
    """Remove the nodes whose outputs nothing reads (to a fixed point), then the initializers no node reads and
    the shape annotations of tensors no longer produced (a graph proto, edited in place)."""
    while True:
        read = {t for n in graph.node for t in n.input} | {o.name for o in graph.output}
        dead = [n for n in graph.node if not any(o in read for o in n.output if o)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    read = {t for n in graph.node for t in n.input}
    for tensor in [t for t in graph.initializer if t.name not in read]:
        graph.initializer.remove(tensor)
    produced = {o for n in graph.node for o in n.output}
    for info in [v for v in graph.value_info if v.name not in produced]:
        graph.value_info.remove(info)


def op_counts(model) -> Counter:
    return Counter(node.op_type for node in model.graph.node)


def weighted_gemms(model) -> list[dict]:
    """Float MatMul/Gemm/Attention nodes and whether their second input is a constant weight."""
    initializers = {init.name for init in model.graph.initializer}
    constants = {out for node in model.graph.node if node.op_type == "Constant" for out in node.output}
    weights = initializers | constants
    rows = []
    for node in model.graph.node:
        if node.op_type in FLOAT_GEMM_OPS:
            weight = node.input[1] if len(node.input) > 1 else ""
            rows.append({"name": node.name, "op": node.op_type, "has_weight": weight in weights})
    return rows


def fused_counts(model) -> dict[str, int]:
    counts = op_counts(model)
    return {op: counts.get(op, 0) for op in FUSED_OPS}


def dir_size_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


# An encoder-decoder stage's two graphs (xformopt/seq2seq/), in place of model.onnx.
SEQ2SEQ_GRAPHS = ("encoder.onnx", "decoder.onnx")


def seq2seq_stage(path: Path) -> bool:
    """True for a folder holding an encoder-decoder stage's two graphs."""
    return all((Path(path) / name).is_file() for name in SEQ2SEQ_GRAPHS)


PROTOBUF_LIMIT = 2 * 1024**3  # a single ONNX protobuf file cannot exceed 2 GB


def needs_external_data(model_path: Path) -> bool:
    """True when the weights must live beside the graph (model.onnx_data) rather than inside it."""
    model_path = Path(model_path)
    total = sum(p.stat().st_size for p in model_path.parent.glob(model_path.name + "*"))
    return total > PROTOBUF_LIMIT * 0.9  # margin: fusion and quantization add initializers


def int8_coverage(before, after) -> dict:
    """How many weighted GEMMs run in INT8 now, and which stayed in float.

    Counted, not matched by name: ORT's quantizer rewrites a Gemm as ``<name>_MatMul`` + Add even
    when it leaves it in float, so a name lookup would count that Gemm as quantized.
    """
    weighted = [g for g in weighted_gemms(before) if g["has_weight"]]
    still_float = [g for g in weighted_gemms(after) if g["has_weight"]]
    activation_only = [g["name"] for g in weighted_gemms(before) if not g["has_weight"]]
    counts = op_counts(after)
    original = {g["name"]: g["op"] for g in weighted}

    def source(g: dict) -> dict:  # report a float Gemm under its original name and op
        name = g["name"].removesuffix("_MatMul")
        return {"name": name, "op": original[name]} if name in original else {"name": g["name"], "op": g["op"]}

    return {
        "weighted_gemms": len(weighted),
        "int8": len(weighted) - len(still_float),
        "kept_float": [source(g) for g in still_float],
        "activation_matmuls_float": len(activation_only),  # e.g. Q.K^T in unfused attention: no weight
        "int8_ops": {op: counts[op] for op in INT8_GEMM_OPS if counts.get(op)},
    }
