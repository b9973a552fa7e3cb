"""The dynamo exporter (``export: {exporter: dynamo}``) and the fusion step its graphs need.

``torch.onnx.export(..., dynamo=True)`` keeps transformers' scaled-dot-product attention as the
ops torch decomposes it into, which ONNX Runtime's Python optimizer does not match (no Attention
fuses; tests/test_passes.py proves it). onnxscript's ONNX Runtime fusion rewriter
(``onnxscript.rewriter.ort_fusions.optimize_for_ort``) is written for exactly these graphs: it
fuses BERT's attention into ``Attention`` and ModernBERT's into ``MultiHeadAttention`` plus
``RotaryEmbedding``. That rewrite runs in the fuse pass (:func:`onnxscript_fusions`, before ORT's
optimizer), not here, so the export stays an unfused graph and the fuse pass counts and times every
fusion as it does for the TorchScript path.

Input and output names and dynamic axes come from optimum's ONNX config for the model and task, so
the artifact loads in the same ``ORTModelFor...`` class as optimum's export.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

from xformopt.errors import InputError

EXPORTER_KEY = "xformopt.exporter"  # metadata_props entry the fuse pass reads
DYNAMO = "dynamo"
EXTRA_HINT = "pip install 'xformopt[dynamo]'"
WEIGHT_FOLD_LIMIT = 1 << 28  # elements: any packed weight of an encoder that fits in one protobuf


def require_onnxscript() -> None:
    try:
        import onnx_ir  # noqa: F401
        from onnxscript.rewriter.ort_fusions import optimize_for_ort  # noqa: F401
    except ImportError:
        raise InputError(f"the dynamo exporter needs onnxscript (its ONNX Runtime fusion rewriter): {EXTRA_HINT}") from None


def onnx_config(model, task: str):
    """optimum's ONNX config for ``model`` and ``task``: the input/output names ORTModel expects, with axes."""
    import optimum.exporters.onnx.model_configs  # noqa: F401  (registers the configs with TasksManager)
    from optimum.exporters.tasks import TasksManager

    constructor = TasksManager.get_exporter_config_constructor(
        "onnx", model, task=task, library_name="transformers")
    return constructor(model.config)


def export_dynamo(model, task: str, out_model: Path, opset: int) -> dict:
    """Export ``model`` with torch's dynamo exporter; returns the names used."""
    import torch

    require_onnxscript()
    config = onnx_config(model, task)
    dummy = config.generate_dummy_inputs(framework="pt")
    names = list(config.inputs)
    dummy = {name: dummy[name] for name in names}
    # the exporter prints its progress on stdout: kept off ours (the CLI may write JSON there)
    with warnings.catch_warnings(), torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            model, (), kwargs=dummy, input_names=names, output_names=list(config.outputs),
            dynamic_shapes={name: dict(axes) for name, axes in config.inputs.items()},
            opset_version=opset, dynamo=True, verbose=False,
        )
    program.save(str(out_model))
    _finish(out_model, list(config.outputs))
    return {"inputs": names, "outputs": list(config.outputs)}


def _finish(out_model: Path, outputs: list[str]) -> None:
    """Keep only the task's outputs (optimum's list: a BertModel also returns its pooler, which the
    TorchScript path drops and nobody reads) and record the exporter in the graph's metadata (the
    fuse pass runs onnxscript's fusions on these graphs)."""
    import onnx_ir as ir
    import onnx_ir.passes.common as common_passes

    model = ir.load(str(out_model))
    kept = [value for value in model.graph.outputs if value.name in outputs]
    model.graph.outputs.clear()
    model.graph.outputs.extend(kept)
    common_passes.RemoveUnusedNodesPass()(model)
    model.metadata_props[EXPORTER_KEY] = DYNAMO
    ir.save(model, str(out_model))


def is_dynamo_graph(model) -> bool:
    return any(p.key == EXPORTER_KEY and p.value == DYNAMO for p in model.metadata_props)


def onnxscript_fusions(src_model: Path, out_model: Path) -> dict[str, int]:
    """onnxscript's ORT fusions on a dynamo graph; returns its per-fusion counts (non-zero only)."""
    import onnx
    import onnx_ir as ir
    from onnxscript.optimizer import fold_constants, remove_unused_nodes
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    require_onnxscript()
    model = ir.load(str(src_model))
    model, counts = optimize_for_ort(model)
    # The Attention fusion packs q, k and v weights with a Concat that its folder leaves unfolded past
    # 8192 elements (every real model): folded here, or the packed weight is rebuilt, and quantized
    # dynamically, at every call (MiniLM INT8 at batch 1: 1.3x slower than the TorchScript path).
    fold_constants(model, input_size_limit=WEIGHT_FOLD_LIMIT, output_size_limit=WEIGHT_FOLD_LIMIT)
    remove_unused_nodes(model)
    proto = ir.to_proto(model)
    per_row_rotary_positions(proto)
    if quantizable_attention(proto):
        remove_unused_nodes(proto)  # the additive mask it replaced
    onnx.save(proto, str(out_model))
    return {name: n for name, n in counts.items() if n}


