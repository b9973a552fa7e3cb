"""A tensor's subgraph in an ONNX graph: the nodes computing it, run alone in ONNX Runtime, and swapped for other nodes
(the checked rewrites of :mod:`xformopt.seq2seq.slim` and :mod:`xformopt.seq2seq.slim_encoder` evaluate the
subgraph they replace before they replace it)."""

from __future__ import annotations

from xformopt.onnx_graph import producers as graph_producers
from xformopt.runtime.session import ort_session


def cone(graph, name: str) -> tuple[list, set[str], set[str]]:
    """The nodes computing ``name`` (graph order), the graph inputs whose values they read and those read only
    through ``Shape``."""
    producers, inputs = graph_producers(graph), {i.name for i in graph.input}
    wanted, stack, values, shapes = set(), [name], set(), set()
    while stack:
        node = producers.get(stack.pop())
        if node is None or id(node) in wanted:
            continue
        wanted.add(id(node))
        for tensor in node.input:
            if tensor in inputs:
                (shapes if node.op_type == "Shape" else values).add(tensor)
            elif tensor:
                stack.append(tensor)
    return [n for n in graph.node if id(n) in wanted], values, shapes - values


def evaluator(model, name: str):
    """A function feeding {input: array} to the subgraph that computes ``name`` alone (ORT, one thread)."""
    nodes, _, _ = cone(model.graph, name)
    used = {t for n in nodes for t in n.input}
    return nodes_evaluator(model, nodes, [t for t in model.graph.initializer if t.name in used], name)


def nodes_evaluator(model, nodes: list, initializers: list, name: str):
    """A function feeding {input: array} to ``nodes`` (reading ``model``'s inputs and ``initializers``) and returning
    ``name`` (ORT, one thread)."""
    import onnx

    read = {t for n in nodes for t in n.input}
    known = [v.type.tensor_type.elem_type for v in model.graph.value_info if v.name == name]
    sub = onnx.helper.make_graph(  # an attention bias is float unless the graph says otherwise
        nodes, "cone", [i for i in model.graph.input if i.name in read],
        [onnx.helper.make_tensor_value_info(name, known[0] if known else onnx.TensorProto.FLOAT, None)],
        initializers)
    cut = onnx.helper.make_model(sub, opset_imports=model.opset_import, ir_version=model.ir_version)
    session = ort_session(cut.SerializeToString(), threads=1)
    names = [i.name for i in session.get_inputs()]
    return lambda feed: session.run(None, {k: v for k, v in feed.items() if k in names})[0]


def replace_output(graph, name: str, nodes: list, tables: list) -> None:
    """``nodes`` compute ``name`` from now on (the old producer's output is renamed, left for :func:`drop_dead`)."""
    old = graph_producers(graph)[name]
    old.output[list(old.output).index(name)] = f"{name}/replaced"
    graph.initializer.extend(tables)
    for info in [v for v in graph.value_info if v.name == name]:  # the old shape (e.g. per-head) no longer holds
        graph.value_info.remove(info)
    for i, node in enumerate(nodes):  # they read inputs and initializers only: first in graph order
        graph.node.insert(i, node)
