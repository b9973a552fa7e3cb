"""Leaner cached decoder steps (issue 55): the decoder graph's per-step work that does not depend on the step's
values, taken out of the step. On the trained tiny T5 (d_model 64) a step is ~110 nodes after ONNX Runtime's own
fusions, and at these widths a node's fixed cost rivals an INT8 matmul (docs/seq2seq.md, the node table).

Three rewrites of a fused decoder graph (``MultiHeadAttention`` nodes), each checked by evaluating the graph's
own subgraph before it replaces it, so the result is the float graph's, bit for bit:

- **position bias** (T5's relative-position bias): an ``attention_bias`` that depends only on the past length
  (its subgraph reads no input's values, only shapes) is a row ``f(past - key)`` for one new token. The graph's own
  subgraph is run once at a past of ``TABLE_LENGTH - 1`` and the row kept as a constant; a step takes the last
  ``past + 1`` entries with one ``Slice`` instead of ~25 nodes of ranges, log, buckets, a gather and a transpose.
  Checked: the subgraph's rows at other past lengths equal the table's tail. The graph then takes one token per
  step (``decoder_input_ids`` ``[batch, 1]``, what every caller feeds, ORT refusing anything else).
- **cross-attention mask**: an ``attention_bias`` computed from ``encoder_attention_mask`` (ranges, GatherND,
  Expand, Where: ~20 nodes) becomes ``Where(mask[:, None, None, :], a, b)`` with the two values read off the
  subgraph; checked equal on padded masks of several batch sizes and lengths.
- **cross-attention cache layout**: ``MultiHeadAttention`` takes the ``[batch, heads, source, head]`` cache as it
  is; the dynamo graph transposed and reshaped it to ``[batch, source, hidden]`` in every step (a copy of the
  whole cross-attention cache per layer per step), which the op then splits back into heads.

``slim_graphs`` (what fuse calls) runs these on the decoder graph, then removes both graphs' reshape/transpose
round trips (:mod:`xformopt.seq2seq.identity_layouts`). No library does these three: onnxscript's optimizer folds
only what is constant, and both biases depend on a run-time shape or input (measured: it removed 8 of 173 nodes
with the step fixed to 1, no time).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from xformopt.onnx_graph import drop_dead
from xformopt.onnx_graph import producers as graph_producers
from xformopt.seq2seq import DECODER_FILE, GRAPH_FILES
from xformopt.seq2seq.identity_layouts import drop_identity_layouts
from xformopt.seq2seq.slim_encoder import slim_encoder
from xformopt.seq2seq.subgraph import cone, evaluator, replace_output

TABLE_LENGTH = 8192  # past lengths the position table covers; a longer past fails in ORT (bias width mismatch)
TOKEN_INPUT = "decoder_input_ids"
MASK_INPUT = "encoder_attention_mask"
PROBE_PASTS = (1, 2, 7, 40, 300)  # past lengths at which the subgraph must give the table's tail
PROBE_MASKS = ((1, 5), (2, 7), (3, 4))  # (batch, source) of the padded masks the mask rewrite is checked on


def slim_graphs(folder: Path) -> dict[str, dict]:
    """Both graphs of a fused stage in ``folder``, rewritten in place: the decoder step's rewrites
    (:func:`slim_decoder`) and the encoder graph's (:mod:`xformopt.seq2seq.slim_encoder`), and in both graphs the
    Reshape/Transpose round trips (:mod:`xformopt.seq2seq.identity_layouts`); per graph, nodes before and after
    and what applied."""
    record = {}
    for name in GRAPH_FILES:
        if name == DECODER_FILE:
            first = step = slim_decoder(folder / name)
            last = layouts = drop_identity_layouts(folder / name)
        else:  # the cache outputs' head splits are found once the round trips before the attention are gone
            first = layouts = drop_identity_layouts(folder / name)
            last = step = slim_encoder(folder / name)
        applied = {**step["applied"], "identity_layouts": layouts["chains"]}
        skipped = step.get("skipped", []) + [r["reason"] for r in (step, layouts) if "reason" in r]
        record[name] = {"nodes_before": first["nodes_before"], "nodes_after": last["nodes_after"], "applied": applied,
                        **({"skipped": skipped} if skipped else {})}
    return record


def slim_decoder(path: Path) -> dict:
    """Rewrite the decoder graph at ``path`` in place; returns what was done (node counts before and after, each
    rewrite's count, or the reason none applied)."""
    import onnx

    model = onnx.load(str(path))
    graph = model.graph
    before = len(graph.node)
    attention = [n for n in graph.node if n.op_type == "MultiHeadAttention" and n.domain == "com.microsoft"]
    if not attention:
        return {"nodes_before": before, "nodes_after": before, "applied": {}, "reason": "no MultiHeadAttention"}
    applied = {"cross_attention_layout": _cross_layout(graph, attention)}
    biases = list(dict.fromkeys(n.input[5] for n in attention if len(n.input) > 5 and n.input[5]))
    applied["position_bias"] = applied["cross_attention_mask"] = 0
    rewrites = {"position": ("position_bias", _position_table), "mask": ("cross_attention_mask", _mask_where)}
    skipped = []
    for name in biases:
        key, rewrite = rewrites.get(_bias_kind(graph, name), (None, None))
        if rewrite is None:
            continue
        try:
            applied[key] += bool(rewrite(model, name))
        except Exception as err:  # noqa: BLE001  # a subgraph ORT cannot run alone: left as it is, and said
            skipped.append(f"{name}: {type(err).__name__}: {str(err).splitlines()[0][:200]}")
    if applied["position_bias"]:
        _one_token_steps(graph)
    drop_dead(graph)
    onnx.save(model, str(path))
    return {"nodes_before": before, "nodes_after": len(graph.node), "applied": applied,
            **({"skipped": skipped} if skipped else {})}


def _cross_layout(graph, attention) -> int:
    """Feed the cross-attention cache to MultiHeadAttention as [batch, heads, source, head] (BNSH): drop the
    Transpose(0, 2, 1, 3) + Reshape to [batch, source, hidden] of a graph input, same values."""
    producers, inputs = graph_producers(graph), {i.name: i for i in graph.input}
    done = 0
    for node in attention:
        if len(node.input) < 3 or (len(node.input) > 6 and node.input[6]):
            continue  # a self-attention with its own past
        sources = [_untransposed_input(producers, inputs, node.input[i], _heads(node)) for i in (1, 2)]
        if all(sources):
            node.input[1], node.input[2] = sources
            done += 1
    return done


def _heads(node) -> int:
    return next(a.i for a in node.attribute if a.name == "num_heads")


def _untransposed_input(producers, inputs, name: str, heads: int) -> str | None:
    reshape = producers.get(name)
    if reshape is None or reshape.op_type != "Reshape":
        return None
    transpose = producers.get(reshape.input[0])
    if transpose is None or transpose.op_type != "Transpose" or transpose.input[0] not in inputs:
        return None
    perm = next((list(a.ints) for a in transpose.attribute if a.name == "perm"), None)
    dims = inputs[transpose.input[0]].type.tensor_type.shape.dim
    if perm != [0, 2, 1, 3] or len(dims) != 4 or dims[1].dim_value != heads:
        return None
    return transpose.input[0]


def _bias_kind(graph, name: str) -> str | None:
    _, values, shapes = cone(graph, name)
    shaped_by = {s for s in shapes if s == TOKEN_INPUT or s.startswith("past.")}
    if not values and shaped_by == shapes and TOKEN_INPUT in shapes:
        return "position"
    return "mask" if values == {MASK_INPUT} and shaped_by == shapes - {MASK_INPUT} else None


def _probe_feed(graph, past: int, batch: int = 1, source: int = 3) -> dict[str, np.ndarray]:
    """Arrays of the right shapes for every input (values do not matter to a position-only subgraph)."""
    feed = {}
    for i in graph.input:
        dims = [d.dim_value or None for d in i.type.tensor_type.shape.dim]
        if i.name == TOKEN_INPUT:
            feed[i.name] = np.zeros((batch, 1), np.int64)
        elif i.name == MASK_INPUT:
            feed[i.name] = np.ones((batch, source), np.int64)
        elif len(dims) == 4:
            length = past if ".decoder." in i.name else source
            feed[i.name] = np.zeros((batch, dims[1] or 1, length, dims[3] or 1), np.float32)
    return feed


def _position_table(model, name: str) -> bool:
    """The position-only bias as a slice of its own values at the longest past (see the module's docstring)."""
    from onnx import helper, numpy_helper

    graph = model.graph
    evaluate = evaluator(model, name)
    table = evaluate(_probe_feed(graph, TABLE_LENGTH - 1))
    if table.ndim != 4 or table.shape[2] != 1 or table.shape[3] != TABLE_LENGTH:
        return False
    table = table[:1]
    for past in PROBE_PASTS:  # one row per past length, each the table's tail, the same in every batch row
        rows = evaluate(_probe_feed(graph, past, batch=2))
        if not all(np.array_equal(row[None], table[..., -(past + 1):]) for row in rows):
            return False
    _, _, shapes = cone(graph, name)
    past_input = sorted(s for s in shapes if s.startswith("past."))[0]
    prefix = f"{name}/table"
    tables = [numpy_helper.from_array(table, prefix), numpy_helper.from_array(np.array([-1], np.int64), f"{prefix}/minus_one"),
              numpy_helper.from_array(np.array([np.iinfo(np.int64).max], np.int64), f"{prefix}/end"),
              numpy_helper.from_array(np.array([3], np.int64), f"{prefix}/axis")]
    nodes = [helper.make_node("Shape", [past_input], [f"{prefix}/past"], start=2, end=3),
             helper.make_node("Sub", [f"{prefix}/minus_one", f"{prefix}/past"], [f"{prefix}/start"]),  # -(past + 1)
             helper.make_node("Slice", [prefix, f"{prefix}/start", f"{prefix}/end", f"{prefix}/axis"], [name])]
    replace_output(graph, name, nodes, tables)
    return True


def _mask_where(model, name: str) -> bool:
    """The cross-attention mask as Where(mask[:, None, None, :], a, b), a and b read off the subgraph."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    evaluate = evaluator(model, name)
    rng = np.random.default_rng(0)
    values = None
    for batch, source in PROBE_MASKS:
        feed = _probe_feed(graph, 2, batch=batch, source=source)
        mask = rng.integers(0, 2, (batch, source)).astype(np.int64)
        mask[0, 0], mask[-1, -1] = 1, 0  # both values present
        feed[MASK_INPUT] = mask
        got = evaluate(feed)
        keep = mask[:, None, None, :] != 0
        values = values or (got[0, 0, 0, 0], got[-1, 0, 0, -1])
        # [batch, heads or 1, 1, source]: MultiHeadAttention broadcasts the bias over heads
        if got.ndim != 4 or got.shape[::2] != keep.shape[::2] or \
                not np.array_equal(got, np.broadcast_to(np.where(keep, *values).astype(got.dtype), got.shape)):
            return False
    prefix = f"{name}/mask"
    tables = [numpy_helper.from_array(np.asarray(values[0]), f"{prefix}/keep"),
              numpy_helper.from_array(np.asarray(values[1]), f"{prefix}/drop"),
              numpy_helper.from_array(np.array([1, 2], np.int64), f"{prefix}/axes")]
    nodes = [helper.make_node("Cast", [MASK_INPUT], [f"{prefix}/bool"], to=TensorProto.BOOL),
             helper.make_node("Unsqueeze", [f"{prefix}/bool", f"{prefix}/axes"], [f"{prefix}/keys"]),
             helper.make_node("Where", [f"{prefix}/keys", f"{prefix}/keep", f"{prefix}/drop"], [name])]
    replace_output(graph, name, nodes, tables)
    return True


def _one_token_steps(graph) -> None:
    """The position table gives one query row: the graph takes one token per step, and ORT refuses more."""
    for value in list(graph.input) + list(graph.output):
        if value.name in (TOKEN_INPUT, "logits"):
            dims = value.type.tensor_type.shape.dim
            if len(dims) >= 2:
                dims[1].Clear()
                dims[1].dim_value = 1

