"""Ask ONNX Runtime's INT8 GEMM what it really does on this host, instead of trusting CPU flags.

ORT picks its u8*s8 kernel from CPUID. Without VNNI (AVX2, AVX-512 BW) the kernel multiplies
pairs with VPMADDUBSW, whose 16-bit sums saturate at 32767; with VNNI it accumulates in 32 bits.
The flags in /proc/cpuinfo can disagree with what a process sees (hypervisors that mask CPUID,
emulators such as qemu-user with ``-cpu Haswell``), so the quantize formats follow a one-node probe:
255 x 127 summed over 64 pairs is exact only when nothing saturates. It runs once per process
(a few milliseconds).
"""

from __future__ import annotations

from functools import lru_cache

from xformopt.measure.forced_host import forced_int8_saturates

_K = 64


def int8_gemm_saturates() -> bool | None:
    """True when ORT's MatMulInteger (u8 activations x s8 weights) saturates here; None if unknown.

    Forced host facts (``XFORMOPT_CPU_FLAGS`` / ``XFORMOPT_INT8_SATURATES``, see forced_host.py) answer
    instead of the probe, so a stated host is never half real."""
    forced = forced_int8_saturates()
    return _probe() if forced == "probe" else forced


@lru_cache(maxsize=1)
def _probe() -> bool | None:
    try:
        import numpy as np
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:  # pragma: no cover - both are core dependencies
        return None
    weights = numpy_helper.from_array(np.full((_K, 8), 127, np.int8), "B")
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["A", "B"], ["Y"])], "int8-probe",
        [helper.make_tensor_value_info("A", TensorProto.UINT8, [1, _K])],
        [helper.make_tensor_value_info("Y", TensorProto.INT32, [1, 8])], [weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    try:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        got = session.run(None, {"A": np.full((1, _K), 255, np.uint8)})[0]
    except Exception:  # an ORT build without the op: say unknown rather than guess
        return None
    return bool((got != 255 * 127 * _K).any())
