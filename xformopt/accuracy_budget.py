"""An allowed accuracy drop, as users write it: metric points (``0.5``) or relative (``'1%'``).

One parser for every place that takes one (`quantize`'s budget, `bench`'s gate, recipes), so
``1%`` means the same thing everywhere: one percent of the reference value (the float graph for
quantize, the baseline for bench), converted to points by :func:`points`.
"""

from __future__ import annotations

import math
import re

HINT = "points >= 0 (e.g. 0.5) or a percentage of the reference value (e.g. '1%')"


def parse(value) -> float | str:
    """``0.5`` / ``"0.5"`` -> 0.5 points; ``"1%"`` -> ``"1%"`` (kept relative). ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"max_accuracy_drop must be {HINT}, got {value!r}")
    if isinstance(value, (int, float)):
        number = float(value)
    else:
        text = str(value).strip()
        if re.fullmatch(r"\d+(\.\d+)?\s*%", text):
            return text.replace(" ", "")
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f"max_accuracy_drop must be {HINT}, got {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"max_accuracy_drop must be {HINT}, got {value!r}")
    return number


def points(budget: float | str, reference_points: float) -> float:
    """The budget in metric points: absolute, or a percentage of ``reference_points`` (value x 100)."""
    if isinstance(budget, str):
        return float(budget.rstrip("%")) / 100 * float(reference_points)
    return float(budget)