def per_row_rotary_positions(model) -> int:
    """Expand a RotaryEmbedding's ``position_ids`` of shape (1, S) to (batch, S).

    onnxscript's rotary fusion passes the model's ``arange(S).unsqueeze(0)`` through, but ORT's
    RotaryEmbedding kernel takes 2-D position ids only at the batch size (batch 2 fails with
    "position_ids dimension 0 should be of size batch_size")."""
    import onnx
    from onnx import helper

    inferred = onnx.shape_inference.infer_shapes(model)
    first_dim = {}
    for info in (*inferred.graph.value_info, *model.graph.input):
        dims = info.type.tensor_type.shape.dim
        if len(dims) == 2:
            first_dim[info.name] = dims[0].dim_value if dims[0].HasField("dim_value") else None
    nodes, expanded = [], {}
    for node in model.graph.node:
        if node.op_type == "RotaryEmbedding" and len(node.input) > 1 and first_dim.get(node.input[1]) == 1:
            pos = node.input[1]
            if pos not in expanded:
                out = f"{pos}/per_row"
                nodes += [
                    helper.make_node("Shape", [node.input[0]], [out + "/batch"], start=0, end=1),
                    helper.make_node("Shape", [pos], [out + "/length"], start=1),
                    helper.make_node("Concat", [out + "/batch", out + "/length"], [out + "/shape"], axis=0),
                    helper.make_node("Expand", [pos, out + "/shape"], [out]),
                ]
                expanded[pos] = out
            node.input[1] = expanded[pos]
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return len(expanded)


def add_missing_layernorm_bias(model) -> int:
    """Give every bias-less LayerNormalization an explicit zero bias.

    ModernBERT's layer norms have no bias (``norm_bias=False``); ORT's SkipLayerNormalization fusion
    indexes the bias input unconditionally and crashes on them. A zero bias is the same function."""
    import numpy as np
    from onnx import numpy_helper

    initializers = {i.name: i for i in model.graph.initializer}
    added = 0
    for node in model.graph.node:
        if node.op_type == "LayerNormalization" and len(node.input) == 2 and node.input[1] in initializers:
            name = f"{node.input[1]}/zero_bias"
            if name not in initializers:
                scale = numpy_helper.to_array(initializers[node.input[1]])
                initializers[name] = numpy_helper.from_array(np.zeros_like(scale), name)
                model.graph.initializer.append(initializers[name])
            node.input.append(name)
            added += 1
    return added


# Ops a key-padding mask is built from (casts, broadcasts, 1 - mask, where): no positions (Range,
# comparisons, Abs: a sliding window or causal mask) and no arithmetic that could carry a bias.
_PADDING_MASK_OPS = {"Cast", "Where", "Sub", "Mul", "Not", "Equal", "Expand", "Unsqueeze", "Squeeze", "Reshape",
                     "Slice", "Concat", "Constant", "ConstantOfShape", "Identity"}


def _padding_mask_of(model, bias: str, mask_input: str) -> bool:
    """True when ``bias`` is built from ``mask_input`` alone through padding-mask ops (shapes aside)."""
    producer = {out: node for node in model.graph.node for out in node.output}
    small = {i.name for i in model.graph.initializer if len(i.dims) <= 1}
    inputs = {i.name for i in model.graph.input}
    stack, seen, found = [bias], set(), False
    while stack:
        name = stack.pop()
        if not name or name in seen:
            continue
        seen.add(name)
        if name == mask_input:
            found = True
        elif name in inputs or (name not in producer and name not in small):
            return False  # another input's values, or a weight tensor
        elif name in producer:
            node = producer[name]
            if node.op_type == "Shape":
                continue  # only a shape: any input may size the mask
            if node.op_type not in _PADDING_MASK_OPS:
                return False
            stack.extend(node.input)
    return found


def quantizable_attention(model, mask_input: str = "attention_mask") -> int:
    """Give onnxscript's fused ``Attention`` the inputs ORT's own BERT fusion gives it, so ORT's
    quantizer turns it into ``QAttention`` as on the TorchScript path.

    onnxscript writes ``qkv_hidden_sizes`` even when q, k and v are equal (ORT's quantizer leaves any
    Attention with that attribute float) and passes the key-padding mask as an additive
    ``attention_bias`` (QAttention has no such input). Equal sizes drop the attribute; a bias that is
    the padding mask alone becomes ``mask_index`` (the int32 mask, ORT's 2-D form). Anything else
    (a sliding window, a relative-position bias) is left as it is."""
    from onnx import TensorProto, helper

    cast_name = f"{mask_input}/int32"
    changed, nodes = 0, []
    has_mask = any(i.name == mask_input for i in model.graph.input)
    for node in model.graph.node:
        if node.op_type == "Attention" and node.domain == "com.microsoft":
            sizes = next((a for a in node.attribute if a.name == "qkv_hidden_sizes"), None)
            if sizes is not None and len(set(sizes.ints)) == 1:
                node.attribute.remove(sizes)
            inputs = list(node.input)
            if (has_mask and len(inputs) > 5 and inputs[5] and not (len(inputs) > 3 and inputs[3])
                    and _padding_mask_of(model, inputs[5], mask_input)):
                if not changed:
                    nodes.append(helper.make_node("Cast", [mask_input], [cast_name], to=TensorProto.INT32))
                inputs = (inputs + [""] * 4)[:4]
                inputs[3] = cast_name
                del node.input[:]
                node.input.extend(inputs)
                changed += 1
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return changed
