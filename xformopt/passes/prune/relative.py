"""Prune targets relative to the model being pruned: fractions of its own layers, heads, FFN width and
hidden size, so one recipe means the same on a 6-layer MiniLM and a 12-layer base-size teacher.

A fraction becomes the absolute option the explicit plan reads (``layers_fraction: 0.5`` of 12 layers is
``layers: 6``), rounded to the nearest count and at least one; the explicit plan then rounds the FFN width to
the SIMD multiple and the hidden width to the head size, as it does for absolute targets. MiniLM-L6's old
absolute shape (3 of 6 layers, 8 of 12 heads, FFN 512 of 1536) is ``0.5 / 0.667 / 0.333``.
"""

from __future__ import annotations

from xformopt.errors import InputError
from xformopt.passes.prune.flops import Shape

# fraction option -> the absolute option it sets
FRACTIONS = {"layers_fraction": "layers", "heads_fraction": "heads_per_layer", "ffn_fraction": "ffn_dim",
             "hidden_fraction": "hidden_size"}


def full_size(shape: Shape, absolute: str) -> int:
    """The model's own size of the dimension an absolute option sets."""
    return {"layers": shape.num_layers, "heads_per_layer": max(shape.heads), "ffn_dim": max(shape.ffn),
            "hidden_size": shape.hidden}[absolute]


def resolve(options, shape: Shape):
    """``options`` with every fraction replaced by the absolute target it means for ``shape`` (fractions unset)."""
    update = {}
    for fraction, absolute in FRACTIONS.items():
        value = getattr(options, fraction)
        if value is None:
            continue
        if getattr(options, absolute) is not None:
            raise InputError(f"prune: {fraction} and {absolute} set the same dimension; give one")
        update[absolute] = max(1, round(value * full_size(shape, absolute)))
        update[fraction] = None
    return options.model_copy(update=update) if update else options


def fraction_text(options) -> dict:
    """The fractions an options object was given (for the record's ``target``)."""
    return {k: getattr(options, k) for k in FRACTIONS if getattr(options, k) is not None}
