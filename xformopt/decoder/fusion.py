"""What ONNX Runtime's GPT-2 optimizer must fuse in a decoder, and how fuse times decoder candidates.

Measured with onnxruntime 1.32, onnxscript 0.7.2 and transformers 5.23 (tiny configs, 2 layers):

- GPT-2 exported by :func:`xformopt.passes.export.decoder.export_gpt2`: every layer fuses into one
  ``Attention`` (with past/present), plus ``EmbedLayerNormalization``, ``SkipLayerNormalization`` x 2
  per layer and ``FastGelu``: the whole block is ~8 ops per layer.
- Decoders exported with GroupQueryAttention by the dynamo path (:mod:`xformopt.passes.export.decoder_gqa`,
  Ministral 3, Gemma 4 text, the generic row): attention is GroupQueryAttention from the export on, and
  onnxscript's fusions add ``SkipSimplifiedLayerNormalization`` x 2 per layer (Llama-like RMSNorms).
- Llama-like decoders exported by the plain dynamo path (:mod:`xformopt.passes.export.decoder_dynamo`): onnxscript's fusions turn
  each layer's attention into ``MultiHeadAttention`` (through its SDPA rule) and its RMSNorms into
  ``SkipSimplifiedLayerNormalization`` x 2; its ``GroupQueryAttention`` rule does not fire (it wants the
  causal-mask graph of older transformers), nor does its rotary cos/sin-cache rule. A family whose
  attention does not fuse (Ministral 3's position-dependent query scale, on this path) is logged loudly, and asking for
  it with ``expect: {MultiHeadAttention: N}`` fails the pass.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from xformopt.measure.latency import run_interleaved
from xformopt.models import load_tokenizer
from xformopt.runtime.decoder import OrtDecoder
from xformopt.scoring.metrics import row_cosine

_log = logging.getLogger(__name__)

ATTENTION_OPS = ("Attention", "MultiHeadAttention", "GroupQueryAttention")

ATTENTION_NOT_FUSED = (
    "the attention was exported by torch's dynamo exporter and onnxscript's SDPA/GroupQueryAttention rules did not "
    "match it; attention runs as unfused MatMul/Softmax ops (builder families fuse GroupQueryAttention with "
    "pip install 'xformopt[genai]')"
)

TIMING_PROMPT_TOKENS = 32


def attention_layers(spec) -> int:
    """Layers with softmax attention: all but a hybrid's linear-attention layers (Qwen3.5)."""
    try:
        types = json.loads((Path(spec.path) / "config.json").read_text(encoding="utf-8")).get("layer_types") or []
    except (OSError, ValueError, AttributeError):
        types = []
    return sum(t != "linear_attention" for t in types) or spec.num_layers


def attention_record(spec, counts: dict[str, int]) -> dict:
    """Whether attention fused; a family whose attention cannot fuse is logged loudly, never silent."""
    fused = sum(counts.get(op, 0) for op in ATTENTION_OPS)
    layers = attention_layers(spec)
    record = {"attention_fused": fused >= layers, "attention_nodes": fused, "layers": spec.num_layers,
              "attention_layers": layers}
    if fused < layers:
        why = ATTENTION_NOT_FUSED if spec.model_type != "gpt2" else "the attention pattern was not recognized"
        record["attention_note"] = f"{fused} of {layers} attention layers fused: {why}"
        _log.warning(f"{record['attention_note']}")
    return record


def time_decoder_dirs(ctx, dirs: dict[str, Path], rounds: int) -> dict[str, dict]:
    """Median time of one cached decode step (batch 1, one token after a real 32-token prompt),
    the candidates interleaved; the same dict shape as :func:`xformopt.passes.timing.time_stage_dirs`."""
    import numpy as np

    tokenizer = load_tokenizer(next(iter(dirs.values())), ctx.spec.trust_remote_code)
    ids = [t for text in ctx.sample_texts for t in tokenizer(text)["input_ids"]][:TIMING_PROMPT_TOKENS]
    prompt = np.asarray(ids or [0], dtype=np.int64)[None]
    runners = {name: OrtDecoder(d, threads=ctx.threads) for name, d in dirs.items()}
    states = {name: r.forward(prompt)[1] for name, r in runners.items()}
    token = prompt[:, -1:]
    calls = {name: (lambda i, r=r, s=states[name]: r.forward(token, s)) for name, r in runners.items()}
    stats = run_interleaved(calls, 1, warmup=5, iterations=rounds)
    return {name: s.to_dict() for name, s in stats.items()}


def logits_agreement(ctx, float_dir: Path, int8_dir: Path, texts: int = 16, max_tokens: int = 64) -> dict:
    """Quantize's sanity check for decoders: cosine of the INT8 graph's logits to the float graph's at
    every position of real texts (prompt step, no cache), and how often their argmax agrees."""
    import numpy as np

    tokenizer = load_tokenizer(float_dir, ctx.spec.trust_remote_code)
    ref_runner, got_runner = OrtDecoder(float_dir, threads=ctx.threads), OrtDecoder(int8_dir, threads=ctx.threads)
    cosines, agree, total = [], 0, 0
    for text in list(ctx.sample_texts)[:texts]:
        ids = list(tokenizer(text)["input_ids"])[:max_tokens]
        if not ids:
            continue
        batch = np.asarray(ids, dtype=np.int64)[None]
        ref, got = ref_runner.forward(batch)[0][0], got_runner.forward(batch)[0][0]
        cosines.append(row_cosine(ref, got))
        agree += int((ref.argmax(-1) == got.argmax(-1)).sum())
        total += len(ids)
    cos = np.concatenate(cosines)
    return {"measure": "cosine", "mean_agreement": float(cos.mean()), "min_agreement": float(cos.min()), "texts": len(cosines),
            "positions": total, "top1_agreement": agree / total, "measured_on": "logits at every position"}
