"""Dynamic INT8 with one activation scale per token instead of one per tensor, so that a row's answer
does not depend on the other rows of its batch (or on their padding).

ONNX Runtime's dynamic quantization computes one scale and zero point over the whole activation
tensor: in a batch, the row with the largest values sets the scale for every other row. Served in
batches, all-MiniLM-L6-v2 INT8 embeddings then have cosine 0.97-0.999 to the same text served alone
(docs/results/serving.md). Three kinds of node quantize that way, and each is rewritten:

- ``DynamicQuantizeLinear`` feeding ``MatMulInteger``: scale = max|x| / 127 over the last axis (one
  per token), q = clip(round(x / scale) + 128, 0, 255) as uint8, zero point 128 (a scalar, which
  ``MatMulInteger`` takes). The downstream ``Mul`` of activation by weight scale broadcasts the
  per-token scale unchanged. Symmetric per-token ranges trade the asymmetric zero point for a scale
  that fits each token.
- ``QAttention`` (the fused attention's QKV projection, quantized with one scale for its input):
  ``attention="per-token"`` quantizes its input per token as above, runs the projection as
  ``MatMulInteger`` with the same INT8 weights and feeds Q, K, V to the float ``MultiHeadAttention``
  op; ``attention="float"`` dequantizes the QKV weights once and runs the float ``Attention`` op.
  Which is served is chosen by measurement (docs/results/serving.md).
- ``DynamicQuantizeMatMul``: per-token quantization, ``MatMulInteger``, scales and bias as floats.

The weights stay the INT8 values the artifact holds; only how activations are quantized changes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

EPS = 1e-8
ATTENTION_MODES = ("per-token", "float")
DEFAULT_ATTENTION = "per-token"


class _Builder:
    """Adds nodes and initializers to a graph under unique names."""

    def __init__(self, model):
        from onnx import numpy_helper

        self.graph = model.graph
        self._to_tensor = numpy_helper.from_array
        self.names = {i.name for i in self.graph.initializer}
        self.opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=13)
        if not any(o.domain == "com.microsoft" for o in model.opset_import):
            from onnx import helper

            model.opset_import.append(helper.make_opsetid("com.microsoft", 1))

    def const(self, name: str, value) -> str:
        if name not in self.names:
            self.graph.initializer.append(self._to_tensor(np.asarray(value), name))
            self.names.add(name)
        return name

    def per_token(self, x: str, y: str, scale: str, prefix: str) -> list:
        """Nodes quantizing float ``x`` per token: ``y`` uint8 with zero point 128, ``scale`` (..., 1)."""
        from onnx import TensorProto, helper

        p = prefix + "/per_token"
        eps, c127 = self.const("pt_eps", np.float32(EPS)), self.const("pt_127", np.float32(127.0))
        c128, c0 = self.const("pt_128", np.float32(128.0)), self.const("pt_0", np.float32(0.0))
        c255 = self.const("pt_255", np.float32(255.0))
        if self.opset >= 18:  # opset 18 moved ReduceMax's axes from an attribute to an input
            reduce = helper.make_node("ReduceMax", [f"{p}/abs", self.const("pt_axes", np.array([-1], np.int64))],
                                      [f"{p}/amax"], name=f"{p}/ReduceMax", keepdims=1)
        else:
            reduce = helper.make_node("ReduceMax", [f"{p}/abs"], [f"{p}/amax"], name=f"{p}/ReduceMax", axes=[-1],
                                      keepdims=1)
        return [
            helper.make_node("Abs", [x], [f"{p}/abs"], name=f"{p}/Abs"),
            reduce,
            helper.make_node("Max", [f"{p}/amax", eps], [f"{p}/amax_eps"], name=f"{p}/Max"),
            helper.make_node("Div", [f"{p}/amax_eps", c127], [scale], name=f"{p}/Scale"),
            helper.make_node("Div", [x, scale], [f"{p}/scaled"], name=f"{p}/Div"),
            helper.make_node("Round", [f"{p}/scaled"], [f"{p}/round"], name=f"{p}/Round"),
            helper.make_node("Add", [f"{p}/round", c128], [f"{p}/shift"], name=f"{p}/Add"),
            helper.make_node("Clip", [f"{p}/shift", c0, c255], [f"{p}/clip"], name=f"{p}/Clip"),
            helper.make_node("Cast", [f"{p}/clip"], [y], name=f"{p}/Cast", to=TensorProto.UINT8),
        ]

    def int8_matmul(self, x: str, weight: str, weight_zero: str, weight_scale: str, out: str, prefix: str) -> list:
        """float ``x`` @ the INT8 ``weight`` (an initializer, (K, N)) with per-token activation scales ->
        float ``out`` (no bias). Tokens are flattened to rows so that QuantizeLinear and DequantizeLinear
        does the rounding, clipping and cast in one pass (per-axis scales), instead of one elementwise
        op per step."""
        from onnx import TensorProto, helper

        p = prefix + "/per_token_mm"
        width = self.weight_columns(weight)
        eps, inv127 = self.const("pt_eps", np.float32(EPS)), self.const("pt_inv127", np.float32(1 / 127))
        flat, zero = self.const("pt_flat", np.array([-1], np.int64)), self.const("pt_zero_u8", np.uint8(128))
        head = self.const("pt_head", np.array([0], np.int64)), self.const("pt_last", np.array([-1], np.int64))
        columns = self.const(f"pt_columns_{width}", np.array([width], np.int64))
        axes = [self.const("pt_axes", np.array([-1], np.int64))] if self.opset >= 18 else []
        reduce_attrs = {} if self.opset >= 18 else {"axes": [-1]}
        one = self.const("pt_one", np.float32(1.0))
        mm_inputs = [f"{p}/q", weight, one, weight_scale, zero] + ([weight_zero] if weight_zero else [])
        return [
            helper.make_node("Flatten", [x], [f"{p}/rows"], name=f"{p}/Flatten", axis=-1),
            helper.make_node("Abs", [f"{p}/rows"], [f"{p}/abs"], name=f"{p}/Abs"),
            helper.make_node("ReduceMax", [f"{p}/abs", *axes], [f"{p}/amax"], name=f"{p}/ReduceMax", keepdims=1,
                             **reduce_attrs),
            helper.make_node("Max", [f"{p}/amax", eps], [f"{p}/amax_eps"], name=f"{p}/Max"),
            helper.make_node("Mul", [f"{p}/amax_eps", inv127], [f"{p}/scale"], name=f"{p}/Scale"),
            helper.make_node("Reshape", [f"{p}/scale", flat], [f"{p}/scale_flat"], name=f"{p}/ScaleFlat"),
            helper.make_node("Shape", [f"{p}/scale_flat"], [f"{p}/tokens"], name=f"{p}/Tokens"),
            helper.make_node("ConstantOfShape", [f"{p}/tokens"], [f"{p}/zeros"], name=f"{p}/Zeros",
                             value=helper.make_tensor("v", TensorProto.UINT8, [1], [128])),
            helper.make_node("QuantizeLinear", [f"{p}/rows", f"{p}/scale_flat", f"{p}/zeros"], [f"{p}/q"],
                             name=f"{p}/Quantize", axis=0),
            # ORT's fused integer GEMM with the weight scales applied; its activation scale is 1 (a scalar,
            # as the op requires): the per-token scales are applied after it, per row
            helper.make_node("MatMulIntegerToFloat", mm_inputs, [f"{p}/columns"], name=f"{p}/MatMulIntegerToFloat",
                             domain="com.microsoft"),
            helper.make_node("Mul", [f"{p}/columns", f"{p}/scale"], [f"{p}/out_rows"], name=f"{p}/TokenScale"),
            helper.make_node("Shape", [x], [f"{p}/in_shape"], name=f"{p}/InShape"),
            helper.make_node("Slice", [f"{p}/in_shape", head[0], head[1]], [f"{p}/lead"], name=f"{p}/Lead"),
            helper.make_node("Concat", [f"{p}/lead", columns], [f"{p}/out_shape"], name=f"{p}/OutShape", axis=0),
            helper.make_node("Reshape", [f"{p}/out_rows", f"{p}/out_shape"], [out], name=f"{p}/Reshape"),
        ]

    def weight_columns(self, weight: str) -> int:
        for init in self.graph.initializer:
            if init.name == weight and len(init.dims) == 2:
                return int(init.dims[1])
        raise _Unmatched(f"{weight} is not a 2-D initializer")


class _Unmatched(Exception):
    """A node in a form the rewrite does not know: it is left as exported (and counted as remaining)."""


def _consumers(graph) -> dict[str, list]:
    out: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            out.setdefault(name, []).append(node)
    return out


def _attributes(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _quantized_input(node, producers) -> str | None:
    """The float tensor a DynamicQuantizeLinear made ``node``'s input 0 (and scale, zero point) from."""
    source = producers.get(node.input[0])
    if source is None or source.op_type != "DynamicQuantizeLinear" or list(source.output)[1:] != [
            node.input[3], node.input[6] if len(node.input) > 6 else None]:
        return None
    return source.input[0]


