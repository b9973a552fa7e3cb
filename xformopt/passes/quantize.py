"""quantize: INT8 with ONNX Runtime's quantizer, formats chosen by the target profile.

This issue ships dynamic quantization (weights INT8 offline, activations quantized per batch at
run time); static calibration and the accuracy budget build on the same pass. The pass counts
what really runs in INT8 and names every weighted MatMul/Gemm left in float, and fails when it
quantized nothing: a silent no-op is the failure users complain about most.
"""

from __future__ import annotations

import logging
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from xformopt.errors import PassFailed
from xformopt.onnx_graph import INT8_GEMM_OPS, load_graph, needs_external_data, op_counts, weighted_gemms
from xformopt.passes.base import Pass, PassContext, PassOptions


@contextmanager
def _root_log_level(level: int):
    root = logging.getLogger()
    previous = root.level
    root.setLevel(level)
    try:
        yield
    finally:
        root.setLevel(previous)


class QuantizeOptions(PassOptions):
    mode: Literal["dynamic"] = Field("dynamic", description="dynamic INT8 (static arrives with calibration)")
    per_channel: bool | None = Field(None, description="per-channel weight scales; default: the target's")
    reduce_range: bool | None = Field(None, description="7-bit weights; default: the target's")
    op_types: list[str] | None = Field(None, description="op types to quantize; default: the target's")
    exclude_nodes: list[str] = Field(default_factory=list, description="node names kept in float")
    min_agreement: float = Field(0.9, ge=0, le=1, description="sanity floor: output cosine vs. the float graph")


def resolved_formats(ctx: PassContext, options: QuantizeOptions) -> dict:
    q = ctx.target.quant
    return {
        "weight_type": q.weight_type,
        "activation_type": "uint8",  # dynamic quantization always quantizes activations to uint8
        "per_channel": q.per_channel if options.per_channel is None else options.per_channel,
        "reduce_range": q.reduce_range if options.reduce_range is None else options.reduce_range,
        "op_types": list(options.op_types or q.op_types),
        "format": "QOperator",
    }


def int8_coverage(before, after) -> dict:
    """How many weighted GEMMs run in INT8 now, and which stayed in float.

    Counted, not matched by name: ORT's quantizer rewrites a Gemm as ``<name>_MatMul`` + Add even
    when it leaves it in float, so a name lookup would count that Gemm as quantized.
    """
    weighted = [g for g in weighted_gemms(before) if g["has_weight"]]
    still_float = [g for g in weighted_gemms(after) if g["has_weight"]]
    activation_only = [g["name"] for g in weighted_gemms(before) if not g["has_weight"]]
    counts = op_counts(after)
    original = {g["name"]: g["op"] for g in weighted}

    def source(g: dict) -> dict:  # report a float Gemm under its original name and op
        name = g["name"].removesuffix("_MatMul")
        return {"name": name, "op": original[name]} if name in original else {"name": g["name"], "op": g["op"]}

    return {
        "weighted_gemms": len(weighted),
        "int8": len(weighted) - len(still_float),
        "kept_float": [source(g) for g in still_float],
        "activation_matmuls_float": len(activation_only),  # e.g. Q.K^T in unfused attention: no weight
        "int8_ops": {op: counts[op] for op in INT8_GEMM_OPS if counts.get(op)},
    }


def output_agreement(ctx: PassContext, float_dir: Path, int8_dir: Path) -> dict:
    """Cosine of INT8 outputs to float outputs on real texts: catches saturation and broken scales."""
    from xformopt.predictors import OrtPredictor

    texts = list(ctx.sample_texts[:32])
    ref = OrtPredictor(ctx.spec, float_dir, threads=ctx.threads).predict(texts)
    got = OrtPredictor(ctx.spec, int8_dir, threads=ctx.threads).predict(texts)
    cos = (ref * got).sum(1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1) + 1e-12)
    return {"mean_cosine": float(cos.mean()), "min_cosine": float(cos.min()), "texts": len(texts)}


class QuantizePass(Pass):
    name = "quantize"
    stage = "onnx"
    consumes = "onnx"
    produces = "onnx"
    Options = QuantizeOptions
    must_not_follow = {"quantize": "the graph is already quantized"}
    summary = "INT8 quantization (dynamic), formats from the target; counts INT8 and float GEMMs"

    def run(self, ctx: PassContext, src: Path, dst: Path, options: QuantizeOptions) -> dict:
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic

        formats = resolved_formats(ctx, options)
        for item in src.iterdir():
            if not item.name.startswith("model.onnx") and not item.name.startswith("."):
                (shutil.copytree if item.is_dir() else shutil.copy2)(item, dst / item.name)
        ctx.log(
            f"quantizing dynamic INT8 (weights {formats['weight_type']}, per-channel {formats['per_channel']}, "
            f"reduce-range {formats['reduce_range']})"
        )
        # ORT logs a hint to run quant_pre_process first; that step (symbolic shape inference) is for
        # static calibration and chokes on fused contrib ops, so the hint is silenced here.
        with _root_log_level(logging.ERROR):
            quantize_dynamic(
                src / "model.onnx",
                dst / "model.onnx",
                op_types_to_quantize=formats["op_types"],
                per_channel=formats["per_channel"],
                reduce_range=formats["reduce_range"],
                weight_type=QuantType.QInt8 if formats["weight_type"] == "int8" else QuantType.QUInt8,
                # The quantizer renames a Gemm to "<name>_MatMul" before it applies exclusions.
                nodes_to_exclude=[n for name in options.exclude_nodes for n in (name, f"{name}_MatMul")],
                use_external_data_format=needs_external_data(src / "model.onnx"),
                # ONNX shape inference cannot type the outputs of fused contrib ops (Attention,
                # SkipLayerNormalization); they are float32, which is what this tells the quantizer.
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )
        coverage = int8_coverage(load_graph(src / "model.onnx"), load_graph(dst / "model.onnx"))
        if coverage["int8"] == 0:
            raise PassFailed(
                f"quantize changed nothing: none of {coverage['weighted_gemms']} weighted MatMul/Gemm nodes "
                f"became INT8 (op types {formats['op_types']})"
            )
        agreement = output_agreement(ctx, src, dst)
        if agreement["mean_cosine"] < options.min_agreement:
            raise PassFailed(
                f"INT8 outputs disagree with float: mean cosine {agreement['mean_cosine']:.3f} "
                f"< {options.min_agreement} (saturation? try a target with reduce_range)"
            )
        return {"mode": options.mode, "formats": formats, "coverage": coverage, "agreement": agreement}
