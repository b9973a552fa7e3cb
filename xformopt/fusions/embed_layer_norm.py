"""The embedding block of a dynamo-exported encoder into ONNX Runtime's ``EmbedLayerNormalization``.

ORT's optimizer fuses BERT's embeddings (word + token-type + position gathers, their sum, the layer norm)
only in the graph the TorchScript exporter wrote, and onnxscript's ORT rewriter has no such rule; on a
dynamo export the block stays five to seven nodes. This fusion matches it by what it computes: a
``LayerNormalization`` of the sum of two or three ``Gather`` rows of constant tables, one indexed by
``input_ids``, one (optionally) by ``token_type_ids``, one by any position-id expression, which becomes
the op's ``position_ids`` input, so BERT's ``arange`` and RoBERTa's padding-aware positions alike stay
exact. Written on ORT's OnnxModel like the family fusions beside it (xformopt/fusions/).
"""

from __future__ import annotations

from onnx import TensorProto, helper

WORDS, SEGMENTS = "input_ids", "token_type_ids"


def _leaves(add, producer) -> tuple[list, list] | None:
    """(Gather leaves, Add nodes) of a sum of two or three Gathers (nested Adds, any order)."""
    gathers, adds = [], [add]
    for name in add.input:
        node = producer.get(name)
        if node is not None and node.op_type == "Add" and len(adds) < 2:
            adds.append(node)
            gathers += [producer.get(inner) for inner in node.input]
        else:
            gathers.append(node)
    if all(g is not None and g.op_type == "Gather" for g in gathers) and len(gathers) in (2, 3):
        return gathers, adds
    return None


def fuse(onnx_model) -> int:
    """Fuse every matching embedding block of ``onnx_model`` (ORT's OnnxModel); returns how many."""
    graph = onnx_model.model.graph
    tables = {i.name for i in graph.initializer}
    inputs = {i.name for i in graph.input}
    producer = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            consumers[name] = consumers.get(name, 0) + 1
    fused = 0
    for norm in [n for n in graph.node if n.op_type == "LayerNormalization"]:
        add = producer.get(norm.input[0])
        found = _leaves(add, producer) if add is not None and add.op_type == "Add" else None
        if found is None or len(norm.input) < 3 or any(i not in tables for i in norm.input[1:3]):
            continue
        gathers, adds = found
        by_index = {g.input[1]: g for g in gathers}
        word, segment = by_index.get(WORDS), by_index.get(SEGMENTS)
        rest = [g for g in gathers if g is not word and g is not segment]
        if word is None or len(rest) != 1 or WORDS not in inputs or any(g.input[0] not in tables for g in gathers):
            continue
        position = rest[0]
        inner = [*(g.output[0] for g in gathers), *(a.output[0] for a in adds[1:])]
        if any(consumers.get(name, 0) != 1 for name in inner) or any(len(n.output) > 1 and n.output[1] for n in [norm]):
            continue
        prefix = norm.name or f"EmbedLayerNormalization_{fused}"
        casts = [helper.make_node("Cast", [name], [f"{prefix}/{name}_int32"], to=TensorProto.INT32,
                                  name=f"{prefix}/Cast_{name}")
                 for name in (WORDS, *( [SEGMENTS] if segment is not None else []), position.input[1])]
        ids = {name: f"{prefix}/{name}_int32" for name in (WORDS, SEGMENTS, position.input[1])}
        epsilon = next((a.f for a in norm.attribute if a.name == "epsilon"), 1e-5)
        embed = helper.make_node(
            "EmbedLayerNormalization",
            [ids[WORDS], ids[SEGMENTS] if segment is not None else "", word.input[0], position.input[0],
             segment.input[0] if segment is not None else "", norm.input[1], norm.input[2], "", ids[position.input[1]]],
            # mask_index is unused (attention keeps its own mask) but the op's type inference wants it
            [norm.output[0], f"{prefix}/mask_index"], name=f"{prefix}/EmbedLayerNormalization", domain="com.microsoft",
            epsilon=epsilon)
        onnx_model.remove_nodes([norm, *adds, *gathers])
        onnx_model.add_nodes([*casts, embed])
        fused += 1
    if fused:
        onnx_model.prune_graph()
        onnx_model.topological_sort()
    return fused
