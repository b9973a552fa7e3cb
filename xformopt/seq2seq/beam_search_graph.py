"""One ONNX model that runs the whole decode loop in ONNX Runtime: a ``com.microsoft`` ``BeamSearch`` node (T5 style,
``model_type=1``) whose ``encoder`` and ``decoder`` attributes are the artifact's two graphs, as they are (float,
fused or INT8), each inside a thin wrapper that meets the op's subgraph contract (ORT's
``subgraph_t5_encoder.cc`` / ``subgraph_t5_decoder.cc``, the layout ``convert_generation.py`` builds):

- encoder subgraph ("old format", the first decoder step folded in, as ours is): ``encoder_input_ids``,
  ``encoder_attention_mask``, ``decoder_input_ids`` (int32) -> ``logits``, ``encoder_hidden_states``, every
  layer's ``present_key_self_i``/``present_value_self_i``, then every layer's ``present_key_cross_i``/``..._value_...``;
- decoder subgraph: ``input_ids`` (int32, ``[batch, 1]``: one new token per step), ``encoder_attention_mask`` (int32),
  all self-attention pasts, then all cross-attention pasts -> ``logits``, the self-attention presents.

Ours are int64 ids and masks, per-layer interleaved caches, and other names: the wrappers cast, rename (Identity)
and reorder; the op reads head count, head width and vocabulary off static output dims, which they set. Our encoder
graph feeds its own start token, so the op's ``decoder_input_ids`` input is declared and unused.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from xformopt.seq2seq import DECODER_FILE, ENCODER_FILE, GRAPH_FILES
from xformopt.seq2seq.search_rewrites import ATTENTION_OPSET, attention_as_onnx_attention, drop_padding_masks

GENERATE_FILE = "generate.onnx"
SEARCH_GRAPH_PAD = -1  # the op's pad_token_id: it fills the output past a hypothesis' end (no token id is negative)
METADATA_KEY = "xformopt.search"  # the node's fixed attributes, in the model's metadata: read back without the graph
MASK_INPUT = "encoder_attention_mask"  # both subgraphs' attention mask (the contract's name)
# the model's inputs, in the op's order (vocab_mask and prefix_vocab_mask left empty)
SEARCH_INPUTS = ("input_ids", "max_length", "min_length", "num_beams", "num_return_sequences", "length_penalty",
                 "repetition_penalty", "", "", "attention_mask")


def _contract_io(layers: int) -> tuple[list, list, list, list]:
    """(encoder inputs, encoder outputs, decoder inputs, decoder outputs) as (contract name, our name) pairs."""
    def by_kind(prefix, kind, ours):
        return [(f"{prefix}_{part}_{kind}_{i}", f"{ours}.{i}.{'decoder' if kind == 'self' else 'encoder'}.{part}")
                for i in range(layers) for part in ("key", "value")]

    enc_in = [("encoder_input_ids", "input_ids"), ("encoder_attention_mask", "attention_mask"), ("decoder_input_ids", None)]
    enc_out = [("logits", "logits"), ("encoder_hidden_states", "last_hidden_state"),
               *by_kind("present", "self", "present"), *by_kind("present", "cross", "present")]
    dec_in = [("input_ids", "decoder_input_ids"), ("encoder_attention_mask", "encoder_attention_mask"),
              *by_kind("past", "self", "past"), *by_kind("past", "cross", "past")]
    dec_out = [("logits", "logits"), *by_kind("present", "self", "present")]
    return enc_in, enc_out, dec_in, dec_out


def _static_shape(name: str, value_info, dims: dict) -> list:
    """The contract's shape of ``name``: batch and lengths symbolic; the dims the op reads fixed."""
    old = [d.dim_value if d.HasField("dim_value") else (d.dim_param or f"{name}_{i}")
           for i, d in enumerate(value_info.type.tensor_type.shape.dim)]
    if name == "logits":
        return ["batch", 1, dims["vocab"]]
    if name.startswith(("present_", "past_")):
        return [old[0] if old else "batch", dims["heads"], old[2] if len(old) > 2 else "length", dims["head_size"]]
    if name == "input_ids":  # one token per step: the op then feeds the last token, not the whole sequence
        return ["batch", 1]
    return old


