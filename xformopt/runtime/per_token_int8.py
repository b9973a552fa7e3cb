"""Dynamic INT8 with one activation scale per token instead of one per tensor, so that a row's answer
does not depend on the other rows of its batch (or on their padding).

ONNX Runtime's dynamic quantization (``DynamicQuantizeLinear`` -> ``MatMulInteger``) computes one
scale and zero point over the whole activation tensor: in a batch, the row with the largest values
sets the scale for every other row. Served in batches, all-MiniLM-L6-v2 INT8 embeddings then have
cosine 0.97-0.999 to the same text served alone (README, "Serving"). Each ``DynamicQuantizeLinear``
is rewritten as: scale = max|x| / 127 over the last axis (one per token), q = clip(round(x / scale)
+ 128, 0, 255) as uint8, zero point 128 (a scalar, which ``MatMulInteger`` takes). The downstream
``Mul`` of activation scale by weight scale broadcasts the per-token scale unchanged. The weights and
the integer matmuls stay as they are. Symmetric per-token ranges trade the asymmetric zero point
for a scale that fits each token.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

EPS = 1e-8


def rewrite(model) -> int:
    """Rewrite every DynamicQuantizeLinear of ``model`` (an onnx ModelProto) in place; returns how many."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    # Only where every consumer takes a per-token scale: MatMulInteger (the uint8 values, the scalar zero
    # point) and the Mul that combines activation and weight scales. Fused quantized ops (QAttention,
    # DynamicQuantizeMatMul) take a per-tensor scale only; their inputs stay as exported.
    consumers: dict[str, set[str]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, set()).add(node.op_type)
    targets = [n for n in graph.node if n.op_type == "DynamicQuantizeLinear" and n.domain in ("", "ai.onnx")
               and consumers.get(n.output[0], set()) <= {"MatMulInteger"}
               and consumers.get(n.output[1], set()) <= {"Mul"}
               and consumers.get(n.output[2], set()) <= {"MatMulInteger"}]
    if not targets:
        return 0
    consts = {"pt_eps": np.float32(EPS), "pt_127": np.float32(127.0), "pt_128": np.float32(128.0),
              "pt_0": np.float32(0.0), "pt_255": np.float32(255.0)}
    names = {i.name for i in graph.initializer}
    for name, value in consts.items():
        if name not in names:
            graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    nodes = list(graph.node)
    del graph.node[:]
    for node in nodes:
        if node not in targets:
            graph.node.append(node)
            continue
        x, (y, scale, zero) = node.input[0], node.output
        p = (node.name or y) + "/per_token"
        graph.initializer.append(numpy_helper.from_array(np.asarray(128, dtype=np.uint8), zero))
        graph.node.extend([
            helper.make_node("Abs", [x], [f"{p}/abs"], name=f"{p}/Abs"),
            helper.make_node("ReduceMax", [f"{p}/abs"], [f"{p}/amax"], name=f"{p}/ReduceMax", axes=[-1], keepdims=1),
            helper.make_node("Max", [f"{p}/amax", "pt_eps"], [f"{p}/amax_eps"], name=f"{p}/Max"),
            helper.make_node("Div", [f"{p}/amax_eps", "pt_127"], [scale], name=f"{p}/Scale"),
            helper.make_node("Div", [x, scale], [f"{p}/scaled"], name=f"{p}/Div"),
            helper.make_node("Round", [f"{p}/scaled"], [f"{p}/round"], name=f"{p}/Round"),
            helper.make_node("Add", [f"{p}/round", "pt_128"], [f"{p}/shift"], name=f"{p}/Add"),
            helper.make_node("Clip", [f"{p}/shift", "pt_0", "pt_255"], [f"{p}/clip"], name=f"{p}/Clip"),
            helper.make_node("Cast", [f"{p}/clip"], [y], name=f"{p}/Cast", to=TensorProto.UINT8),
        ])
    if any(opset.domain in ("", "ai.onnx") and opset.version >= 18 for opset in model.opset_import):
        for node in graph.node:  # opset 18 moved ReduceMax's axes from an attribute to an input
            if node.op_type == "ReduceMax" and node.name.endswith("/per_token/ReduceMax"):
                del node.attribute[:]
                node.attribute.append(helper.make_attribute("keepdims", 1))
                node.input.append("pt_axes")
        graph.initializer.append(numpy_helper.from_array(np.asarray([-1], dtype=np.int64), "pt_axes"))
    return len(targets)


def has_dynamic_int8(model_path: Path) -> bool:
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    return any(n.op_type in PER_TENSOR_OPS for n in graph.node)


# ops that quantize activations with one scale per tensor at run time
PER_TENSOR_OPS = ("DynamicQuantizeLinear", "QAttention", "DynamicQuantizeMatMul")


def remaining_per_tensor(model) -> int:
    """Ops of ``model`` that still quantize with one scale per tensor after ``rewrite``."""
    return sum(1 for n in model.graph.node if n.op_type in PER_TENSOR_OPS)


# ORT's MatMulIntegerToFloat fusion assumes one activation scale per tensor: fused over a per-token
# scale it computes wrong values (measured: cosine 0.79 to the unfused graph), so sessions over the
# rewritten graph leave it out.
DISABLED_OPTIMIZERS = ("MatMulIntegerToFloatFusion",)


def rewritten_copy(model_path: Path, directory: Path) -> tuple[Path, int]:
    """``directory``/model.onnx: the per-token rewrite of ``model_path`` (the user's file is not touched)."""
    import onnx

    model = onnx.load(str(model_path))
    count = rewrite(model)
    out = Path(directory) / "model.onnx"
    onnx.save(model, str(out))
    return out, count
