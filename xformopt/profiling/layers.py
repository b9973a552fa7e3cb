"""Which transformer layer each node of a graph belongs to, from the names the exporter left.

Fused nodes lose the layer in their own name (``Attention_0``, ``SkipLayerNorm_AddBias_3``), so a
node's layer is read from its name, else its weights' (initializer) names, else its outputs' names
(``layer.3``, ``layers.3``, ``h.3``, ``block.3``; ``embeddings``); a node none of these name takes the layer of what
it feeds (a fused attention node reads the previous layer's output), or "embeddings" when it runs
before the first layer and "head" when after the last. A graph whose names name no layer gets none.
"""

from __future__ import annotations

import re

from xformopt.profiling.ops import category

_LAYER = re.compile(r"(?:^|[./_])(?:layers?|h|blocks?)[._/](\d+)(?=$|[./_])", re.IGNORECASE)
EMBEDDINGS = "embeddings"
# What only a layer does: a node of these kinds that nothing named feeds (layer 0's fused attention,
# fed by the embeddings) belongs to the layer it feeds, not to the embeddings.
LAYER_WORK = frozenset({"attention", "gemm", "layer norm", "activation"})
HEAD = "head"


def layer_number(name: str) -> int | None:
    found = _LAYER.search(name or "")
    return int(found.group(1)) if found else None


_EMBEDDING = re.compile(r"embed", re.IGNORECASE)
_BEFORE_LAYERS = -1  # named as the embeddings' own (word/position embeddings, their LayerNorm)


def _direct(node, initializers: set[str]) -> int | None:
    names = [node.name, *(i for i in node.input if i in initializers), *node.output]
    for name in names:
        number = layer_number(name)
        if number is not None:
            return number
    return _BEFORE_LAYERS if any(_EMBEDDING.search(name or "") for name in names) else None


def node_layers(graph) -> dict[str, str]:
    """Node name -> "layer N", "embeddings" or "head" for every named node of an onnx GraphProto."""
    initializers = {i.name for i in graph.initializer}
    nodes = list(graph.node)  # an ONNX graph is stored in topological order
    producer = {out: i for i, node in enumerate(nodes) for out in node.output}
    direct = [_direct(node, initializers) for node in nodes]
    # Forward: the latest layer among what feeds a node.
    forward: list[int | None] = [None] * len(nodes)
    for i, node in enumerate(nodes):
        fed = [forward[producer[x]] for x in node.input if x in producer and forward[producer[x]] is not None]
        forward[i] = direct[i] if direct[i] is not None else (max(fed) if fed else None)
    # Backward: the earliest layer among what a node feeds (None: nothing after it is in a layer).
    consumers: dict[int, list[int]] = {}
    for i, node in enumerate(nodes):
        for x in node.input:
            if x in producer:
                consumers.setdefault(producer[x], []).append(i)
    backward: list[int | None] = [None] * len(nodes)
    for i in range(len(nodes) - 1, -1, -1):
        fed = [backward[j] for j in consumers.get(i, ()) if backward[j] is not None]
        backward[i] = direct[i] if direct[i] is not None else (min(fed) if fed else None)
    if all(d is None for d in direct):
        return {}  # names say nothing about layers: every node stays unmapped rather than guessed
    labels = {}
    for i, node in enumerate(nodes):
        before, after = forward[i], backward[i]
        if direct[i] is not None:
            layer = direct[i]
        elif before is None:  # runs before anything named: the embeddings, the mask's casts
            layer = after if after is not None and after >= 0 and category(node.op_type) in LAYER_WORK else _BEFORE_LAYERS
        elif after is None:
            layer = None
        else:
            layer = after
        label = HEAD if layer is None else (EMBEDDINGS if layer < 0 else f"layer {layer}")
        if node.name:
            labels[node.name] = label
    return labels


def sort_key(label: str) -> tuple:
    if label == EMBEDDINGS:
        return (0, 0)
    if label.startswith("layer "):
        return (1, int(label.split()[1]))
    return (2, 0) if label == HEAD else (3, 0)
