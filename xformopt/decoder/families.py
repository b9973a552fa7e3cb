"""Decoder families: one row of facts per Hugging Face ``model_type`` (data, not if-chains).

``exporter`` names how the family is exported with its KV cache (:mod:`xformopt.decoder.export`):

- ``gpt2``: xformopt's own TorchScript export in ONNX Runtime's GPT-2 layout, then ORT's GPT-2
  ``Attention`` fusion in ``fuse``;
- ``genai``: onnxruntime-genai's model builder used as a library (optional extra ``genai``). It writes
  every layer's attention and rotary embedding as one ``GroupQueryAttention`` (shared KV heads, the
  cache in the split ``past_key_values.{i}.key/value`` layout) plus fused RMSNorms, the graph
  ``quantize --mode int4`` turns into ``MatMulNBits``. Without the extra these families fall back
  to optimum's exporter, where attention stays unfused (ORT 1.32's rotary-attention fusion does
  not match transformers 4.57's graph) and the fuse record says so.

``fused_per_layer``: fused ops every layer must have after export (genai) or fuse (gpt2, optimum);
``fallback_per_layer``: what optimum's export reaches after ``fuse`` when the builder is absent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GENAI_EXTRA = "onnxruntime-genai"  # the pip name; xformopt's extra is `pip install 'xformopt[genai]'`


@dataclass(frozen=True)
class DecoderFamily:
    exporter: str  # "gpt2" | "genai"
    ort_model_type: str  # ORT transformer-optimizer model type used by `fuse`
    fused_per_layer: dict[str, int]
    fallback_per_layer: dict[str, int] = field(default_factory=dict)
    grouped_query: bool = False  # the family's config may share KV heads (num_key_value_heads)


_ROTARY_FALLBACK = {"RotaryEmbedding": 2, "SkipSimplifiedLayerNormalization": 2}
_GQA = {"GroupQueryAttention": 1, "SkipSimplifiedLayerNormalization": 2}

FAMILIES: dict[str, DecoderFamily] = {
    "gpt2": DecoderFamily("gpt2", "gpt2", {"Attention": 1, "SkipLayerNormalization": 2}),
    "llama": DecoderFamily("genai", "gpt2", _GQA, _ROTARY_FALLBACK, grouped_query=True),
    "mistral": DecoderFamily("genai", "gpt2", _GQA, _ROTARY_FALLBACK, grouped_query=True),
    "qwen2": DecoderFamily("genai", "gpt2", _GQA, _ROTARY_FALLBACK, grouped_query=True),
    "qwen3": DecoderFamily("genai", "gpt2", _GQA, _ROTARY_FALLBACK, grouped_query=True),
    "phi3": DecoderFamily("genai", "gpt2", _GQA, _ROTARY_FALLBACK, grouped_query=True),
}


def genai_builder_available() -> bool:
    try:
        import onnxruntime_genai.models.builder  # noqa: F401
    except Exception:  # ImportError, or a builder release that imports newer transformers classes
        return False
    return True
