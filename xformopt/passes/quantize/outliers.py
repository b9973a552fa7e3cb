"""Activation outliers that per-tensor INT8 cannot hold, treated in the float graph before quantizing.

A family names the GEMMs whose inputs carry a few channels far above the rest (``Family.int8_outliers``:
regex -> treatment), matched against a node's name or its module path (:func:`module_path`: the dynamo
exporter names nodes ``node_linear_5``, so a rule names ``model.encoder.block.0.layer.1.DenseReluDense.wo``).
Dynamic INT8 gives a whole activation tensor one scale, so one channel at |x| = 100 beside a median of 2
leaves the others a handful of levels. Treatments, each exact in float (checked):

- ``smooth`` (SmoothQuant, Xiao et al. 2023): per input channel j, s_j = max|x_j|^a / max|W_j|^(1-a);
  an explicit ``Mul`` divides the activation by s and the weight rows are multiplied by s. (The input
  of an FFN also feeds the residual, so s cannot be folded into the layer norm before it.)
- ``split``: the k input channels with the largest |x| get their own GEMM, so their own dynamic scale.
  The channels are moved to the end by permuting the producing MatMul's columns, the per-channel ops
  between (bias, GELU) and the GEMM's rows, so two contiguous ``Slice``s cut them (a ``Gather`` per
  GEMM cost a third of the INT8 speed-up on all-mpnet-base-v2).
- ``float``: the GEMM is kept in float.

Hand-written because no library does it for ONNX graphs: ORT's ``SmoothQuant`` option imports
neural-compressor 2.x's ONNX backend, which 3.x removed (``passes/quantize/calibration.py``).
"""

from __future__ import annotations

import ast
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import numpy as np

from xformopt.errors import PassFailed
from xformopt.measure import memory

Treatment = Literal["smooth", "split", "float"]
SMOOTH_ALPHA = 0.5
SPLIT_CHANNELS = 8
RANGE_TEXTS = 64
# Ops between the producing MatMul and the split GEMM that act per channel: (op, index of a per-channel
# parameter input or None).
PER_CHANNEL = {"BiasGelu": 1, "FastGelu": 1, "Gelu": None, "Relu": None, "Add": 1}


NAME_SCOPES = "pkg.torch.onnx.name_scopes"  # the dynamo exporter's node metadata: the module scopes, outermost first


def module_path(node) -> str | None:
    """The PyTorch module a dynamo-exported node came from (``model.decoder.block.0.layer.2.DenseReluDense.wo``),
    or None (a TorchScript export, a node a fusion or rewrite created). The scopes end with the aten
    call's own name (``linear``); the one before it is the module's path."""
    for prop in node.metadata_props:
        if prop.key == NAME_SCOPES:
            try:
                scopes = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                return None
            return scopes[-2] if isinstance(scopes, list) and len(scopes) >= 2 and scopes[-2] else None
    return None


def matching(names: Iterable[str], rules: tuple[tuple[str, Treatment], ...],
             paths: dict[str, str | None] | None = None) -> dict[str, Treatment]:
    """node name -> treatment, the first rule whose regex matches the whole name or the whole module path
    (``paths``: node name -> :func:`module_path`)."""
    paths = paths or {}
    out = {}
    for name in names:
        keys = [name] + ([paths[name]] if paths.get(name) else [])
        for pattern, treatment in rules:
            if any(re.fullmatch(pattern, key) for key in keys):
                out[name] = treatment
                break
    return out


def channel_ranges(model, tensors: list[str], feeds: Iterable[dict]) -> dict[str, np.ndarray]:
    """max |x| per last-axis channel of each tensor, over the feeds (one unpadded row each)."""
    import onnx
    import onnxruntime as ort

    # The tensors become graph outputs only in the probe file: the model gets its outputs back at once
    # (a copy of the ModelProto, or a session from bytes, which ORT keeps, would hold every weight twice).
    known = {o.name for o in model.graph.output}
    added = [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in tensors if name not in known]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the names must survive
    with tempfile.TemporaryDirectory(prefix="xformopt-ranges-") as scratch:
        model.graph.output.extend(added)
        try:
            onnx.save(model, f"{scratch}/probe.onnx")
        finally:
            for _ in added:
                model.graph.output.pop()
        session = ort.InferenceSession(f"{scratch}/probe.onnx", options, providers=["CPUExecutionProvider"])
    ranges: dict[str, np.ndarray] = {}
    for feed in feeds:
        for name, value in zip(tensors, session.run(tensors, feed)):
            peak = np.abs(value.reshape(-1, value.shape[-1])).max(0)
            ranges[name] = np.maximum(ranges[name], peak) if name in ranges else peak
    if not ranges:
        raise PassFailed("outlier treatment: no calibration rows to measure activation ranges on")
    return ranges


