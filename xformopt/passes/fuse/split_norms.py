"""SkipLayerNormalization written back as ``Sum`` + ``LayerNormalization``, for ONNX Runtime's CPU kernels.

ORT's CPU ``SkipLayerNormalization`` (float) normalizes one row at a time in plain loops; its
``LayerNormalization`` kernel is vectorized. On the host measured (2-vCPU Zen 4) the pair ran 2.5-6.5x faster
than the fused node for the same rows at one thread (``benchmarks/layer_norm_kernels.py``,
docs/results/layer-norm-kernels.md). ORT's own ``SkipLayerNormFusion`` turns an ``Add`` feeding
``LayerNormalization`` back into the slow node when a session loads the graph, but not a ``Sum``: the
split survives any session, in xformopt or outside it. Whether it pays is the host's call: ``fuse``
offers split graphs as candidates and keeps them only where they time faster.
"""

from __future__ import annotations

MS_DOMAIN = "com.microsoft"
# ORT's default epsilon for SkipLayerNormalization (contrib_defs: kDefaultSkipLayerNormEpsilon).
SKIP_NORM_DEFAULT_EPSILON = 1e-12


def _attribute(node, name: str, default: float) -> float:
    return next((a.f for a in node.attribute if a.name == name), default)


def _unique(name: str, taken: set[str]) -> str:
    candidate, n = name, 1
    while candidate in taken:
        candidate, n = f"{name}_{n}", n + 1
    taken.add(candidate)
    return candidate


def _float_norm(node, float_tensors: set[str]) -> bool:
    """Only float32 layer norms: ORT's fp16 kernels are another code path, not measured here."""
    return node.input[2] in float_tensors


def split_skip_norms(model) -> int:
    """Rewrite every float ``SkipLayerNormalization`` of ``model`` (a ModelProto, edited in place) as
    ``Sum(input, skip[, bias])`` -> ``LayerNormalization(sum, gamma[, beta])``; returns how many.

    Outputs 1 and 2 (mean, inverse standard deviation) exist for training only: a node whose mean or
    deviation something reads is left as it is (onnxscript's fusion names them even when nothing does).
    Output 3 (the sum) becomes the Sum's output, so its readers are unchanged.
    """
    from onnx import TensorProto, helper

    graph = model.graph
    float_tensors = {t.name for t in graph.initializer if t.data_type == TensorProto.FLOAT}
    taken = {o for n in graph.node for o in n.output} | {n.name for n in graph.node}
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    rewritten: list = []
    count = 0
    for node in graph.node:
        outputs = [o if o in read else "" for o in [*node.output, "", "", ""][:4]]
        if (node.op_type != "SkipLayerNormalization" or node.domain != MS_DOMAIN or outputs[1] or outputs[2]
                or len(node.input) < 3 or not _float_norm(node, float_tensors)):
            rewritten.append(node)
            continue
        inputs = [*node.input, "", ""][:5]
        summed = outputs[3] or _unique(f"{node.name}_sum", taken)
        rewritten.append(helper.make_node(
            "Sum", [inputs[0], inputs[1], *([inputs[4]] if inputs[4] else [])], [summed],
            name=_unique(f"{node.name}_Sum", taken)))
        rewritten.append(helper.make_node(
            "LayerNormalization", [summed, inputs[2], *([inputs[3]] if inputs[3] else [])], [node.output[0]],
            name=node.name, axis=-1, epsilon=_attribute(node, "epsilon", SKIP_NORM_DEFAULT_EPSILON)))
        count += 1
    if count:
        # LayerNormalization is an ONNX op from opset 17; under an older opset ORT still runs it (it registers
        # the op in the ONNX domain from version 1, as its own optimizer writes it there).
        del graph.node[:]
        graph.node.extend(rewritten)
    return count