def _qattention(builder: _Builder, node, producers, attention: str) -> list | None:
    """Nodes replacing one QAttention (None: a form this rewrite does not know; it stays as exported)."""
    from onnx import helper, numpy_helper

    attrs = _attributes(node)
    inputs = list(node.input) + [""] * (9 - len(node.input))
    x = _quantized_input(node, producers)
    if x is None or inputs[8] or attrs.get("do_rotary") or attrs.get("past_present_share_buffer") \
            or len(node.output) > 1 and node.output[1]:
        return None
    weight, bias, weight_scale, mask, weight_zero = inputs[1], inputs[2], inputs[4], inputs[5], inputs[7]
    p = (node.name or node.output[0]) + "/batch_independent"
    kept = {k: v for k, v in attrs.items() if k in ("num_heads", "mask_filter_value", "scale", "unidirectional")}
    if attention == "float":
        inits = {i.name: i for i in builder.graph.initializer}
        if weight not in inits or weight_scale not in inits or (weight_zero and weight_zero not in inits):
            return None
        w = numpy_helper.to_array(inits[weight]).astype(np.float32)
        zero = numpy_helper.to_array(inits[weight_zero]).astype(np.float32) if weight_zero else np.float32(0)
        w = ((w - zero) * numpy_helper.to_array(inits[weight_scale]).astype(np.float32)).astype(np.float32)
        w_name = builder.const(f"{p}/weight_float", w)
        return [helper.make_node("Attention", [x, w_name, bias, mask], [node.output[0]], name=f"{p}/Attention",
                                 domain="com.microsoft", **kept)]
    qkv = f"{p}/qkv"
    nodes = builder.int8_matmul(x, weight, weight_zero, weight_scale, qkv, p)
    # equal thirds: QAttention's weight columns are [Q | K | V]
    nodes.append(helper.make_node("Split", [qkv], [f"{p}/q", f"{p}/k", f"{p}/v"], name=f"{p}/Split", axis=-1,
                                  **({"num_outputs": 3} if builder.opset >= 18 else {})))
    mha_inputs = [f"{p}/q", f"{p}/k", f"{p}/v", bias, mask]
    if not kept.get("unidirectional"):
        kept.pop("unidirectional", None)
    nodes.append(helper.make_node("MultiHeadAttention", mha_inputs, [node.output[0]], name=f"{p}/MultiHeadAttention",
                                  domain="com.microsoft", **kept))
    return nodes


