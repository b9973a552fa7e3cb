"""Weights a graph reads transposed, given their own transposed copy so ONNX Runtime's quantizer sees them.

A tied LM head (T5, BART, Marian: the logits projection is the embedding table) reaches the logits'
MatMul through a ``Transpose`` of the table (the export) or as ``FusedMatMul(transB=1)`` (after fuse).
ORT's dynamic quantizer takes a MatMul whose second input is an initializer only, so the head, the largest
GEMM of a decode step (t5-small: 32128 x 512, 16M of a step's 38M multiply-adds), stayed float32 and took
half the step's operator time. The copy costs the head's size again in float (the Gather keeps the table);
quantized, it is a quarter of that.
"""

from __future__ import annotations

from pathlib import Path

from xformopt.onnx_graph import needs_external_data
from xformopt.onnx_graph import producers as graph_producers


def _transposed_reads(graph) -> list[tuple[object, str]]:
    """(node, weight name) for every ``FusedMatMul(x, W, transB=1)`` and ``MatMul(x, Transpose(W))`` over a
    2-D initializer ``W`` with nothing else changed (no alpha, no transA, no batch transposes)."""
    inits = {i.name: i for i in graph.initializer}
    producers = graph_producers(graph)
    found = []
    for node in graph.node:
        if node.op_type == "FusedMatMul" and len(node.input) == 2 and node.input[1] in inits:
            attrs = {a.name: (a.f if a.type == a.FLOAT else a.i) for a in node.attribute}
            plain = attrs.get("alpha", 1.0) == 1.0 and not any(attrs.get(k, 0) for k in ("transA", "transBatchA", "transBatchB"))
            if attrs.get("transB", 0) == 1 and plain and len(inits[node.input[1]].dims) == 2:
                found.append((node, node.input[1]))
        elif node.op_type == "MatMul" and node.input[1] in producers:
            t = producers[node.input[1]]
            perm = [list(a.ints) for a in t.attribute if a.name == "perm"]
            if t.op_type == "Transpose" and t.input[0] in inits and len(inits[t.input[0]].dims) == 2 and perm in ([], [[1, 0]]):
                found.append((node, t.input[0]))
    return found


def transposed_weight_nodes(model_path: Path) -> list[str]:
    """The nodes that read a weight transposed (what :func:`untie` rewrites), by name."""
    from xformopt.onnx_graph import load_graph

    return [node.name for node, _ in _transposed_reads(load_graph(model_path).graph)]


def untie(model_in: Path, model_out: Path) -> list[str]:
    """Writes ``model_in`` to ``model_out`` with every transposed weight read as ``MatMul(x, W^T)`` over a new
    initializer ``W^T`` (one per weight); returns the rewritten nodes' names (none: nothing is written)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(model_in))
    reads = _transposed_reads(model.graph)
    if not reads:
        return []
    inits = {i.name: i for i in model.graph.initializer}
    copies: dict[str, str] = {}
    for node, weight in reads:
        if weight not in copies:
            copies[weight] = f"{weight}.transposed"
            array = numpy_helper.to_array(inits[weight]).T.copy()
            model.graph.initializer.append(numpy_helper.from_array(array, copies[weight]))
        rewritten = helper.make_node("MatMul", [node.input[0], copies[weight]], list(node.output), name=node.name)
        index = list(model.graph.node).index(node)
        model.graph.node.remove(node)
        model.graph.node.insert(index, rewritten)
    # the copy can take a graph near protobuf's 2 GB past it: weights beside it then
    external = needs_external_data(model_in) or model.ByteSize() > (1 << 31) * 0.9
    onnx.save(model, str(model_out), **({"save_as_external_data": True, "all_tensors_to_one_file": True,
                                          "location": f"{Path(model_out).name}.data"} if external else {}))
    return [node.name for node, _ in reads]
