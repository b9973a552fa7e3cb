"""Rewrites only the search graph's subgraphs take (issue 55): ``generate.onnx`` decodes one row at a time, unpadded
(:meth:`xformopt.seq2seq.search_graph.OrtSearchGraph.unfit` sends a padded row to the Python loop), which the two
graphs the Python loop runs on a padded batch cannot assume.

- **Padding masks dropped**: an attention bias ``Where(cond, kept, masked)`` whose condition reads only the
  attention mask's values is ``kept`` wherever the mask is all ones; the attention reads ``kept``, or no bias where
  ``kept`` is a constant zero (adding 0.0 changes no score).
- **Attention as the ONNX ``Attention`` op** (opset 23): ``MultiHeadAttention`` over 3-D queries, keys and values
  (the encoder's, the first step's, a decoder step's self-attention with its past), with no packed bias and no key
  padding mask, becomes ``Attention`` with the same inputs, scale and head count, where this ONNX Runtime runs it.
  ORT's ``Attention`` kernel is the faster of the two at small widths (docs/seq2seq.md has the figures). Same
  arithmetic, another kernel: the search graph's own check (the Python loop's tokens on sample sources, greedy and
  4 beams) decides, and a graph built without this rewrite is tried where it fails or ORT refuses it.
"""

from __future__ import annotations

import functools

import numpy as np

from xformopt.onnx_graph import drop_dead
from xformopt.onnx_graph import producers as graph_producers
from xformopt.runtime.session import ort_session
from xformopt.seq2seq.subgraph import cone

ATTENTION_OPSET = 23
BIAS_INPUT = {"MultiHeadAttention": 5, "Attention": 3}  # where each attention op reads its additive bias
MHA_ATTRIBUTES = {"num_heads", "scale"}  # a MultiHeadAttention with any other attribute keeps its op


def drop_padding_masks(graph, mask_input: str) -> int:
    """Attention biases that only mask padding, replaced by what they keep (see the module's docstring); returns how
    many attention nodes now read another bias."""
    from onnx import numpy_helper

    producers, tables = graph_producers(graph), {t.name: t for t in graph.initializer}
    done = 0
    for node in graph.node:
        if node.op_type not in BIAS_INPUT or not _bias(node):
            continue
        where = producers.get(_bias(node))
        if where is None or where.op_type != "Where":
            continue
        _, values, _ = cone(graph, where.input[0])
        _, kept_reads, _ = cone(graph, where.input[1])
        if values != {mask_input} or mask_input in kept_reads:
            continue
        kept = tables.get(where.input[1])
        zero = kept is not None and not np.any(numpy_helper.to_array(kept))
        _set_bias(node, "" if zero else where.input[1])
        done += 1
    drop_dead(graph)
    return done


def _bias(node) -> str:
    index = BIAS_INPUT[node.op_type]
    return node.input[index] if len(node.input) > index else ""


def _set_bias(node, name: str) -> None:
    node.input[BIAS_INPUT[node.op_type]] = name


def attention_as_onnx_attention(graph) -> int:
    """``MultiHeadAttention`` nodes over 3-D queries, keys and values (with a past or none, and nothing ``Attention``
    lacks) replaced by ``Attention``; returns how many. A cross-attention reading the cache as ``[batch, heads,
    length, head]`` keeps its op (``Attention`` wants the query at the keys' rank). The caller raises the model's
    opset to :data:`ATTENTION_OPSET` where any was."""
    from onnx import helper

    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in list(graph.input) + list(graph.value_info)}
    producers = graph_producers(graph)

    def four_d(name: str) -> bool:  # through the contract wrapper's Identity renames
        while name not in ranks and name in producers and producers[name].op_type == "Identity":
            name = producers[name].input[0]
        return ranks.get(name) == 4

    done = 0
    for i, node in enumerate(list(graph.node)):
        if node.op_type != "MultiHeadAttention" or node.domain != "com.microsoft":
            continue
        inputs = list(node.input) + [""] * (8 - len(node.input))
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if not (inputs[1] and inputs[2]) or four_d(inputs[1]) or four_d(inputs[2]) or bool(inputs[6]) != bool(inputs[7]) \
                or inputs[3] or inputs[4] or set(attributes) - MHA_ATTRIBUTES:
            continue
        heads = attributes["num_heads"]
        scale = {"scale": attributes["scale"]} if "scale" in attributes else {}  # both default to 1/sqrt(head size)
        attention = helper.make_node("Attention", [*inputs[:3], inputs[5], inputs[6], inputs[7]], list(node.output),
                                     name=f"{node.name}/onnx_attention", q_num_heads=heads, kv_num_heads=heads, **scale)
        graph.node.remove(node)
        graph.node.insert(i, attention)
        done += 1
    return done


@functools.cache
def runs_onnx_attention() -> bool:
    """Whether this ONNX Runtime's CPU provider runs ``Attention`` (opset 23) with a past and a float bias."""
    from onnx import TensorProto, helper

    shapes = {"q": [1, 1, 8], "b": [1, 2, 1, 2], "pk": [1, 2, 1, 4], "pv": [1, 2, 1, 4]}
    node = helper.make_node("Attention", ["q", "q", "q", "b", "pk", "pv"], ["y", "k", "v"], q_num_heads=2,
                            kv_num_heads=2)
    graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                                                for n, s in shapes.items()],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "k", "v")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ATTENTION_OPSET)])
    try:
        session = ort_session(model.SerializeToString())
        session.run(None, {n: np.zeros(s, np.float32) for n, s in shapes.items()})
    except Exception:  # noqa: BLE001  # an older ORT (no kernel) or a refused shape: MultiHeadAttention stays
        return False
    return True