def _dynamic_quantize_matmul(builder: _Builder, node) -> list:
    from onnx import helper

    inputs = list(node.input) + [""] * (5 - len(node.input))
    a, weight, weight_scale, weight_zero, bias = inputs
    p = (node.name or node.output[0]) + "/batch_independent"
    if not bias:
        return builder.int8_matmul(a, weight, weight_zero, weight_scale, node.output[0], p)
    return builder.int8_matmul(a, weight, weight_zero, weight_scale, f"{p}/nobias", p) + [
        helper.make_node("Add", [f"{p}/nobias", bias], [node.output[0]], name=f"{p}/Bias")]


def _matmul_integer(builder: _Builder, node, producers, consumers) -> tuple[list, list]:
    """ORT's dynamic MatMul: DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul(by activation scale x
    weight scale). Returns (new nodes, old nodes they replace besides ``node``)."""
    source = producers.get(node.input[0])
    if source is None or source.op_type != "DynamicQuantizeLinear" or len(node.input) < 3 \
            or node.input[2] != source.output[2]:
        raise _Unmatched("not fed by a DynamicQuantizeLinear")
    cast = consumers.get(node.output[0], [])
    mul = consumers.get(cast[0].output[0], []) if len(cast) == 1 and cast[0].op_type == "Cast" else []
    if len(mul) != 1 or mul[0].op_type != "Mul":
        raise _Unmatched("no Cast -> Mul after the MatMulInteger")
    cast, mul = cast[0], mul[0]
    scales = producers.get(next(i for i in mul.input if i != cast.output[0]))
    if scales is None or scales.op_type != "Mul" or source.output[1] not in scales.input:
        raise _Unmatched("the output is not scaled by activation scale x weight scale")
    weight_scale = next(i for i in scales.input if i != source.output[1])
    weight_zero = node.input[3] if len(node.input) > 3 else ""
    p = (node.name or node.output[0]) + "/batch_independent"
    return builder.int8_matmul(source.input[0], node.input[1], weight_zero, weight_scale, mul.output[0], p), [cast, mul]