class Graph:
    """Producers, consumers and initializers of an ONNX graph, for the rewrites below."""

    def __init__(self, model):
        from onnx import numpy_helper

        self.model, self.graph = model, model.graph
        self.init = {i.name: i for i in self.graph.initializer}
        self.producer = {o: n for n in self.graph.node for o in n.output}
        self.consumers: dict[str, list] = {}
        for n in self.graph.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self._np = numpy_helper

    def array(self, name: str) -> np.ndarray:
        return self._np.to_array(self.init[name])

    def set_array(self, name: str, value: np.ndarray) -> None:
        self.init[name].CopyFrom(self._np.from_array(np.ascontiguousarray(value, dtype=np.float32), name))

    def add_array(self, name: str, value: np.ndarray) -> str:
        tensor = self._np.from_array(np.ascontiguousarray(value), name)
        self.graph.initializer.append(tensor)
        self.init[name] = tensor
        return name

    def insert(self, node, before: list, after: list = ()) -> None:
        """New nodes around ``node``, keeping the graph topologically sorted (ORT's quantizer needs it)."""
        at = list(self.graph.node).index(node)
        for offset, item in enumerate(after):
            self.graph.node.insert(at + 1 + offset, item)
        for offset, item in enumerate(before):
            self.graph.node.insert(at + offset, item)


def smooth(g: Graph, node, peak: np.ndarray, alpha: float) -> dict:
    from onnx import helper

    w = g.array(node.input[1])
    scale = np.clip(peak, 1e-5, None) ** alpha / np.clip(np.abs(w).max(1), 1e-5, None) ** (1 - alpha)
    scale = scale / np.exp(np.log(scale).mean())  # s only reshapes the channels, not the overall range
    g.set_array(node.input[1], w * scale[:, None])
    inverse = g.add_array(f"{node.name}/smooth_inverse", (1 / scale).astype(np.float32))
    smoothed = f"{node.name}/smoothed_input"
    g.insert(node, [helper.make_node("Mul", [node.input[0], inverse], [smoothed], name=f"{node.name}/smooth")])
    node.input[0] = smoothed
    after = peak / scale
    return {"treatment": "smooth", "alpha": alpha, "input_peak": float(peak.max()), "peak_over_median": _ratio(peak),
            "after_peak_over_median": _ratio(after)}


def producing_chain(g: Graph, tensor: str) -> tuple[object, list]:
    """The MatMul whose output channels reach ``tensor`` through per-channel ops only, and those ops;
    every tensor on the way has one consumer (a permutation must not reach anything else)."""
    chain = []
    while True:
        node = g.producer.get(tensor)
        if node is None or len(g.consumers.get(tensor, [])) != 1:
            raise ValueError(f"{tensor} has {len(g.consumers.get(tensor, []))} consumers or no producer")
        if node.op_type == "MatMul" and node.input[1] in g.init:
            return node, chain
        if node.op_type not in PER_CHANNEL:
            raise ValueError(f"{node.op_type} {node.name!r} between the producing MatMul and the split GEMM")
        param = PER_CHANNEL[node.op_type]
        if param is not None and (len(node.input) <= param or node.input[param] not in g.init
                                  or g.array(node.input[param]).ndim != 1):
            raise ValueError(f"{node.op_type} {node.name!r} has no 1-D constant on input {param}")
        chain.append(node)
        tensor = node.input[0]


def split(g: Graph, node, peak: np.ndarray, channels: int) -> dict:
    from onnx import helper

    source, chain = producing_chain(g, node.input[0])
    order = np.argsort(peak, kind="stable")  # ascending: the outliers last
    g.set_array(source.input[1], g.array(source.input[1])[:, order])
    for op in chain:
        if PER_CHANNEL[op.op_type] is not None:
            g.set_array(op.input[PER_CHANNEL[op.op_type]], g.array(op.input[PER_CHANNEL[op.op_type]])[order])
    w = g.array(node.input[1])[order]
    width, keep = w.shape[0], w.shape[0] - channels
    x, y, base = node.input[0], node.output[0], node.name
    consts = {k: g.add_array(f"{base}/split_{k}", np.array([v], np.int64))
              for k, v in (("start", 0), ("cut", keep), ("end", width), ("axis", -1))}
    rest_w = g.add_array(f"{base}/weight_rest", w[:keep].astype(np.float32))
    outlier_w = g.add_array(f"{base}/weight_outliers", w[keep:].astype(np.float32))
    g.insert(node, before=[
        helper.make_node("Slice", [x, consts["start"], consts["cut"], consts["axis"]], [f"{x}/rest"], name=f"{base}/slice_rest"),
        helper.make_node("Slice", [x, consts["cut"], consts["end"], consts["axis"]], [f"{x}/outliers"],
                         name=f"{base}/slice_outliers"),
        helper.make_node("MatMul", [f"{x}/outliers", outlier_w], [f"{y}/outliers"], name=f"{base}/outliers"),
    ], after=[helper.make_node("Add", [f"{y}/rest", f"{y}/outliers"], [y], name=f"{base}/sum")])
    node.input[0], node.input[1], node.output[0] = f"{x}/rest", rest_w, f"{y}/rest"
    sorted_peak = peak[order]
    return {"treatment": "split", "channels": channels, "input_peak": float(peak.max()),
            "peak_over_median": _ratio(peak), "after_peak_over_median": _ratio(sorted_peak[:keep]),
            "outlier_gemm": f"{base}/outliers"}