def _wrap(model, prefix: str, inputs: list, outputs: list, dims: dict, name: str):
    """``model``'s graph with every name under ``prefix``, fed from and feeding the contract's names."""
    from onnx import TensorProto, compose, helper

    inner = compose.add_prefix(model, prefix)
    graph = inner.graph
    declared = {v.name: v for v in graph.input}
    produced = {v.name: v for v in graph.output}
    nodes, graph_inputs, graph_outputs, renames = [], [], [], []
    for outer, ours in inputs:
        if ours is None:  # our encoder graph feeds its own start token
            graph_inputs.append(helper.make_tensor_value_info(outer, TensorProto.INT32, ["batch", 1]))
            continue
        source = declared[prefix + ours]
        elem = source.type.tensor_type.elem_type
        if elem == TensorProto.INT64:  # ids and masks: the op feeds int32
            graph_inputs.append(helper.make_tensor_value_info(outer, TensorProto.INT32, _static_shape(outer, source, dims)))
            nodes.append(helper.make_node("Cast", [outer], [source.name], to=TensorProto.INT64, name=f"{prefix}cast_{outer}"))
        else:
            graph_inputs.append(helper.make_tensor_value_info(outer, elem, _static_shape(outer, source, dims)))
            nodes.append(helper.make_node("Identity", [outer], [source.name], name=f"{prefix}in_{outer}"))
    for outer, ours in outputs:
        source = produced[prefix + ours]
        graph_outputs.append(helper.make_tensor_value_info(outer, source.type.tensor_type.elem_type,
                                                           _static_shape(outer, source, dims)))
        renames.append(helper.make_node("Identity", [source.name], [outer], name=f"{prefix}out_{outer}"))
    return helper.make_graph(nodes + list(graph.node) + renames, name, graph_inputs, graph_outputs,
                             initializer=list(graph.initializer), value_info=list(graph.value_info),
                             sparse_initializer=list(graph.sparse_initializer)), list(inner.functions)


def _opsets(*models, at_least: dict[str, int]) -> list:
    """Every domain the subgraphs use, at the highest version either imports or ``at_least`` names, and the op's own
    domain."""
    from onnx import helper

    versions: dict[str, int] = {"com.microsoft": 1, **at_least}
    for model in models:
        for opset in model.opset_import:
            versions[opset.domain] = max(versions.get(opset.domain, 0), opset.version)
    return [helper.make_opsetid(domain, version) for domain, version in sorted(versions.items())]


def _dims(encoder, config: dict) -> dict:
    """Heads, head width and vocabulary: off the encoder graph's static output dims, else the config's."""
    shapes = {o.name: [d.dim_value if d.HasField("dim_value") else None for d in o.type.tensor_type.shape.dim]
              for o in encoder.graph.output}
    present, logits = shapes.get("present.0.decoder.key", [None] * 4), shapes.get("logits", [None] * 3)
    return {"heads": present[1] or int(config["num_heads"]), "head_size": present[3] or int(config["d_kv"]),
            "vocab": logits[2] or int(config["vocab_size"])}


