"""optimum's own dynamic-INT8 artifact of a model, the reference the benchmarks compare with: the task's
ORTModel export, then ``ORTQuantizer`` with ``AutoQuantizationConfig`` for the host's target,
``is_static=False, per_channel=False`` (optimum's documented dynamic recipe). Written as a stage folder
(model.onnx + tokenizer) that xformopt's OrtPredictor loads.
"""

from __future__ import annotations

import shutil
from pathlib import Path


def optimum_dynamic_int8(model: Path, out: Path, task, target: str) -> Path:
    """Build (or reuse) optimum's dynamic-INT8 artifact of ``model`` at ``out``; ``task`` is the
    xformopt Task (it names the ORTModel class), ``target`` an xformopt target name (optimum has no
    avx_vnni configuration: its avx2 one is used there)."""
    import optimum.onnxruntime as ort_optimum
    from optimum.onnxruntime import ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig
    from transformers import AutoTokenizer

    if (out / "model.onnx").is_file():
        return out
    staging = out.with_name(out.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    exported = staging / "fp32"
    getattr(ort_optimum, task.ort_model).from_pretrained(str(model), export=True).save_pretrained(str(exported))
    recipe = {"avx2": AutoQuantizationConfig.avx2, "avx_vnni": AutoQuantizationConfig.avx2,
              "avx512": AutoQuantizationConfig.avx512, "avx512_vnni": AutoQuantizationConfig.avx512_vnni,
              "arm64": AutoQuantizationConfig.arm64}[target]
    quantized = staging / "int8"
    ORTQuantizer.from_pretrained(str(exported)).quantize(save_dir=str(quantized),
                                                          quantization_config=recipe(is_static=False, per_channel=False))
    (quantized / "model_quantized.onnx").rename(quantized / "model.onnx")
    for item in exported.iterdir():  # config next to the graph, as optimum saves it
        if item.is_file() and not item.name.startswith("model") and not (quantized / item.name).exists():
            shutil.copy2(item, quantized / item.name)
    AutoTokenizer.from_pretrained(str(model)).save_pretrained(str(quantized))  # both artifacts tokenize alike
    quantized.rename(out)
    shutil.rmtree(staging, ignore_errors=True)
    return out
