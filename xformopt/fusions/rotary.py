"""Rotary position embeddings written as transformers 5 writes them -> ``com.microsoft.RotaryEmbedding``.

onnxscript's ORT fusions fuse rotary in two steps: ``x * cos + rotate_half(x) * sin`` into an
intermediate RotaryEmbedding, then its cos/sin computation into ORT's cached form. The second rule
expects the frequencies as ``MatMul(inv_freq[1, E, 1], positions[B, 1, S])`` then ``Transpose``, as
transformers 4 computed them; transformers 5's rotary modules (ModernBERT's among them) compute
``positions[B, S, 1] * inv_freq[E]`` (a broadcast ``Mul``), so the rule does not match and onnxscript
undoes the first step: rotary stays as Slice/Neg/Concat/Mul/Add per q and k (0.7.2). This rule matches
the whole transformers 5 subgraph on onnxscript's pattern API::

    freqs = Cast(position_ids[:, :, None]) * inv_freq                     [B, S, E]
    cos, sin = Unsqueeze(Cos(Concat(freqs, freqs)), 1), Unsqueeze(Sin(...), 1)
    out = x * cos + Concat(-x[..., E:], x[..., :E]) * sin                   x: [B, H, S, 2E]

into ``RotaryEmbedding(x, position_ids per row, cos_cache, sin_cache)`` with the caches computed in the
graph, once per forward and inv_freq, for positions ``0 .. max(position_ids)``: the same products
``position * inv_freq`` in float as the model's, so the same values, and any length the model takes.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import _ir_utils, pattern


def _scalar(op, value: int):
    # (a ``value`` tensor, not ``value_ints``: ORT's symbolic shape inference reads only the former)
    return op.Constant(value=ir.tensor(np.array(value, np.int64)))


def _ints(op, *values: int):
    return op.Constant(value=ir.tensor(np.array(values, np.int64)))


class TransformersRotaryEmbedding(pattern.RewriteRuleClassBase):
    def __init__(self):
        # cos and sin are shared by q and k (and by every layer): the matched nodes stay for the other
        # matches, and the unused ones are removed after the rewrite.
        super().__init__("TransformersRotaryEmbedding", remove_nodes=False)
        self._caches: dict[tuple[ir.Value, ir.Value], tuple[ir.Value, ir.Value]] = {}
        self._rows: dict[ir.Value, ir.Value] = {}  # position ids -> the same per row, [batch, length]

    def cleanup(self):
        self._caches.clear()
        self._rows.clear()

    def pattern(self, op, x, inv_freq, position_ids, axes, half, end):
        freqs = op.Mul(op.Cast(op.Unsqueeze(position_ids, axes), to=ir.DataType.FLOAT), inv_freq)
        emb = op.Concat(freqs, freqs, axis=-1)
        cos, sin = op.Unsqueeze(op.Cos(emb), [1]), op.Unsqueeze(op.Sin(emb), [1])
        rotated = op.Concat(op.Neg(op.Slice(x, half, end, [3], [1])), op.Slice(x, [0], half, [3], [1]), axis=-1)
        return op.Add(op.Mul(x, cos), op.Mul(rotated, sin))

    def check(self, context, x, inv_freq, position_ids, axes, half, end, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if inv_freq.const_value is None or len(inv_freq.const_value.shape) != 1:
            return result.fail("inv_freq is not a 1-D constant", inv_freq)
        rotary_half = inv_freq.const_value.shape[0]
        if x.shape is None or len(x.shape) != 4 or x.shape[3] != 2 * rotary_half:
            return result.fail("x is not [batch, heads, length, 2 * len(inv_freq)] (a partial rotation)", x)
        if not (_ir_utils.is_singleton_value(half, rotary_half)
                and _ir_utils.is_singleton_value(end, lambda v: v >= 2 * rotary_half)):
            return result.fail("x is not split into halves of len(inv_freq)")
        # [batch or 1, length] positions unsqueezed at 2, or (onnxscript merges the two Unsqueezes of
        # ``arange(S)[None, :, None]``) [length] unsqueezed at 0 and 2
        rank = None if position_ids.shape is None else len(position_ids.shape)
        if position_ids.dtype != ir.DataType.INT64 or not (
                (rank == 2 and _ir_utils.is_1d_value(axes, [2])) or (rank == 1 and _ir_utils.is_1d_value(axes, [0, 2]))):
            return result.fail("position_ids is not [batch or 1, length] or [length] int64", position_ids)
        return result

    def _cache(self, op, inv_freq, position_ids):
        """cos and sin of ``p * inv_freq`` for p in 0 .. max(position_ids), [P, E]: computed once per forward."""
        key = (inv_freq, position_ids)
        if key not in self._caches:
            count = op.Add(op.ReduceMax(position_ids, keepdims=0), _scalar(op, 1))
            positions = op.Range(_scalar(op, 0), count,
                                 _scalar(op, 1))
            positions = op.Unsqueeze(op.Cast(positions, to=ir.DataType.FLOAT), _ints(op, 1))
            angles = op.Mul(positions, inv_freq)
            self._caches[key] = (op.Cos(angles), op.Sin(angles))
        return self._caches[key]

    def rewrite(self, op, x, inv_freq, position_ids, **_):
        cos, sin = self._cache(op, inv_freq, position_ids)
        # ORT's kernel takes [batch, length] position ids (a [1, length] row fails at batch 2)
        if position_ids not in self._rows:  # (every layer's x has the same batch: one Expand for all)
            rows = position_ids
            if len(position_ids.shape) == 1:
                rows = op.Unsqueeze(position_ids, _ints(op, 0))
            shape = op.Concat(op.Shape(x, start=0, end=1), op.Shape(rows, start=1, end=2), axis=0)
            self._rows[position_ids] = op.Expand(rows, shape)
        return op.RotaryEmbedding(x, self._rows[position_ids], cos, sin, interleaved=0, _domain="com.microsoft")


rules = pattern.RewriteRuleSet([TransformersRotaryEmbedding.rule()])


def fuse(model: ir.Model) -> int:
    """Fuse every transformers 5 rotary embedding of ``model`` (onnx_ir) in place; the number fused."""
    return rules.apply_to_model(model)
