"""The query, key and value vectors of one layer, for MiniLM's relation loss (losses.relation_kl).

Forward hooks on the layer's three projections (their paths are the family row's ``attn_query``,
``attn_key`` and ``attn_value``, xformopt/families.py) keep the outputs of the latest forward. Hooks,
not ``output_attentions``: transformers returns attention probabilities, not the vectors the relations
are built from, and the eager attention path those need is slower than SDPA.
"""

from __future__ import annotations

import math

from xformopt.families import Layout


def relation_heads(student_width: int, teacher_width: int, head_dim: int) -> int:
    """Relation heads R: both widths split into R parts of whole heads (MiniLM-v2 uses a fixed R; a pruned
    student's attention width is a multiple of the head width, so the common divisor in heads is used)."""
    return max(1, math.gcd(student_width // head_dim, teacher_width // head_dim))


class QKV:
    """Capture (query, key, value) outputs of layer ``index`` of ``model``; ``take()`` returns and clears them."""

    def __init__(self, model, arch, index: int):
        layer = arch.layers(model)[index]
        layout = arch.layout
        self.modules = [Layout.get(layer, path) for path in (layout.attn_query, layout.attn_key, layout.attn_value)]
        self.outputs: list = [None, None, None]
        self.handles = [m.register_forward_hook(self._hook(i)) for i, m in enumerate(self.modules)]

    def _hook(self, i: int):
        def keep(module, inputs, output):
            self.outputs[i] = output

        return keep

    def width(self) -> int:
        return int(self.modules[0].out_features)

    def take(self) -> list:
        out, self.outputs = self.outputs, [None, None, None]
        return out

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
