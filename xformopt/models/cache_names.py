"""The name a transformers model gives its key/value cache: ``cache`` since transformers 5.25,
``past_key_values`` before (5.25 still reads the old name with a warning and drops it in 5.40). Every
forward call and cached output in xformopt goes through these two so both ends of ``>=5.0,<6`` work."""

from __future__ import annotations

import functools
import inspect


@functools.cache
def _argument(forward_owner: type) -> str:
    parameters = inspect.signature(forward_owner.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def cache_kwargs(model, cache) -> dict:
    """``{name: cache}`` for ``model(...)``, under the name the model's forward takes."""
    return {_argument(type(model)): cache}


def output_cache(output):
    """The cache a forward returned (``output.cache``, or ``output.past_key_values`` before 5.25)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)
