"""The INT8 graph builders every quantize route shares (one encoder graph, the two seq2seq graphs, the
benchmarks): ONNX Runtime's ``quantize_dynamic`` / ``quantize_static`` with a target's formats.

A builder is ``build(out_dir, exclude)``: it writes ``out_dir/<graph>`` (``graph``: the file name,
``model.onnx`` for encoders, ``encoder.onnx``/``decoder.onnx`` for seq2seq) with the nodes named in
``exclude`` kept in float, so the format ladder and the accuracy budget can build many candidates from
one calibration.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path

from xformopt.onnx_graph import load_graph, needs_external_data, op_counts
from xformopt.passes.quantize import transposed_weights
from xformopt.passes.quantize.calibration import METHODS

MODEL_FILE = "model.onnx"


@contextmanager
def root_log_level(level: int):
    root = logging.getLogger()
    previous = root.level
    root.setLevel(level)
    try:
        yield
    finally:
        root.setLevel(previous)


def weight_type(formats: dict):
    from onnxruntime.quantization import QuantType

    return QuantType.QInt8 if formats["weight_type"] == "int8" else QuantType.QUInt8


def excluded(names: list[str]) -> list[str]:
    # The quantizer renames a Gemm to "<name>_MatMul" before it applies exclusions.
    return [n for name in names for n in (name, f"{name}_MatMul")]


def biased_attention(model_path: Path) -> list[str]:
    """Fused ``Attention`` nodes that take an ``attention_bias`` (input 5): ORT's quantizer would turn them
    into ``QAttention``, which has no such input, and the bias (a padding mask, a position bias) would be
    lost without a word. They stay float; their Q/K/V projection is one packed GEMM."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    return [n.name for n in graph.node if n.op_type == "Attention" and len(n.input) > 5 and n.input[5]]


def quantize_dynamic_graph(model_in: Path, model_out: Path, formats: dict, op_types: list[str],
                           exclude: list[str]) -> None:
    """Dynamic INT8 of one graph file: weights offline, activations per batch at run time."""
    import onnx
    from onnxruntime.quantization import quantize_dynamic

    exclude = [*exclude, *(name for name in biased_attention(model_in) if name not in exclude)]

    # ORT logs a hint to run quant_pre_process first; that step is for static calibration (the static
    # path runs its symbolic shape inference itself), so the hint is silenced here.
    with root_log_level(logging.ERROR):
        quantize_dynamic(
            model_in,
            model_out,
            op_types_to_quantize=op_types,
            per_channel=formats["per_channel"],
            reduce_range=formats["reduce_range"],
            weight_type=weight_type(formats),
            nodes_to_exclude=excluded(exclude),
            use_external_data_format=needs_external_data(model_in),
            # ONNX shape inference cannot type the outputs of fused contrib ops (Attention,
            # SkipLayerNormalization); they are float32, which is what this tells the quantizer.
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )


def dynamic_builder(src: Path, formats: dict, graph: str = MODEL_FILE, untie_weights: bool = False):
    """Builds dynamic INT8 of ``src/graph`` (``src``: the stage folder); ``untie_weights``: weights read
    transposed (a tied LM head) get their own copy first, so they go INT8 too (transposed_weights.py)."""
    def build(out_dir: Path, exclude: list[str]) -> None:
        out_dir.mkdir(exist_ok=True)
        source = src / graph
        if untie_weights:
            untied = out_dir / f".untied-{graph}"
            if transposed_weights.untie(source, untied):
                source = untied
        try:
            quantize_dynamic_graph(source, out_dir / graph, formats, formats["op_types"], exclude)
        finally:
            for leftover in out_dir.glob(f".untied-{graph}*"):
                leftover.unlink()

    return build


def static_builder(prepared: Path, cache: Path, method: str, formats: dict, graph: str = MODEL_FILE):
    """Builds static INT8 of the typed graph ``prepared`` with the ranges in the calibration ``cache``
    (``method``: minmax, entropy or percentile), written as ``out_dir/graph``."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    static_ops = [op for op in formats["op_types"] if op != "Attention"]

    def build(out_dir: Path, exclude: list[str]) -> None:
        out_dir.mkdir(exist_ok=True)
        target = out_dir / graph
        with root_log_level(logging.ERROR):
            quantize_static(
                prepared,
                target,
                None,  # ranges come from the calibration cache: calibrated once, reused by every candidate
                quant_format=getattr(QuantFormat, formats["format"]),
                op_types_to_quantize=static_ops,
                per_channel=formats["per_channel"],
                reduce_range=formats["reduce_range"],
                activation_type=QuantType.QInt8 if formats["activation_type"] == "int8" else QuantType.QUInt8,
                weight_type=weight_type(formats),
                nodes_to_exclude=excluded(exclude),
                calibrate_method=getattr(CalibrationMethod, METHODS[method]),
                use_external_data_format=needs_external_data(prepared),
                calibration_cache_path=cache,
                extra_options={
                    "ActivationSymmetric": formats["activation_symmetric"],
                    "WeightSymmetric": True,
                    "DefaultTensorType": onnx.TensorProto.FLOAT,
                },
            )
        if "Attention" in formats["op_types"] and op_counts(load_graph(target)).get("Attention"):
            # No static kernel for the fused Attention op: its QKV projection goes dynamic (QAttention).
            quantize_dynamic_graph(target, target, formats, ["Attention"], exclude)

    return build
