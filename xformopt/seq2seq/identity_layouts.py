"""Reshape/Transpose round trips that give back their input, removed (issue 55).

After onnxscript's attention fusions the T5 encoder graph (encoder and first decoder step) keeps the dynamo graph's
head splits and their inverses around every fused attention: a projection ``[batch, n, hidden]`` reshaped to
``[batch, n, heads, head]`` and straight back for ``MultiHeadAttention``, and the attention's output reshaped,
transposed, reshaped, transposed and reshaped back to the shape it had. On the trained tiny T5 that is every one of
the 36 ``Reshape`` and 8 of the 17 ``Transpose`` nodes ONNX Runtime runs once its own fusions are done.

A chain of ``Reshape`` and ``Transpose`` nodes never changes the order of the elements when each ``Transpose`` only
moves axes of length 1 (the other axes keep their order); such a chain whose last output has its first input's
shape is the identity, and its consumers read the input instead. Shapes come from ONNX Runtime's symbolic shape
inference (it knows the com.microsoft ops); a dimension it cannot name is never taken as equal to another, and an
axis counts as length 1 only where the shape says 1. ORT's transpose optimizer cancels transpose pairs but not a
Reshape between them, onnxscript's rules merge adjacent reshapes but not across a transpose: hence this pass.
"""

from __future__ import annotations

from pathlib import Path

from xformopt.onnx_graph import drop_dead
from xformopt.onnx_graph import producers as graph_producers

LAYOUT_OPS = ("Reshape", "Transpose")


def drop_identity_layouts(path: Path) -> dict:
    """Rewrite the graph at ``path`` in place; returns nodes before and after and the chains removed."""
    import onnx

    model = onnx.load(str(path))
    graph = model.graph
    before = len(graph.node)
    shapes = _shapes(model)
    if shapes is None:
        return {"nodes_before": before, "nodes_after": before, "chains": 0, "reason": "symbolic shape inference failed"}
    producers = graph_producers(graph)
    outputs = {o.name for o in graph.output}
    renames = {}
    for node in graph.node:
        if node.op_type == "Reshape" and node.output[0] not in outputs:
            start = _identity_start(node, producers, shapes)
            if start is not None:
                renames[node.output[0]] = start
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
    drop_dead(graph)
    if renames:
        onnx.save(model, str(path))
    return {"nodes_before": before, "nodes_after": len(graph.node), "chains": len(renames)}


def _shapes(model) -> dict[str, tuple] | None:
    """Every tensor's symbolic shape it could infer (a tuple of ints and names; None where a dimension is unknown);
    a tensor it could not infer is absent, and no chain through it is rewritten.

    Calls the inference's steps, not ``SymbolicShapeInference.infer_shapes``: that one raises when any node is left
    unknown (t5-small's norms' optional outputs) and first writes the partial model, with its weights, into the
    working directory (``sym_shape_infer_temp.onnx``)."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    inference = SymbolicShapeInference(2**31 - 1, False, False, 0)  # int_max, auto_merge, guess_output_rank, verbose
    try:
        inference._preprocess(model)
        while inference.run_:
            inference._infer_impl()
    except Exception:  # noqa: BLE001  # an op it cannot take: nothing is rewritten
        return None
    shapes = {}
    for name, value in inference.known_vi_.items():
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            shapes[name] = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                 for d in value.type.tensor_type.shape.dim)
    return shapes


def _identity_start(end, producers, shapes) -> str | None:
    """The earliest tensor up the Reshape/Transpose chain ending at ``end`` with ``end``'s output shape, where the
    chain keeps the element order; None if there is none."""
    target = shapes.get(end.output[0])
    if not target or any(d is None for d in target):
        return None
    node, found = end, None
    while node is not None and node.op_type in LAYOUT_OPS:
        source = node.input[0]
        if node.op_type == "Transpose" and not _keeps_order(node, shapes):
            inner = producers.get(source)  # a transpose undone by the one before it (BNSH cache out and back)
            undone = inner is not None and inner.op_type == "Transpose" and _composed(inner, node)
            if not undone or undone != sorted(undone):
                break
            node, source = inner, inner.input[0]
        if shapes.get(source) == target:
            found = source
        node = producers.get(source)
    return found


def _perm(node) -> list[int] | None:
    return node if isinstance(node, list) else next((list(a.ints) for a in node.attribute if a.name == "perm"), None)


def _composed(first, second) -> list[int]:
    """The one permutation that ``second`` after ``first`` applies."""
    inner, outer = _perm(first) or [], _perm(second) or []
    return [inner[axis] for axis in outer] if len(inner) == len(outer) else []


def _keeps_order(node, shapes) -> bool:
    """A Transpose that moves only axes of length 1 (by the input's shape) keeps the elements in order."""
    shape = shapes.get(node.input[0])
    perm = _perm(node)
    if not shape or perm is None or len(perm) != len(shape):
        return False
    moved = [axis for axis in perm if shape[axis] != 1]
    return moved == sorted(moved)

