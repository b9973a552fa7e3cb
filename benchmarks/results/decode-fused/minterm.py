import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

K, N, Kb = 576, 1536, 18
rng = np.random.default_rng(0)
x = rng.standard_normal((1, 1, K)).astype(np.float32)
I = np.repeat(np.eye(Kb, dtype=np.float32), 32, axis=0)
M = rng.standard_normal((Kb, N)).astype(np.float32)
Y = rng.standard_normal((1, 1, N)).astype(np.float32)
inits = [
    numpy_helper.from_array(I, "I"),
    numpy_helper.from_array(M, "M"),
    numpy_helper.from_array(np.array([0, 0, Kb, 32], dtype=np.int64), "s"),
    numpy_helper.from_array(np.array([-1], dtype=np.int64), "ax"),
    numpy_helper.from_array(Y, "Yc"),
]
R = [helper.make_node("Reshape", ["X", "s"], ["Xb"]), helper.make_node("ReduceSum", ["Xb", "ax"], ["S"], keepdims=0)]
IM = [helper.make_node("MatMul", ["X", "I"], ["S"])]
MM = [helper.make_node("MatMul", ["S", "M"], ["T"])]
ADD = [helper.make_node("Add", ["T", "Yc"], ["Out"])]
variants = {
    "reshape+reducesum": (R, "S"),
    "indicator matmul": (IM, "S"),
    "reduce+minMM": (R + MM, "T"),
    "reduce+minMM+add": (R + MM + ADD, "Out"),
    "indicator+minMM+add": (IM + MM + ADD, "Out"),
    "identity": ([helper.make_node("Identity", ["X"], ["Out"])], "Out"),
}
sess = {}
for t in (1, 2):
    for k, (nodes, out) in variants.items():
        g = helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1, K])],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
            inits,
        )
        o = ort.SessionOptions()
        o.intra_op_num_threads = t
        sess[k, t] = ort.InferenceSession(
            helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString(),
            o,
            providers=["CPUExecutionProvider"],
        )
res = {k: [] for k in sess}
for r in range(5):
    for k, s in sess.items():
        for _ in range(50):
            s.run(None, {"X": x})
        t0 = time.perf_counter()
        for _ in range(1000):
            s.run(None, {"X": x})
        res[k].append((time.perf_counter() - t0) / 1000 * 1e6)
for k, v in res.items():
    print(k, round(statistics.median(v), 1), "us (min", round(min(v), 1), ")")
