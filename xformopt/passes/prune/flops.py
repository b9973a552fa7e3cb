"""The FLOP model prune budgets with: per-layer kept dimensions of an encoder and what they cost.

Encoder layers only (embeddings, pooler and classifier are not counted), a multiply-add = 2 FLOPs,
one sequence of length L, per layer with a = heads x head_dim attention width, d = hidden size,
f = FFN width: attention projections 8 L d a, scores and context 4 L^2 a, FFN 4 L d f.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Shape:
    """Per-layer kept dimensions of an encoder."""

    hidden: int
    head_dim: int
    heads: list[int]  # per layer
    ffn: list[int]  # per layer

    @property
    def num_layers(self) -> int:
        return len(self.heads)



def layer_flops(hidden: int, attn_width: int, ffn: int, length: float) -> dict[str, float]:
    return {
        "attention_projections": 8 * length * hidden * attn_width,
        "attention_scores": 4 * length * length * attn_width,
        "ffn": 4 * length * hidden * ffn,
    }



def encoder_flops(shape: Shape, length: float) -> dict[str, float]:
    total = {"attention_projections": 0.0, "attention_scores": 0.0, "ffn": 0.0}
    for heads, ffn in zip(shape.heads, shape.ffn):
        for k, v in layer_flops(shape.hidden, heads * shape.head_dim, ffn, length).items():
            total[k] += v
    total["total"] = sum(total.values())
    return total



def config_shape(config: dict) -> Shape:
    """A model's full shape from its config.json (the keys of BERT-like families and DistilBERT's)."""
    heads = int(config.get("num_attention_heads") or config.get("n_heads") or 1)
    hidden = int(config.get("hidden_size") or config.get("dim") or 1)
    layers = int(config.get("num_hidden_layers") or config.get("n_layers") or 1)
    ffn = int(config.get("intermediate_size") or config.get("hidden_dim") or 4 * hidden)
    return Shape(hidden, hidden // heads, [heads] * layers, [ffn] * layers)



def round_multiple(value: float, multiple: int, low: int, high: int) -> int:
    """``value`` rounded to the nearest multiple (at least one multiple), clipped to [low, high]."""
    rounded = max(multiple, round(value / multiple) * multiple)
    return int(min(max(rounded, low), high))



def head_step(head_dim: int, multiple: int) -> int:
    """Smallest head count whose width (heads x head_dim) is a multiple of the SIMD multiple."""
    return multiple // math.gcd(head_dim, multiple)

