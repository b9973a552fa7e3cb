"""What one ONNX Runtime node costs at the trained tiny T5's shapes (d_model 64, 4 heads of 16; a decoder step: one
token, a past of 8; the encoder graph: 8 source tokens), one thread (issue 55): a graph of that one node, run 1,000 times per round, less a graph of
one ``Identity`` (the call's own cost), median over interleaved rounds. The decoder step's ~40 nodes are these.

Run: python benchmarks/ort_node_costs.py --out benchmarks/results/seq2seq-encoder-slim
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

HIDDEN, HEADS, HEAD, PAST = 64, 4, 16, 8


def _session(nodes, feeds: dict, initializers=(), opset: int = 18):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes, "one", [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape) for n, a in feeds.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in nodes[-1].output], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return lambda: session.run(None, feeds)


def cases() -> dict:
    from onnx import helper
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(0)
    normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    x = {"x": normal(1, 1, HIDDEN)}
    cache = {"k": normal(1, HEADS, PAST, HEAD), "v": normal(1, HEADS, PAST, HEAD)}
    source = normal(1, PAST, HIDDEN)  # an 8-token source, projected
    ms = "com.microsoft"
    return {
        "Identity": _session([helper.make_node("Identity", ["x"], ["y"])], x),
        "MatMul 64x64": _session([helper.make_node("MatMul", ["x", "w"], ["y"])], x, [nh.from_array(normal(64, 64), "w")]),
        "MatMul 64x128": _session([helper.make_node("MatMul", ["x", "w"], ["y"])], x, [nh.from_array(normal(64, 128), "w")]),
        "DynamicQuantizeMatMul 64x64": _session(
            [helper.make_node("DynamicQuantizeMatMul", ["x", "w", "s", "z"], ["y"], domain=ms)], x,
            [nh.from_array(rng.integers(-127, 127, (64, 64)).astype(np.int8), "w"),
             nh.from_array(np.array([0.01], np.float32), "s"), nh.from_array(np.array([0], np.int8), "z")]),
        "SkipSimplifiedLayerNormalization": _session(
            [helper.make_node("SkipSimplifiedLayerNormalization", ["x", "x", "g"], ["y"], domain=ms, epsilon=1e-6)], x,
            [nh.from_array(np.ones(HIDDEN, np.float32), "g")]),
        "Relu": _session([helper.make_node("Relu", ["x"], ["y"])], x),
        "MultiHeadAttention self, past 8, bias": _session(
            [helper.make_node("MultiHeadAttention", ["x", "x", "x", "", "", "b", "k", "v"], ["y", "pk", "pv"], domain=ms,
                              num_heads=HEADS, scale=1.0)], {**x, "b": normal(1, HEADS, 1, PAST + 1), **cache}),
        "MultiHeadAttention cross, 8 keys, mask bias": _session(
            [helper.make_node("MultiHeadAttention", ["x", "k", "v", "", "", "b"], ["y"], domain=ms, num_heads=HEADS,
                              scale=1.0)], {**x, "b": np.zeros((1, 1, 1, PAST), np.float32), **cache}),
        "MultiHeadAttention cross, 8 keys, no bias": _session(
            [helper.make_node("MultiHeadAttention", ["x", "k", "v"], ["y"], domain=ms, num_heads=HEADS, scale=1.0)],
            {**x, **cache}),
        "MultiHeadAttention encoder self, 8 tokens, bias": _session(
            [helper.make_node("MultiHeadAttention", ["s", "s", "s", "", "", "b"], ["y"], domain=ms, num_heads=HEADS,
                              scale=1.0)], {"s": source, "b": normal(1, HEADS, PAST, PAST)}),
        "Attention (opset 23) encoder self, 8 tokens, bias": _session(
            [helper.make_node("Attention", ["s", "s", "s", "b"], ["y"], q_num_heads=HEADS, kv_num_heads=HEADS,
                              scale=1.0)], {"s": source, "b": normal(1, HEADS, PAST, PAST)}, opset=23),
        "MultiHeadAttention first-step cross, 8 keys, cache outputs": _session(
            [helper.make_node("MultiHeadAttention", ["x", "s", "s"], ["y", "pk", "pv"], domain=ms, num_heads=HEADS,
                              scale=1.0)], {**x, "s": source}),
        "Attention (opset 23) first-step cross, 8 keys, cache outputs": _session(
            [helper.make_node("Attention", ["x", "s", "s"], ["y", "pk", "pv"], q_num_heads=HEADS, kv_num_heads=HEADS,
                              scale=1.0)], {**x, "s": source}, opset=23),
        "Attention (opset 23) self, past 8, bias": _session(
            [helper.make_node("Attention", ["x", "x", "x", "b", "k", "v"], ["y", "pk", "pv"], q_num_heads=HEADS,
                              kv_num_heads=HEADS, scale=1.0)], {**x, "b": normal(1, HEADS, 1, PAST + 1), **cache},
            opset=23),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from xformopt.measure.host import cpu_model, library_versions

    runs = cases()
    seconds = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            started = time.perf_counter()
            for _ in range(args.calls):
                run()
            seconds[name].append(time.perf_counter() - started)
    per_call = {name: float(np.median(s)) / args.calls * 1e6 for name, s in seconds.items()}
    node = {name: us - per_call["Identity"] for name, us in per_call.items() if name != "Identity"}
    result = {"host": cpu_model(), "versions": library_versions(), "threads": 1, "rounds": args.rounds,
              "calls": args.calls, "call_us": per_call["Identity"], "node_us": node}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ort-node-costs.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
