"""The fewest nodes to give back (to float, to 8 bits) for a candidate to pass a check.

Shared by the INT8 format ladder, the INT8 accuracy budget and the int4 perplexity budget: each
ranks its nodes by harm and asks how many of the most harmful must change. Building and scoring a
candidate costs a quantization and an evaluation, so counts grow 1, 2, 4 ... up to ``most`` and,
once one passes, bisect back to the fewest that pass (giving back more nodes is assumed not to hurt).
"""

from __future__ import annotations

from collections.abc import Callable


def fewest_that_pass(passes: Callable[[int], bool], most: int) -> int | None:
    """Call ``passes(k)`` for k = 1, 2, 4 ... ``most``, then bisect; the fewest k that passed, or None."""
    if most < 1:
        return None
    k, failed = 1, 0
    while True:
        ok = passes(k)
        if ok or k >= most:
            break
        failed, k = k, min(2 * k, most)
    if not ok:
        return None
    lo, hi = failed, k
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(mid):
            hi = mid
        else:
            lo = mid
    return hi
