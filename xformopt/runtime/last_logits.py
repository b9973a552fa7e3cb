"""Logits of the last position only: a prompt step needs the next token's distribution, not one per
prompt position.

The exported decoders run the language-model head on every new position: for a 128-token prompt of
SmolLM2 that is 128 x 49152 x 576 multiply-adds in the head alone, about a fifth of the prompt step.
:func:`rewritten` inserts one ``Slice`` (the last position along the sequence axis) on the final
norm's output, before every node of the head, in memory: the artifact is not touched and no weight is
copied (the session reads them from the artifact's folder). A decode step feeds one position, so its logits are
unchanged; a prompt step returns ``(batch, 1, vocab)``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

NORMS = ("SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
         "LayerNormalization", "RMSNormalization")
SLICED = "xformopt_last_position"


def head_input(graph) -> tuple[str, list] | None:
    """(the final norm's output that the head reads, the head's nodes), walking back from ``logits``;
    None when no norm is found or the head already reads one position."""
    producer = {out: node for node in graph.node for out in node.output}
    head, frontier = [], ["logits"]
    while frontier:
        name = frontier.pop()
        node = producer.get(name)
        if node is None or node in head:
            continue
        if node.op_type in NORMS:
            if name != node.output[0]:
                return None
            return (None if any(n.name == SLICED for n in graph.node) else name), head
        if node.op_type == "Slice":
            return None
        head.append(node)
        frontier.extend(i for i in node.input if i)
    return None


def rewritten(model_dir: Path) -> bytes | None:
    """The artifact's graph with the last-position slice, serialized (its weights stay external, in
    ``model_dir``: open it with ``ort_session(bytes, external_data_dir=model_dir)``); None when the graph
    cannot take it (no final norm found, or the head already reads one position): use the original."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(Path(model_dir) / "model.onnx"), load_external_data=False)
    graph = model.graph
    found = head_input(graph)
    if found is None or found[0] is None:
        return None
    normed, head = found
    sliced = normed + "/last_position"
    for node in head:
        node.input[:] = [sliced if i == normed else i for i in node.input]
    constants = {"starts": -1, "ends": 2**62, "axes": 1}
    for key, value in constants.items():
        graph.initializer.append(numpy_helper.from_array(np.array([value], dtype=np.int64), f"{SLICED}/{key}"))
    norm_at = next(i for i, node in enumerate(graph.node) if normed in node.output)
    graph.node.insert(norm_at + 1, helper.make_node("Slice", [normed, *(f"{SLICED}/{k}" for k in constants)],
                                                    [sliced], name=SLICED))  # nodes stay in topological order
    for out in graph.output:
        dims = out.type.tensor_type.shape.dim
        if out.name == "logits" and len(dims) == 3:
            dims[1].ClearField("dim_param")
            dims[1].dim_value = 1
    return model.SerializeToString()
