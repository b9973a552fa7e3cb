"""The encoder exporter: torch's exporters with the graph's names and axes from the Task.

``torch.onnx.export(..., dynamo=True)`` keeps transformers' scaled-dot-product attention as the
ops torch decomposes it into, which ONNX Runtime's Python optimizer does not match (no Attention
fuses; tests/passes/test_passes.py proves it). onnxscript's ONNX Runtime fusion rewriter
(``onnxscript.rewriter.ort_fusions.optimize_for_ort``) is written for exactly these graphs: it
fuses BERT's attention into ``Attention`` and ModernBERT's into ``MultiHeadAttention`` (its rotary into
``RotaryEmbedding`` by xformopt's own rule, xformopt/fusions/rotary.py). That rewrite runs in the fuse pass (:func:`onnxscript_fusions`, before ORT's
optimizer), not here, so the export stays an unfused graph and the fuse pass counts and times every
fusion.

Input and output names and dynamic axes come from the Task (``export_outputs``, ``input_axes``) and
the model's own forward(): the names optimum's exporter wrote, so artifacts keep the interface their
clients read. Written here rather than taken from optimum: optimum-onnx pins transformers below 5.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import re
import threading
import warnings
from pathlib import Path

from xformopt.errors import InputError

EXPORTER_KEY = "xformopt.exporter"  # metadata_props entry the fuse pass reads
DYNAMO = "dynamo"
TORCHSCRIPT = "torchscript"
_REWRITER_LOCK = threading.Lock()
WEIGHT_FOLD_LIMIT = 1 << 28  # elements: any packed weight of an encoder that fits in one protobuf
# torch.export specialises a dimension of size 0 or 1 to a constant: trace with 2 rows and a length
# that is neither (parity then checks batch 1 and padded batches, xformopt/passes/export/run.py).
TRACE_BATCH, TRACE_LENGTH = 2, 16


def require_onnxscript() -> None:
    try:
        import onnx_ir  # noqa: F401
        from onnxscript.rewriter.ort_fusions import optimize_for_ort  # noqa: F401
    except ImportError:
        raise InputError("the exporter needs onnxscript (its ONNX Runtime fusion rewriter): "
                         "pip install 'onnxscript>=0.7'") from None


def graph_inputs(model) -> list[str]:
    """The text inputs the graph takes: ``input_ids`` and ``attention_mask`` where forward() takes them,
    ``token_type_ids`` only where the config has more than one token type (DeBERTa-v3 and RoBERTa have
    none worth an input: their tokenizers' zeros would select the only row)."""
    accepts = inspect.signature(model.forward).parameters
    names = [name for name in ("input_ids", "attention_mask") if name in accepts]
    if "token_type_ids" in accepts and int(getattr(model.config, "type_vocab_size", 0) or 0) > 1:
        names.append("token_type_ids")
    if "input_ids" not in names:
        raise InputError(f"{type(model).__name__}.forward takes no input_ids; xformopt exports text models")
    return names


def trace_inputs(model, names: list[str], axes: tuple[str, ...]) -> dict:
    """Inputs to trace with: real token ids of the vocabulary, the second row right-padded."""
    import torch

    config = model.config
    limit = getattr(config, "max_position_embeddings", None) or TRACE_LENGTH + 8
    length = max(3, min(TRACE_LENGTH, int(limit) - 4))  # room for RoBERTa-style position offsets
    shape = (TRACE_BATCH,) * (len(axes) - 1) + (length,)  # multiple choice: (batch, choices, length)
    generator = torch.Generator().manual_seed(0)
    vocab = int(getattr(config, "vocab_size", 100) or 100)
    ids = torch.randint(min(5, vocab - 1), vocab, shape, generator=generator)
    mask = torch.ones(shape, dtype=torch.int64)
    mask[1, ..., -3:] = 0
    values = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros(shape, dtype=torch.int64)}
    return {name: values[name] for name in names}


def export_encoder(model, task, out_model: Path, opset: int, exporter: str = DYNAMO) -> dict:
    """Export ``model`` (eval mode) for ``task`` with torch's ``exporter`` (``dynamo`` or ``torchscript``);
    returns the names used."""
    import torch

    names = graph_inputs(model)
    inputs = trace_inputs(model, names, task.input_axes)
    axes = {name: dict(enumerate(task.input_axes)) for name in names}
    outputs = list(task.export_outputs)
    with warnings.catch_warnings(), torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        # (the exporter prints its progress on stdout: kept off ours, where the CLI may write JSON)
        warnings.simplefilter("ignore")
        if exporter == DYNAMO:
            require_onnxscript()
            program = torch.onnx.export(model, (), kwargs=inputs, input_names=names, output_names=outputs,
                                        dynamic_shapes=axes, opset_version=opset, dynamo=True, verbose=False)
            program.save(str(out_model))
        else:  # the TorchScript tracer: a fallback for models torch.export cannot trace
            torch.onnx.export(model, (), str(out_model), kwargs=inputs, input_names=names, output_names=outputs,
                              dynamic_axes=axes, opset_version=opset, do_constant_folding=True, dynamo=False)
    _finish(out_model, outputs, exporter)
    return {"inputs": names, "outputs": outputs}


