"""Which INT8 formats the quantize pass tries, in order, when the first one is not close enough.

A target names the formats its kernels are fastest with; whether they keep a model's outputs is a
property of the model. The ladder starts from the target's formats and only moves towards formats
that are safe on every x86 kernel (per-channel scales, 7-bit weights, unsigned weights that never
take the saturating VPMADDUBSW path), never changing a switch the user set explicitly. The last
resort, returning the few most harmful GEMMs to float, is the caller's (it needs the harm ranking).
"""

from __future__ import annotations

import math

# Options a user may fix in the recipe / on the command line, and the value the ladder moves to.
SAFER = (
    ("per_channel", True, "per-channel weight scales"),
    ("reduce_range", True, "7-bit weights (no u8*s8 pair-sum saturation without VNNI)"),
    ("weight_type", "uint8", "unsigned weights (the U8U8 kernel, which does not saturate)"),
)


def float_gemm_bound(weighted_gemms: int) -> int:
    """How many of the most harmful GEMMs the last resort may return to float: a tenth of them, rounded
    up (4 of 36), at least one. The walk goes 1, 2, 4 ... up to this bound (``passes.fewest``)."""
    return max(1, math.ceil(weighted_gemms / 10))


def accept_floor(mean_agreement: float) -> float:
    """The floor an attempt with this mean agreement passes: rounded down to 3 decimals, so the value
    printed in ``--min-agreement`` accepts the attempt it names."""
    return math.floor(mean_agreement * 1000) / 1000


def agreement_floor(task, min_agreement: float | None) -> float:
    """The recipe's floor, else the task's (``Task.agreement_floor``: 0.99 cosine for embeddings)."""
    return task.agreement_floor if min_agreement is None else min_agreement


def format_ladder(formats: dict, fixed: dict, saturating_target: bool) -> list[dict]:
    """The target's formats first, then each safer switch the user left open, cumulatively.

    ``fixed``: option name -> value the user set (None when left to the target). Unsigned weights
    are only tried for targets whose kernels saturate: on VNNI they are slower and gain nothing.
    """
    ladder = [dict(formats, change="the target's formats")]
    current = dict(formats)
    for name, safer, why in SAFER:
        if fixed.get(name) is not None or current.get(name) == safer:
            continue
        if name == "weight_type" and not saturating_target:
            continue
        current = {**current, name: safer}
        ladder.append(dict(current, change=why))
    return ladder


def failure_hint(formats: dict, fixed: dict, floor: float, float_nodes: int) -> str:
    """Name the switches that could still help: the ones the user fixed, then the budget knobs."""
    hints = [f"--{name.replace('_', '-')}" if safer is True else f"{name}: {safer}"
             for name, safer, _ in SAFER if fixed.get(name) is not None and fixed[name] != safer]
    hints.append("exclude_nodes for the layers you can afford in float" if float_nodes
                 else "exclude_nodes (keep the most sensitive GEMMs in float)")
    hints.append(f"or lower min_agreement (now {floor})")
    return "try " + ", ".join(hints)


def describe(formats: dict) -> str:
    return (f"weights {formats['weight_type']}, per-channel {formats['per_channel']}, "
            f"reduce-range {formats['reduce_range']}")
