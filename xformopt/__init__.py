"""xformopt: export, prune, distill, fuse and quantize Hugging Face transformers into verified ONNX artifacts.

The Python API (docs/api.md) is re-exported here and imported on first use, so ``import xformopt``
stays fast (no torch, no onnxruntime)::

    import xformopt
    result = xformopt.optimize("minilm", output="out")
    vectors = xformopt.load("out").embed(["a text"])
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# First, before any module of the package can import ONNX Runtime, huggingface_hub or Ray: their telemetry
# off (ONNX Runtime reads its switch once, when it loads). xformopt/no_telemetry.py says why and what.
from xformopt.no_telemetry import switch_off as _switch_off  # noqa: E402
from xformopt.version import __version__

_switch_off()

# name -> the module that defines it; resolved by __getattr__ (PEP 562) when first used.
_EXPORTS = {
    "optimize": "xformopt.api", "run_pass": "xformopt.api", "load": "xformopt.api",
    "bench": "xformopt.api", "bench_generation": "xformopt.api", "search": "xformopt.api", "Result": "xformopt.api", "PassResult": "xformopt.api",
    "BenchResult": "xformopt.api", "SearchResult": "xformopt.api",
    "XformoptError": "xformopt.errors", "InputError": "xformopt.errors", "GateFailed": "xformopt.errors",
    "BudgetMissed": "xformopt.errors", "PassFailed": "xformopt.errors",
}

__all__ = [  # noqa: RUF022 (grouped: functions, results, errors)
    "__version__", "optimize", "run_pass", "load", "bench", "bench_generation", "search",
    "Result", "PassResult", "BenchResult", "SearchResult",
    "XformoptError", "InputError", "GateFailed", "BudgetMissed", "PassFailed",
]

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ imports on demand
    from xformopt.api import (
        BenchResult,
        PassResult,
        Result,
        SearchResult,
        bench,
        bench_generation,
        load,
        optimize,
        run_pass,
        search,
    )
    from xformopt.errors import (
        BudgetMissed,
        GateFailed,
        InputError,
        PassFailed,
        XformoptError,
    )


def __getattr__(name: str):
    import importlib

    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'xformopt' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