def _finish(out_model: Path, outputs: list[str], exporter: str) -> None:
    """Keep only the task's outputs (a BertModel also returns its pooler, which nobody reads) and record
    the exporter in the graph's metadata (the fuse pass runs onnxscript's fusions on dynamo graphs)."""
    import onnx_ir as ir
    import onnx_ir.passes.common as common_passes

    model = ir.load(str(out_model))
    kept = [value for value in model.graph.outputs if value.name in outputs]
    model.graph.outputs.clear()
    model.graph.outputs.extend(kept)
    common_passes.RemoveUnusedNodesPass()(model)
    if exporter == DYNAMO:
        scoped_node_names(model.graph)
    model.metadata_props[EXPORTER_KEY] = exporter
    ir.save(model, str(out_model))


NAME_SCOPES = "pkg.torch.onnx.name_scopes"  # the module path torch's dynamo exporter records per node


def scoped_node_names(graph) -> int:
    """Name every node after the module that made it, as the TorchScript exporter did
    (``/encoder/layer.0/attention/self/query/MatMul``, then ``_1``, ``_2`` for repeats), from the scope the
    dynamo exporter records in each node's metadata. The dynamo exporter's own names (``node_linear_3``)
    say nothing of the module; xformopt's node-name rules (INT8 outlier treatments, kept-float lists,
    int4 roles, reports) and users' ``exclude_nodes`` read the module path. Returns how many were named."""
    import ast

    used: dict[str, int] = {}
    named = 0
    for node in graph:
        scopes = node.metadata_props.get(NAME_SCOPES)
        try:
            parts = ast.literal_eval(scopes) if scopes else None
        except (ValueError, SyntaxError):
            parts = None
        if not isinstance(parts, list) or len(parts) < 2:
            continue
        # ['', 'encoder', 'encoder.layer.0', ..., op]: each level adds one child name (``layer.0``)
        modules = [p for p in parts[:-1] if isinstance(p, str)]
        segments = [child[len(parent) + 1:] if parent else child for parent, child in zip(modules, modules[1:])]
        base = "/" + "/".join([*filter(None, segments), node.op_type])
        count = used.get(base, 0)
        used[base] = count + 1
        node.name = base if count == 0 else f"{base}_{count}"
        named += 1
    return named


def is_dynamo_graph(model) -> bool:
    return any(p.key == EXPORTER_KEY and p.value == DYNAMO for p in model.metadata_props)


def onnxscript_fusions(src_model: Path, out_model: Path, rotary: bool = False) -> dict[str, int]:
    """onnxscript's ORT fusions on a dynamo graph, then with ``rotary`` xformopt's rule for transformers 5's rotary;
    returns the per-fusion counts (non-zero only)."""
    import onnx
    import onnx_ir as ir
    from onnxscript.optimizer import fold_constants, remove_unused_nodes
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    from xformopt.fusions import rotary as rotary_fusion

    require_onnxscript()
    model = ir.load(str(src_model))
    canonical_product_dims(model)
    with _REWRITER_LOCK:  # onnxscript's rewriter keeps module-level state: two fusions at once break it
        model, counts = optimize_for_ort(model)
        if rotary:  # transformers 5's rotary, which onnxscript's rules leave as plain ops (xformopt/fusions/rotary.py)
            counts["transformers_rotary_embedding"] = rotary_fusion.fuse(model)
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


_PRODUCT_DIM = re.compile(r"\w+(\*\w+)+")


def canonical_product_dims(model) -> int:
    """Write every symbolic dimension that is a product of names with its factors sorted.

    torch's exporter names a flattened axis after the order it multiplied in: a multiple-choice model's
    embeddings are ``num_choices*batch_size`` and its attention output ``batch_size*num_choices``, the
    same size. onnxscript's rules compare shapes by name (its SkipLayerNorm fusion then leaves the first
    residual Add of a DeBERTa multiple-choice model unfused). Returns how many values changed."""
    import onnx_ir as ir

    changed = 0
    for value in (*model.graph.inputs, *(out for node in model.graph for out in node.outputs)):
        if value.shape is None:
            continue
        dims = [ir.SymbolicDim("*".join(sorted(d.value.split("*"))))
                if isinstance(d, ir.SymbolicDim) and d.value and _PRODUCT_DIM.fullmatch(d.value) else d
                for d in value.shape.dims]
        if dims != list(value.shape.dims):
            value.shape = ir.Shape(dims)
            changed += 1
    return changed


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
                     "Slice", "Concat", "Constant", "ConstantOfShape", "Identity",
                     # transformers 5 builds the bidirectional padding mask by index: kv_idx >= 0 and
                     # mask[batch, kv_idx] (Range, GatherND, And); no Abs, Less or LessOrEqual (a window, causality)
                     "Range", "GatherND", "And", "GreaterOrEqual", "Max"}


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
    the padding mask alone becomes ``mask_index`` in its 1-D form, each row's length, as ORT's own
    fusion passes it (QAttention misreads the 2-D form in padded batches: INT8 cosine 0.82 against 0.99
    on MiniLM at batch 32). Anything else (a sliding window, a relative-position bias) is left as it is."""
    from onnx import TensorProto, helper

    cast_name = f"{mask_input}/lengths_int32"
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
                if not changed:  # the 1-D form: each row's length (right padding, as BERT tokenizers pad)
                    axes = helper.make_tensor(f"{mask_input}/axes", TensorProto.INT64, [1], [1])
                    nodes += [helper.make_node("Constant", [], [axes.name], value=axes),
                              helper.make_node("ReduceSum", [mask_input, axes.name], [f"{mask_input}/lengths"],
                                               keepdims=0),
                              helper.make_node("Cast", [f"{mask_input}/lengths"], [cast_name], to=TensorProto.INT32)]
                inputs = (inputs + [""] * 4)[:4]
                inputs[3] = cast_name
                del node.input[:]
                node.input.extend(inputs)
                changed += 1
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return changed
