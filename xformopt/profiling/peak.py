"""This host's GEMM peak in ONNX Runtime: a short fp32 and int8 matrix-multiply microbenchmark,
cached per host.

The peak is what the achieved GEMM throughput of a profile is compared with, so it is measured the
way the models run: one ORT MatMul (fp32) or MatMulInteger (u8 activations x s8 weights, the
dynamic-INT8 kernel), weights as initializers (prepacked), at the profile's thread count. It is
stored under the xformopt cache dir as ``gemm-peak/<host fingerprint>-t<threads>.json``, written
atomically and under a lock (two runs never benchmark at once), with a sha256 of its own content:
an edited or damaged file, or one from another host, is measured again, never served.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from datetime import datetime, timezone
from pathlib import Path

from xformopt.atomic import write_json
from xformopt.cache_stores import store
from xformopt.locks import Lock
from xformopt.measure import host

_log = logging.getLogger(__name__)

SCHEMA = "xformopt.gemm-peak/1"
# Big enough that the kernel, not call overhead, sets the pace; small enough to run in ~0.5 s.
SHAPE = {"m": 512, "k": 1024, "n": 1024}
MIN_CALLS = 5
BUDGET_S = 0.15


def peak_dir() -> Path:
    return store("gemm-peak")


def _digest(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _gemm_model(kind: str):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    m, k, n = SHAPE["m"], SHAPE["k"], SHAPE["n"]
    rng = np.random.default_rng(0)
    if kind == "fp32":
        weight = numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32), "B")
        node, a_type, y_type = "MatMul", TensorProto.FLOAT, TensorProto.FLOAT
    else:
        weight = numpy_helper.from_array(rng.integers(-127, 128, (k, n), dtype=np.int8), "B")
        node, a_type, y_type = "MatMulInteger", TensorProto.UINT8, TensorProto.INT32
    graph = helper.make_graph([helper.make_node(node, ["A", "B"], ["Y"])], f"gemm-peak-{kind}",
                              [helper.make_tensor_value_info("A", a_type, [m, k])],
                              [helper.make_tensor_value_info("Y", y_type, [m, n])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString(), (rng.standard_normal((m, k), dtype=np.float32) if kind == "fp32"
                                       else rng.integers(0, 256, (m, k), dtype=np.uint8))


def measure_gflops(kind: str, threads: int) -> float:
    """Best GFLOP/s of one ``kind`` ('fp32' or 'int8') GEMM over a short run."""
    import onnxruntime as ort

    data, a = _gemm_model(kind)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    feed = {"A": a}
    session.run(None, feed)  # warm-up: allocations, prepacked weights
    flops = 2.0 * SHAPE["m"] * SHAPE["k"] * SHAPE["n"]
    best, calls, start = float("inf"), 0, time.perf_counter()
    while calls < MIN_CALLS or time.perf_counter() - start < BUDGET_S:
        t0 = time.perf_counter()
        session.run(None, feed)
        best = min(best, time.perf_counter() - t0)
        calls += 1
    return flops / best / 1e9


def _read(path: Path, fingerprint: str, threads: int) -> dict | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("payload"), dict):
        return None
    payload = doc["payload"]
    if doc.get("sha256") != _digest(payload):
        return None
    if payload.get("host_fingerprint") != fingerprint or payload.get("threads") != threads or payload.get("shape") != SHAPE:
        return None
    return payload


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def gemm_peak(threads: int, *, remeasure: bool = False) -> dict:
    """{fp32_gflops, int8_gflops, threads, shape, host_fingerprint, host, load_average, measured,
    cached}: from the cache when a verified entry for this host and thread count exists (unless
    ``remeasure``: a peak taken on a busy machine is low), else measured and stored (the higher of
    the new and the stored figure)."""
    info = host.host_info()
    fingerprint = host.host_fingerprint(info)
    path = peak_dir() / f"{fingerprint}-t{threads}.json"
    if not remeasure and (payload := _read(path, fingerprint, threads)) is not None:
        return {**payload, "cached": True}
    with Lock(path.with_name(path.name + ".lock"), unlink=False):
        if not remeasure and (payload := _read(path, fingerprint, threads)) is not None:  # measured meanwhile
            return {**payload, "cached": True}
        if path.exists() and not remeasure:
            _log.info(f"GEMM peak cache {path} is damaged or from another host; measuring again")
        _log.info(f"measuring this host's GEMM peak (fp32 and int8, {threads} threads)")
        # A peak is the best ever seen here: a measurement on a busy host can only lower it, so an
        # earlier verified one is kept where it was higher.
        earlier = _read(path, fingerprint, threads) or {}
        payload = {
            "fp32_gflops": round(max(measure_gflops("fp32", threads), earlier.get("fp32_gflops", 0.0)), 2),
            "int8_gflops": round(max(measure_gflops("int8", threads), earlier.get("int8_gflops", 0.0)), 2),
            "threads": threads,
            "shape": dict(SHAPE),
            "host_fingerprint": fingerprint,
            "host": {k: info.get(k) for k in ("cpu_model", "machine", "cpu_flags", "cores_usable")},
            "load_average": _load_average(),  # 1-minute load when measured: a busy host gives a low peak
            "measured": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        write_json(path, {"schema": SCHEMA, "payload": payload, "sha256": _digest(payload)})
    return {**payload, "cached": False}