def rewrite(model, attention: str = DEFAULT_ATTENTION) -> int:
    """Rewrite every per-tensor dynamic quantization of ``model`` (an onnx ModelProto) in place, as the
    module docstring says; returns how many nodes were rewritten (``remaining_per_tensor`` tells what
    stayed)."""
    if attention not in ATTENTION_MODES:
        raise ValueError(f"attention {attention!r}: one of {ATTENTION_MODES}")
    graph = model.graph
    builder = _Builder(model)
    producers = {out: n for n in graph.node for out in n.output}
    consumers = _consumers(graph)
    kinds = {name: {n.op_type for n in nodes} for name, nodes in consumers.items()}
    replaced: dict[int, list] = {}
    count = 0
    for node in list(graph.node):
        if id(node) in replaced:
            continue
        try:
            if node.domain == "com.microsoft" and node.op_type == "QAttention":
                new = _qattention(builder, node, producers, attention)
            elif node.domain == "com.microsoft" and node.op_type == "DynamicQuantizeMatMul":
                new = _dynamic_quantize_matmul(builder, node)
            elif node.op_type == "MatMulInteger" and node.domain in ("", "ai.onnx"):
                new, absorbed = _matmul_integer(builder, node, producers, consumers)
                replaced.update({id(n): [] for n in absorbed})
            else:
                continue
        except _Unmatched:
            continue
        if new is not None:
            replaced[id(node)] = new
            count += 1
    for node in graph.node:
        # A DynamicQuantizeLinear still feeding MatMulInteger in another form: per-token in place, where
        # every consumer takes a per-token scale (the uint8 values and scalar zero point: MatMulInteger;
        # the scale: the Mul that combines activation and weight scales).
        if node.op_type == "DynamicQuantizeLinear" and node.domain in ("", "ai.onnx") and id(node) not in replaced \
                and not any(id(c) in replaced for out in node.output for c in consumers.get(out, [])) \
                and kinds.get(node.output[0], set()) <= {"MatMulInteger"} \
                and kinds.get(node.output[1], set()) <= {"Mul"} and kinds.get(node.output[2], set()) <= {"MatMulInteger"}:
            y, scale, zero = node.output
            builder.const(zero, np.uint8(128))
            replaced[id(node)] = builder.per_token(node.input[0], y, scale, node.name or y)
            count += 1
    if not replaced:
        return 0
    nodes = list(graph.node)
    del graph.node[:]
    for node in nodes:
        graph.node.extend(replaced.get(id(node), [node]))
    _drop_dead(graph)
    return count


def _drop_dead(graph) -> None:
    """Nodes none of whose outputs is read any more (the quantizers and scale products the rewrite
    bypassed), and initializers no node reads (e.g. QKV weights dequantized to float)."""
    outputs = {o.name for o in graph.output}
    while True:
        used = {name for node in graph.node for name in node.input} | outputs
        dead = [n for n in graph.node if not any(o in used for o in n.output if o)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    used = {name for node in graph.node for name in node.input} | outputs
    for init in [i for i in graph.initializer if i.name not in used]:
        graph.initializer.remove(init)


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


def rewritten_copy(model_path: Path, directory: Path, attention: str = DEFAULT_ATTENTION) -> tuple[Path, int]:
    """``directory``/model.onnx: the per-token rewrite of ``model_path`` (the user's file is not touched)."""
    import onnx

    model = onnx.load(str(model_path))
    count = rewrite(model, attention)
    out = Path(directory) / "model.onnx"
    onnx.save(model, str(out))
    return out, count
