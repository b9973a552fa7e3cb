import collections
import json
import sys

import numpy as np
import onnxruntime as ort

sys.path.insert(0, "/work/wt-decode/benchmarks")
import float_zero_points as f

q, d, m = f.weights()
x = np.random.default_rng(1).standard_normal((1, 1, f.K)).astype(np.float32)
for variant in ("exact carry", "symmetric"):
    for t in (1, 2):
        o = ort.SessionOptions()
        o.intra_op_num_threads = t
        o.enable_profiling = True
        o.profile_file_prefix = "/tmp/pe"
        s = ort.InferenceSession(
            f.graph(variant, q, d, m, 4).SerializeToString(), o, providers=["CPUExecutionProvider"]
        )
        for _ in range(300):
            s.run(None, {"X": x})
        ev = json.load(open(s.end_profiling()))
        by = collections.defaultdict(list)
        for e in ev:
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                by[e["args"]["op_name"]].append(e["dur"])
        runs = [e["dur"] for e in ev if e.get("name") == "model_run"]
        print(
            variant, t, "model_run median", np.median(runs[50:]), {k: float(np.median(v[50:])) for k, v in by.items()}
        )