def build_search_model(path: str | Path, eos_token_id: int, decoder_start_token_id: int, onnx_attention: bool = False):
    """The ``BeamSearch`` model over the artifact at ``path`` (an ``onnx.ModelProto``; not written) and the count of
    each of the search graph's own rewrites (:mod:`xformopt.seq2seq.search_rewrites`: padding masks dropped, and with
    ``onnx_attention`` the attention over 3-D inputs as ONNX ``Attention``), which its metadata also holds.

    Its pad id is -1, not the model's: the op pads finished hypotheses with it, and T5's pad id (0) is also a token
    the model may generate, so the output's end would be ambiguous. A finished row of a batch is fed the pad id
    while the others go on: -1 is a valid Gather index (the last embedding row), and that row's logits are unread.
    The op's no-repeat n-gram rule would index a row's scores with it (ORT's logits_processor.cc): the graph has
    no such rule (``no_repeat_ngram_size`` 0), and a generation config that sets one runs the Python loop."""
    import onnx
    from onnx import TensorProto, helper

    path = Path(path)
    encoder, decoder = (onnx.load(str(path / name), load_external_data=True) for name in (ENCODER_FILE, DECODER_FILE))
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    layers = (len(decoder.graph.output) - 1) // 2
    dims = _dims(encoder, config)
    enc_in, enc_out, dec_in, dec_out = _contract_io(layers)
    enc_graph, enc_functions = _wrap(encoder, "e/", enc_in, enc_out, dims, "t5 encoder and decoder init")
    dec_graph, dec_functions = _wrap(decoder, "d/", dec_in, dec_out, dims, "t5 decoder")
    rewrites = {"padding_masks": sum(drop_padding_masks(g, MASK_INPUT) for g in (enc_graph, dec_graph)),
                "onnx_attention": sum(attention_as_onnx_attention(g) for g in (enc_graph, dec_graph)) if onnx_attention else 0}
    shared = share_initializers(enc_graph, dec_graph)  # before the node: make_node copies the graphs
    fixed = {"eos_token_id": int(eos_token_id), "decoder_start_token_id": int(decoder_start_token_id),
             "no_repeat_ngram_size": 0}
    node = helper.make_node("BeamSearch", list(SEARCH_INPUTS), ["sequences"], name="BeamSearch_t5",
                            domain="com.microsoft", **fixed, pad_token_id=SEARCH_GRAPH_PAD, early_stopping=0,
                            model_type=1, encoder=enc_graph, decoder=dec_graph)
    scalar = [1]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", "source"]),
              *(helper.make_tensor_value_info(n, TensorProto.INT32, scalar)
                for n in ("max_length", "min_length", "num_beams", "num_return_sequences")),
              *(helper.make_tensor_value_info(n, TensorProto.FLOAT, scalar) for n in ("length_penalty", "repetition_penalty")),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT32, ["batch", "source"])]
    outputs = [helper.make_tensor_value_info("sequences", TensorProto.INT32, ["batch", "returned", "max_length"])]
    graph = helper.make_graph([node], "t5 beam search", inputs, outputs, initializer=shared)
    opsets = _opsets(encoder, decoder, at_least={"": ATTENTION_OPSET} if rewrites["onnx_attention"] else {})
    model = helper.make_model(graph, opset_imports=opsets, producer_name="xformopt", functions=enc_functions + dec_functions)
    model.ir_version = max(encoder.ir_version, decoder.ir_version)
    helper.set_model_props(model, {METADATA_KEY: json.dumps({**fixed, "graphs": graph_digests(path),
                                                             "unpadded": True, "rewrites": rewrites})})
    return model, rewrites


def share_initializers(*graphs) -> list:
    """Weights the subgraphs hold alike (our encoder graph runs the first decoder step, so it carries every decoder
    weight too), moved out to the outer graph once; the subgraphs read them from there by name, as ORT's own
    ``convert_generation.py`` shares them. Returns the outer graph's initializers; ``graphs`` are edited in place."""
    from onnx import numpy_helper

    def key(tensor):
        array = numpy_helper.to_array(tensor)
        return array.dtype.str, array.shape, hashlib.sha256(array.tobytes()).hexdigest()

    keyed = [{key(t): t for t in g.initializer} for g in graphs]
    common = set(keyed[0]).intersection(*keyed[1:])
    shared = []
    for i, k in enumerate(sorted(common, key=str)):
        tensor = keyed[0][k]
        outer = f"shared/{i}"
        shared.append(numpy_helper.from_array(numpy_helper.to_array(tensor), outer))
        for graph, by_key in zip(graphs, keyed):
            _rename_input(graph, by_key[k].name, outer)
    for graph in graphs:
        kept = [t for t in graph.initializer if not t.name.startswith("shared/")]
        del graph.initializer[:]
        graph.initializer.extend(kept)
    return shared


def _rename_input(graph, old: str, new: str) -> None:
    """Every read of ``old`` in ``graph``'s nodes becomes ``new``; its initializer is renamed (then dropped)."""
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
    for tensor in graph.initializer:
        if tensor.name == old:
            tensor.name = new


def graph_digests(folder: Path) -> dict[str, str]:
    """SHA-256 of the two graphs the search graph embeds: a later stage that rewrites them without rebuilding it
    leaves a search graph that no longer matches (then the Python loop runs)."""
    out = {}
    for name in GRAPH_FILES:
        with open(Path(folder) / name, "rb") as f:
            out[name] = hashlib.file_digest(f, "sha256").hexdigest()
    return out
