"""The reference dynamic-INT8 artifact the benchmarks and the search compare with: what optimum's
``ORTQuantizer`` with ``AutoQuantizationConfig.<target>(is_static=False, per_channel=False)`` wrote,
built with ONNX Runtime's own ``quantize_dynamic`` and the same settings (weights symmetric, activations
asymmetric uint8, full range, every op of ORT's IntegerOps registry), on xformopt's unfused fp32 export.

Why not optimum itself: optimum-onnx pins transformers below 5 and cannot be installed beside it. Its
quantizer is a thin layer over this same ORT call (``ONNXQuantizer`` with ``IntegerOps``), so the
arithmetic, and so the figures, stay comparable with those taken with optimum. Written as a stage
folder (model.onnx + tokenizer + config) that xformopt's OrtPredictor loads.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from xformopt.models import load_torch_model
from xformopt.passes.export.dynamo import export_encoder

NAME = "dynamic INT8, optimum's settings (ONNX Runtime quantize_dynamic)"

# optimum's AutoQuantizationConfig weight type per target (avx2 is u8/u8; the others u8/s8); it has no
# avx_vnni configuration, and its avx2 one is what optimum users take there.
_WEIGHT_TYPE = {"avx2": "QUInt8", "avx_vnni": "QUInt8", "avx512": "QInt8", "avx512_vnni": "QInt8", "arm64": "QInt8"}


def optimum_dynamic_int8(model: Path, out: Path, spec, target: str) -> Path:
    """Build (or reuse) the reference dynamic-INT8 artifact of ``model`` (the checkpoint folder of
    ``spec``, an xformopt ModelSpec) at ``out``; ``target`` is an xformopt target name."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.registry import IntegerOpsRegistry
    from transformers import AutoTokenizer

    if (out / "model.onnx").is_file():
        return out
    staging = out.with_name(out.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    exported = staging / "fp32"
    exported.mkdir(parents=True)
    torch_model = load_torch_model(spec, model)
    export_encoder(torch_model, spec.task_def, exported / "model.onnx", opset=18)  # unfused, as optimum's was
    torch_model.config.save_pretrained(exported)
    del torch_model
    quantize_dynamic(
        exported / "model.onnx", staging / "model.onnx", op_types_to_quantize=list(IntegerOpsRegistry),
        per_channel=False, reduce_range=False, weight_type=getattr(QuantType, _WEIGHT_TYPE[target]),
        extra_options={"WeightSymmetric": True, "ActivationSymmetric": False, "EnableSubgraph": False,
                       "ForceSymmetric": False},
    )
    shutil.copy2(exported / "config.json", staging / "config.json")
    shutil.rmtree(exported)
    AutoTokenizer.from_pretrained(str(model)).save_pretrained(str(staging))  # both artifacts tokenize alike
    staging.rename(out)
    return out
