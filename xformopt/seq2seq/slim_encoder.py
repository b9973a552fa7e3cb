"""Leaner encoder graphs (issue 55): the once-per-sentence graph (the encoder and the first decoder step) without the
dynamo graph's bias arithmetic and cache layout copies. On the trained tiny T5 (d_model 64) about half of its ~130
nodes as ONNX Runtime runs it were T5's bidirectional position bias (ranges, log, bucket arithmetic, a gather, a
transpose), the padding mask (ranges, ``GatherND``, ``Expand``, ``And``) and the head splits of the cache outputs.

Two rewrites, each checked before it is kept; the graph's outputs then equal the fused graph's, bit for bit, on a
padded batch (else nothing is written):

- **attention biases** read only ``attention_mask`` (its values and length) and ``input_ids``' length. Each is
  evaluated alone and fitted to ``Where(attention_mask[:, None, None, :], kept, masked)`` (no ``Where`` where the
  mask's values are not read), ``kept`` either a constant (the first step's biases: one query) or a Toeplitz matrix
  ``g(key - query)`` gathered from a table of ``g`` over ``[-D, D]`` with the offset clipped to ``D``: T5's buckets
  are constant beyond ``relative_attention_max_distance``. ``g`` and ``D`` are read off the bias at a length of
  ``PROBE_LENGTH``, where ``D`` must be at most half of it (a constant tail seen over ``PROBE_LENGTH / 2`` offsets);
  the fit is then checked on random padded masks at several batch sizes and lengths, one longer than the probe.
- **cache outputs from the attention**: a ``present.*`` output that was ``Transpose(Reshape(k, [b, s, heads,
  head]), (0, 2, 1, 3))`` of a ``MultiHeadAttention``'s key or value (no past) becomes that node's own
  ``present_key`` / ``present_value`` output: the same ``[batch, heads, length, head]`` copy, made inside the op.

No library does these (see :mod:`xformopt.seq2seq.slim` for the decoder step's and why): the bias depends on a
length known only at run time, and the cache layout is a graph output.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from xformopt.onnx_graph import drop_dead
from xformopt.onnx_graph import producers as graph_producers
from xformopt.runtime.session import ort_session
from xformopt.seq2seq.subgraph import cone, evaluator, nodes_evaluator, replace_output

IDS, MASK = "input_ids", "attention_mask"
PROBE_LENGTH = 512  # source length the position table is read at; D (the clip) must be at most half of it (T5: 128)
PROBES = ((1, 1), (2, 7), (3, 40), (2, 129), (1, 300), (1, PROBE_LENGTH + 37))  # (batch, length) of the checks
MAX_CHECKED_BYTES = 2**31 - 2**26  # a graph this large is not serialized whole for the check: left as it is


def slim_encoder(path: Path) -> dict:
    """Rewrite the encoder graph at ``path`` in place; returns node counts before and after, each rewrite's count,
    and under ``skipped`` what could not be checked."""
    import onnx

    model = onnx.load(str(path))
    graph = model.graph
    before = len(graph.node)
    unchanged = {"nodes_before": before, "nodes_after": before, "applied": {}}
    attention = [n for n in graph.node if n.op_type == "MultiHeadAttention" and n.domain == "com.microsoft"]
    if not attention or {i.name for i in graph.input} != {IDS, MASK}:
        return {**unchanged, "reason": "no MultiHeadAttention over input_ids and attention_mask"}
    if model.ByteSize() > MAX_CHECKED_BYTES:
        return {**unchanged, "reason": "graph too large to check whole in memory"}
    original = model.SerializeToString()
    front, skipped, biases = _SharedNodes(), [], 0
    for name in dict.fromkeys(n.input[5] for n in attention if len(n.input) > 5 and n.input[5]):
        try:
            biases += _fit_bias(model, name, front)
        except Exception as err:  # noqa: BLE001  # a subgraph ORT cannot run alone: left as it is, and said
            skipped.append(f"{name}: {type(err).__name__}: {str(err).splitlines()[0][:200]}")
    for i, node in enumerate(front.nodes):  # they read inputs and initializers only: first in graph order
        graph.node.insert(i, node)
    graph.initializer.extend(front.tables)
    applied = {"attention_bias": biases, "present_from_attention": _present_from_attention(graph, attention)}
    drop_dead(graph)
    if not any(applied.values()):
        return {**unchanged, **({"skipped": skipped} if skipped else {})}
    differs = _differing_outputs(original, model)
    if differs:
        return {**unchanged, "reason": f"outputs differ after the rewrites ({', '.join(differs)}): left as it is"}
    onnx.save(model, str(path))
    return {"nodes_before": before, "nodes_after": len(graph.node), "applied": applied,
            **({"skipped": skipped} if skipped else {})}


class _SharedNodes:
    """Nodes and tables the replacements read (the mask's keys, the positions), each made once."""

    def __init__(self):
        self.nodes, self.tables, self.made = [], [], set()

    def add(self, nodes: list, tables: list) -> None:
        for node in nodes:
            if node.output[0] not in self.made:
                self.made.add(node.output[0])
                self.nodes.append(node)
        for table in tables:
            if table.name not in self.made:
                self.made.add(table.name)
                self.tables.append(table)


def _feed(graph, batch: int, length: int, mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
    types = {i.name: i.type.tensor_type.elem_type for i in graph.input}
    from onnx import helper

    def typed(name, values):
        return values.astype(helper.tensor_dtype_to_np_dtype(types[name]))

    mask = np.ones((batch, length), np.int64) if mask is None else mask
    return {IDS: typed(IDS, np.zeros((batch, length), np.int64)), MASK: typed(MASK, mask)}


def _random_mask(rng, batch: int, length: int) -> np.ndarray:
    mask = rng.integers(0, 2, (batch, length))
    mask[0, 0] = 1
    if batch * length > 1:
        mask[-1, -1] = 0
    return mask


def _fit_bias(model, name: str, front: _SharedNodes) -> bool:
    """Replace the bias ``name`` by its fitted form (see the module's docstring) where every probe agrees."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    _, values, shapes = cone(graph, name)
    if not (values | shapes) <= {IDS, MASK} or values - {MASK}:
        return False
    evaluate = evaluator(model, name)
    full = evaluate(_feed(graph, 1, PROBE_LENGTH))
    if full.ndim != 4 or full.shape[0] != 1:
        return False
    prefix = f"{name}/fit"
    if full.shape[2:] == (PROBE_LENGTH, PROBE_LENGTH):
        kept_nodes, kept_tables = _toeplitz(full, prefix)
        if kept_nodes is None:
            return False
    elif full.shape[2] == 1 and np.array_equal(full, np.broadcast_to(full[..., :1], full.shape)):
        kept_nodes, kept_tables = [], [numpy_helper.from_array(np.ascontiguousarray(full[..., :1]), f"{prefix}/kept")]
    else:
        return False
    kept = f"{prefix}/kept"
    if MASK in values:
        edge = evaluate(_feed(graph, 1, 2, np.array([[1, 0]])))
        masked = numpy_helper.from_array(np.asarray(edge[0, 0, 0, 1]), f"{prefix}/masked")
        axes = numpy_helper.from_array(np.array([1, 2], np.int64), f"{MASK}/key_axes")
        shared = [helper.make_node("Cast", [MASK], [f"{MASK}/bool"], to=TensorProto.BOOL),
                  helper.make_node("Unsqueeze", [f"{MASK}/bool", axes.name], [f"{MASK}/keys"])]
        shared_tables = [axes]
        nodes = [*kept_nodes, helper.make_node("Where", [f"{MASK}/keys", kept, masked.name], [name])]
        tables = [*kept_tables, masked]
    elif kept_nodes:  # the position bias alone: its gather gives the bias
        kept_nodes[-1].output[0] = name
        shared, shared_tables, nodes, tables = [], [], kept_nodes, kept_tables
    else:  # a constant: the bias is an initializer
        kept_tables[0].name = name
        shared, shared_tables, nodes, tables = [], [], [], kept_tables
    candidate = nodes_evaluator(model, [*front.nodes, *(n for n in shared if n.output[0] not in front.made), *nodes],
                                [*front.tables, *(t for t in shared_tables if t.name not in front.made), *tables], name)
    rng = np.random.default_rng(0)
    for batch, length in PROBES:
        feed = _feed(graph, batch, length, _random_mask(rng, batch, length) if MASK in values else None)
        want, got = evaluate(feed), candidate(feed)
        if got.ndim != 4 or want.dtype != got.dtype or \
                np.broadcast_shapes(got.shape, want.shape) != want.shape or \
                not np.array_equal(np.broadcast_to(got, want.shape), want):
            return False
    front.add(shared, shared_tables)  # inserted before these, once every bias is done
    replace_output(graph, name, nodes, tables)
    return True


def _toeplitz(full: np.ndarray, prefix: str):
    """Nodes gathering ``full``'s ``g(key - query)`` from a table over offsets ``[-D, D]`` (offsets clipped to D),
    or (None, None) where ``full`` is no such matrix or its tail is not constant over the last half."""
    from onnx import helper, numpy_helper

    length = full.shape[-1]
    ahead, behind = full[0, :, 0, :], full[0, :, :, 0]  # g(0..L-1) and g(0..-(L-1))
    offsets = np.arange(length)[None, :] - np.arange(length)[:, None]
    table = np.concatenate([ahead, behind[:, :0:-1]], axis=1)  # g(-d) at index -d
    if not np.array_equal(table[:, offsets], full[0]):
        return None, None
    clip = max(_constant_from(ahead), _constant_from(behind))
    if clip > length // 2:
        return None, None
    table = np.concatenate([ahead[:, :clip + 1], behind[:, clip:0:-1]], axis=1)[None]  # [1, heads, 2D + 1]
    source = MASK  # both inputs have the source's length
    tables = [numpy_helper.from_array(np.ascontiguousarray(table), f"{prefix}/table"),
              numpy_helper.from_array(np.array(-clip, np.int64), f"{prefix}/low"),
              numpy_helper.from_array(np.array(clip, np.int64), f"{prefix}/high"),
              numpy_helper.from_array(np.array(0, np.int64), f"{prefix}/zero"),
              numpy_helper.from_array(np.array(1, np.int64), f"{prefix}/one"),
              numpy_helper.from_array(np.array([0], np.int64), f"{prefix}/axis0"),
              numpy_helper.from_array(np.array([1], np.int64), f"{prefix}/axis1")]
    p = prefix
    nodes = [helper.make_node("Shape", [source], [f"{p}/length"], start=1, end=2),
             helper.make_node("Squeeze", [f"{p}/length"], [f"{p}/n"]),
             helper.make_node("Range", [f"{p}/zero", f"{p}/n", f"{p}/one"], [f"{p}/positions"]),
             helper.make_node("Unsqueeze", [f"{p}/positions", f"{p}/axis0"], [f"{p}/keys"]),
             helper.make_node("Unsqueeze", [f"{p}/positions", f"{p}/axis1"], [f"{p}/queries"]),
             helper.make_node("Sub", [f"{p}/keys", f"{p}/queries"], [f"{p}/offsets"]),
             helper.make_node("Clip", [f"{p}/offsets", f"{p}/low", f"{p}/high"], [f"{p}/clipped"]),
             helper.make_node("Gather", [f"{p}/table", f"{p}/clipped"], [f"{p}/kept"], axis=2)]
    return nodes, tables


def _constant_from(row: np.ndarray) -> int:
    """The first offset from which ``row`` (``[heads, offsets]``) equals its last column."""
    same = np.all(row == row[:, -1:], axis=0)
    changed = np.flatnonzero(~same)
    return int(changed[-1]) + 1 if changed.size else 0


def _present_from_attention(graph, attention) -> int:
    """Cache outputs taken from MultiHeadAttention's own present outputs (see the module's docstring)."""
    producers = graph_producers(graph)
    outputs = {o.name: o for o in graph.output}
    done = 0
    for node in attention:
        if len(node.output) > 1 or (len(node.input) > 6 and node.input[6]):
            continue  # already gives its cache, or appends to a past
        heads = next(a.i for a in node.attribute if a.name == "num_heads")
        present = [_head_split_output(outputs, graph, node.input[i], heads) for i in (1, 2)]
        if all(present):
            for transpose in (producers[name] for name in present):
                transpose.output[0] = f"{transpose.output[0]}/replaced"
            node.output.extend(present)
            done += 1
    return done


def _head_split_output(outputs, graph, source: str, heads: int) -> str | None:
    """The graph output that is ``source`` split into heads, [batch, heads, length, head] (None: there is none)."""
    readers = [n for n in graph.node if source in n.input and n.op_type == "Reshape"]
    for reshape in readers:
        transposes = [n for n in graph.node if n.op_type == "Transpose" and n.input[0] == reshape.output[0]]
        for transpose in transposes:
            perm = next((list(a.ints) for a in transpose.attribute if a.name == "perm"), None)
            out = outputs.get(transpose.output[0])
            if perm != [0, 2, 1, 3] or out is None:
                continue
            dims = out.type.tensor_type.shape.dim
            if len(dims) == 4 and dims[1].dim_value == heads:
                return transpose.output[0]
    return None


def _differing_outputs(original: bytes, model) -> list[str]:
    """The outputs of ``model`` that differ from ``original``'s on a padded batch of two (bitwise)."""
    sessions = [ort_session(m, threads=1) for m in (original, model.SerializeToString())]
    rng = np.random.default_rng(1)
    feed = _feed(model.graph, 2, 9, np.array([[1] * 9, [1] * 6 + [0] * 3]))
    feed[IDS] = rng.integers(2, 6, feed[IDS].shape).astype(feed[IDS].dtype)
    names = [o.name for o in sessions[0].get_outputs()]
    want, got = (s.run(names, feed) for s in sessions)
    return [n for n, a, b in zip(names, want, got, strict=True) if a.shape != b.shape or not np.array_equal(a, b)]
