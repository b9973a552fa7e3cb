"""An int8 KV cache for GroupQueryAttention graphs: a quarter of the float32 cache's bytes per cached
position, read on every decode step.

ONNX Runtime's GroupQueryAttention (1.32, CPU) stores K and V as int8 when its cache inputs are int8
and it is given ``kv_cache_bit_width=8`` with per-channel scales (``k_scale``/``v_scale``, one per
``kv_heads * head_dim`` channel): it quantizes the new positions as it writes them and dequantizes
inside its own attention loop. The scales are what this module chooses: the largest magnitude each
channel takes over calibration text (K after the rotary embedding, as the op caches it), read from
the float graph's own present outputs, divided by 127. A value beyond it saturates.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

GQA = "GroupQueryAttention"
K_SCALE, V_SCALE = 12, 13  # GroupQueryAttention's k_scale / v_scale input slots
MIN_SCALE = 1e-6  # a channel that stayed 0 in calibration still gets a usable step


def gqa_nodes(model) -> list:
    return [n for n in model.graph.node if n.op_type == GQA and n.domain == "com.microsoft"]


def calibrate(model_dir: Path, token_lists: list[list[int]], threads: int | None, max_tokens: int = 128) -> dict:
    """{present output name: per-channel scale [kv_heads * head_dim] float32} from the float graph at
    ``model_dir`` run over ``token_lists`` (each a prompt step from an empty cache)."""
    from xformopt.runtime.decoder import OrtDecoder

    runner = OrtDecoder(model_dir, threads=threads)
    present_of = dict(zip(runner.layout.past_names, runner.layout.present_names))
    peaks: dict[str, np.ndarray] = {}
    for ids in token_lists:
        _, state = runner.forward(np.asarray([ids[:max_tokens]]))
        for past, value in runner.cache_arrays(state).items():  # [batch, kv_heads, positions, head_dim]
            peak = np.abs(value).max(axis=(0, 2)).reshape(-1)
            peaks[present_of[past]] = np.maximum(peaks.get(present_of[past], peak), peak)
    return {name: np.maximum(peak / 127.0, MIN_SCALE).astype(np.float32) for name, peak in peaks.items()}


def to_int8(model, scales: dict[str, np.ndarray]) -> int:
    """Every GroupQueryAttention of ``model`` keeps an int8 cache with ``scales`` (keyed by its present
    outputs); the graph's past inputs and present outputs become int8. In place; returns the count."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = gqa_nodes(model)
    cache_names = set()
    for node in nodes:
        present_k, present_v = node.output[1], node.output[2]
        missing = [n for n in (present_k, present_v) if n not in scales]
        if missing:
            raise ValueError(f"no calibrated scale for {missing} (GroupQueryAttention {node.name})")
        inputs = list(node.input) + [""] * max(0, V_SCALE + 1 - len(node.input))
        for slot, present in ((K_SCALE, present_k), (V_SCALE, present_v)):
            name = f"{present}.int8_scale"
            model.graph.initializer.append(numpy_helper.from_array(scales[present], name))
            inputs[slot] = name
        del node.input[:]
        node.input.extend(inputs)
        kept = [a for a in node.attribute if a.name not in ("k_quant_type", "v_quant_type", "kv_cache_bit_width")]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute("k_quant_type", "PER_CHANNEL"),
                               helper.make_attribute("v_quant_type", "PER_CHANNEL"),
                               helper.make_attribute("kv_cache_bit_width", 8)])
        cache_names.update({node.input[3], node.input[4], present_k, present_v})
    for value in (*model.graph.input, *model.graph.output, *model.graph.value_info):
        if value.name in cache_names:
            value.type.tensor_type.elem_type = TensorProto.INT8
    return len(nodes)
