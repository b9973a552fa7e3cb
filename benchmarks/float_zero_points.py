"""One SmolLM2-sized weight (K=576, N=1536, Q4_1-like blocks of 32) at batch 1, the ways MatMulNBits can
carry ``d*q + m``, timed interleaved at each thread count (ORT CPU, accuracy_level 4 unless told):

- ``exact carry``: default zero point 8 plus the minimum term (Reshape, ReduceSum, MatMul [K/32, N], Add),
  what the int4 pass ships (passes/int4/gguf_blocks.py);
- ``float zero points``: one op, ``zp = -m/d`` as fp32 zero points (MatMulNBits' T1-typed zero points);
- ``uint8 zero points``: one op, ``zp = round(-m/d)`` (not exact: +27% perplexity on SmolLM2), the floor;
- ``symmetric``: one op, no zero points at all.

    python benchmarks/float_zero_points.py --threads 1,2 --rounds 5

Also prints each variant's max |output - exact fp64 reference| so the float-zero-point error is visible.
Never run as a test: speed claims live here.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import xformopt  # noqa: F401  (imported before onnxruntime: its telemetry stays off, docs/privacy.md)

K, N, BLOCK = 576, 1536, 32


def weights(seed: int = 0):
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 16, size=(N, K // BLOCK, BLOCK), dtype=np.uint8)
    d = (rng.uniform(0.002, 0.02, size=(N, K // BLOCK))).astype(np.float16).astype(np.float32)
    m = (-8.5 * d * rng.uniform(0.7, 1.3, size=d.shape)).astype(np.float16).astype(np.float32)
    return q, d, m


def graph(variant: str, q, d, m, level: int):
    from onnx import TensorProto, helper, numpy_helper

    from xformopt.passes.int4.gguf_blocks import pack_b, pack_zero_points

    kb = K // BLOCK
    inits = [numpy_helper.from_array(pack_b(q, 4), "B"), numpy_helper.from_array(d.reshape(-1), "S")]
    inputs = ["X", "B", "S"]
    out = "Y" if variant != "exact carry" else "Yq"
    if variant == "float zero points":
        inits.append(numpy_helper.from_array((-m / d).astype(np.float32).reshape(-1), "ZP"))
        inputs.append("ZP")
    elif variant == "uint8 zero points":
        inits.append(numpy_helper.from_array(pack_zero_points(np.clip(np.rint(-m / d), 0, 15).astype(np.uint8)), "ZP"))
        inputs.append("ZP")
    nodes = [helper.make_node("MatMulNBits", inputs, [out], domain="com.microsoft", K=K, N=N, bits=4,
                              block_size=BLOCK, accuracy_level=level)]
    if variant == "exact carry":
        inits += [numpy_helper.from_array(np.array([0, 0, kb, BLOCK], dtype=np.int64), "shape"),
                  numpy_helper.from_array(np.array([-1], dtype=np.int64), "axes"),
                  numpy_helper.from_array(np.ascontiguousarray((m + 8 * d).T), "M")]
        nodes += [helper.make_node("Reshape", ["X", "shape"], ["Xb"]),
                  helper.make_node("ReduceSum", ["Xb", "axes"], ["Sx"], keepdims=0),
                  helper.make_node("MatMul", ["Sx", "M"], ["Ym"]), helper.make_node("Add", ["Yq", "Ym"], ["Y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1, K])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])


def main() -> None:
    import onnxruntime as ort

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--accuracy-level", type=int, default=4)
    args = parser.parse_args()
    q, d, m = weights()
    x = np.random.default_rng(1).standard_normal((1, 1, K)).astype(np.float32)
    reference = x.reshape(1, K).astype(np.float64) @ (d[..., None] * q + m[..., None]).reshape(N, K).T.astype(np.float64)
    variants = ["exact carry", "float zero points", "uint8 zero points", "symmetric"]
    sessions = {}
    for threads in [int(t) for t in args.threads.split(",")]:
        for variant in variants:
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = threads
            model = graph(variant, q, d, m, args.accuracy_level)
            sessions[variant, threads] = ort.InferenceSession(model.SerializeToString(), opts,
                                                              providers=["CPUExecutionProvider"])
    times = {key: [] for key in sessions}
    for r in range(args.rounds):
        keys = list(sessions)
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:  # rotating order
            session = sessions[key]
            for _ in range(50):
                session.run(None, {"X": x})
            start = time.perf_counter()
            for _ in range(args.calls):
                session.run(None, {"X": x})
            times[key].append((time.perf_counter() - start) / args.calls * 1e6)
    print(f"K={K} N={N} block {BLOCK}, accuracy_level {args.accuracy_level}, {args.rounds} interleaved rounds of "
          f"{args.calls} calls, median us per call")
    print("| variant | threads | us per call | max abs error vs fp64 d*q+m |")
    print("|---|---|---|---|")
    for (variant, threads), values in times.items():
        y = sessions[variant, threads].run(None, {"X": x})[0].reshape(1, N)
        error = float(np.abs(y - reference).max())
        print(f"| {variant} | {threads} | {statistics.median(values):.1f} | {error:.2e} |")


if __name__ == "__main__":
    main()
