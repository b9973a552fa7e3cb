"""Which 4-bit MatMuls hurt a decoder most, for the int4 perplexity budget (passes/int4/run.py): each
MatMul's relative output error under simulated 4-bit weights, on the real activations that reach it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from xformopt.decoder.traffic import role_of
from xformopt.runtime.decoder import OrtDecoder

HARM_TEXTS = 8  # texts whose activations the ranking reads (one graph call each)


def _simulate(w: np.ndarray, bits: int, block: int, symmetric: bool) -> np.ndarray:
    """Round-to-nearest blockwise along the input axis (what MatMulNBits stores), dequantized."""
    k, n = w.shape
    pad = (-k) % block
    blocks = np.pad(w, ((0, pad), (0, 0))).reshape(-1, block, n)
    top = 2 ** (bits - 1)
    if symmetric:
        scale = np.abs(blocks).max(axis=1, keepdims=True) / top
        scale[scale == 0] = 1.0
        q = np.clip(np.round(blocks / scale), -top, top - 1) * scale
    else:
        lo, hi = blocks.min(axis=1, keepdims=True), blocks.max(axis=1, keepdims=True)
        scale = (hi - lo) / (2 ** bits - 1)
        scale[scale == 0] = 1.0
        q = np.clip(np.round((blocks - lo) / scale), 0, 2 ** bits - 1) * scale + lo
    return q.reshape(-1, n)[:k]


def harm_scores(src_model: Path, names: list[str], lists: list[list[int]], options, work: Path) -> dict[str, float]:
    """Per MatMul: ||X (W - Q4(W))||^2 / ||X W||^2 on the real activations X that reach it (the float
    graph run once per text with the MatMul inputs exposed as outputs)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(src_model)
    nodes = {n.name: n for n in model.graph.node}
    inits = {i.name: i for i in model.graph.initializer}
    probe = {name: nodes[name].input[0] for name in names}
    existing = {o.name for o in model.graph.output}
    for tensor in dict.fromkeys(probe.values()):
        if tensor not in existing:
            model.graph.output.append(onnx.helper.make_tensor_value_info(tensor, onnx.TensorProto.FLOAT, None))
    probe_dir = work / "harm-probe"
    probe_dir.mkdir(parents=True)
    onnx.save(model, probe_dir / "model.onnx", save_as_external_data=True, location="model.onnx.data", size_threshold=1024)
    runner = OrtDecoder(probe_dir, io_binding=False)
    runner.output_names = [*runner.output_names, *dict.fromkeys(probe.values())]
    feeds: dict[str, list[np.ndarray]] = {t: [] for t in probe.values()}
    limit = runner.step_limit
    takes = {i.name for i in runner.session.get_inputs()}
    for ids in lists[:HARM_TEXTS]:
        batch = np.asarray([ids[:limit]], dtype=np.int64)  # one graph call (Qwen3.5: 64 tokens)
        feed = {"input_ids": batch, "attention_mask": np.ones_like(batch), **runner.layout.empty_past(1),
                # the positions of the tokens fed, not of the whole text; dropped below unless the graph takes them
                "position_ids": np.arange(batch.shape[1], dtype=np.int64)[None]}
        outputs = runner.session.run(runner.output_names, {k: v for k, v in feed.items() if k in takes})
        named = dict(zip(runner.output_names, outputs))
        for tensor in feeds:
            feeds[tensor].append(named[tensor].reshape(-1, named[tensor].shape[-1]))
    scores = {}
    for name in names:
        x = np.concatenate(feeds[probe[name]]).astype(np.float32)
        w = numpy_helper.to_array(inits[nodes[name].input[1]], base_dir=str(src_model.parent)).astype(np.float32)
        reference = x @ w
        error = x @ (w - _simulate(w, 4, options.block_for(role_of(name)), options.symmetric))
        scores[name] = float((error ** 2).sum() / max((reference ** 2).sum(), 1e-30))
    shutil.rmtree(probe_dir)
    return scores