def _ratio(peak: np.ndarray) -> float:
    return float(peak.max() / max(float(np.median(peak)), 1e-12))


def treat(src: Path, dst: Path, rules: tuple[tuple[str, Treatment], ...], feeds: list[dict],
          check_feeds: list[dict], alpha: float = SMOOTH_ALPHA, channels: int = SPLIT_CHANNELS) -> dict:
    """Write ``src`` with the rules' smooth/split rewrites to ``dst``; returns the record: what each
    node got, the GEMMs to keep float, and the float parity of the rewrite (it must be exact)."""
    record = _rewrite(src, dst, rules, feeds, alpha, channels)
    memory.release()  # the rewritten ModelProto is gone: parity reads both graphs from disk
    if record["nodes"]:
        record["float_parity_max_abs_diff"] = parity(src, dst, check_feeds)
    return record


def _rewrite(src: Path, dst: Path, rules: tuple[tuple[str, Treatment], ...], feeds: list[dict], alpha: float,
             channels: int) -> dict:
    # One function, so that every reference into the graph (a node or tensor keeps the whole
    # ModelProto alive) ends when it returns.
    import onnx

    model = onnx.load(str(src))
    g = Graph(model)
    weighted = [n for n in g.graph.node if n.op_type == "MatMul" and len(n.input) > 1 and n.input[1] in g.init]
    paths = {n.name: module_path(n) for n in weighted}
    plan = matching([n.name for n in weighted], rules, paths)
    nodes = {n.name: n for n in weighted if n.name in plan}
    rewritten = [name for name, t in plan.items() if t != "float"]
    record: dict = {"rules": [list(r) for r in rules], "nodes": {}, "kept_float": [n for n, t in plan.items() if t == "float"],
                    "skipped": {}}
    if rewritten:
        ranges = channel_ranges(model, sorted({nodes[n].input[0] for n in rewritten}), feeds)
        record["range_rows"] = len(feeds)
        for name in rewritten:
            node, peak = nodes[name], ranges[nodes[name].input[0]]
            try:
                record["nodes"][name] = (smooth(g, node, peak, alpha) if plan[name] == "smooth"
                                         else split(g, node, peak, min(channels, peak.size - 1)))
                if paths[name]:
                    record["nodes"][name]["module"] = paths[name]
            except ValueError as error:  # a graph shape the rewrite does not know: say so, quantize plainly
                record["skipped"][name] = str(error)
    used = {i for n in g.graph.node for i in n.input}
    initializers = g.graph.initializer
    for index in reversed(range(len(initializers))):  # in place: re-adding the kept ones would copy every weight
        if initializers[index].name not in used:
            del initializers[index]
    onnx.save(model, str(dst))
    return record


def parity(a: Path, b: Path, feeds: list[dict], tolerance: float = 1e-3) -> float:
    """Largest relative output difference of two float graphs on the feeds; a rewrite that changes the
    float result is a bug, so above ``tolerance`` the pass fails."""
    import onnxruntime as ort

    def outputs(path: Path) -> list[list[np.ndarray]]:  # one session at a time: two float graphs are twice the weights
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return [session.run(None, feed) for feed in feeds]

    worst = 0.0
    for xs, ys in zip(outputs(a), outputs(b)):
        for x, y in zip(xs, ys):
            worst = max(worst, float(np.abs(x - y).max() / max(float(np.abs(x).max()), 1e-6)))
    if worst > tolerance:
        raise PassFailed(f"outlier treatment changed the float outputs (max relative difference {worst:.2e} > "
                         f"{tolerance}); quantize with outlier_rules: false and report this graph")
    return worst
