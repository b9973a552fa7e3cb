"""xformopt: export, prune, distill, fuse and quantize Hugging Face transformers into verified ONNX artifacts.

The Python API (docs/api.md) is re-exported here and imported on first use, so ``import xformopt``
stays fast (no torch, no onnxruntime)::

    import xformopt
    result = xformopt.optimize("minilm", output="out")
    vectors = xformopt.load("out").embed(["a text"])
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# First, before any module of the package can import ONNX Runtime, huggingface_hub or Ray: their telemetry
# off (ONNX Runtime reads its switch once, when it loads). xformopt/no_telemetry.py says why and what.
from xformopt.no_telemetry import switch_off as _switch_off  # noqa: E402

_switch_off()

# name -> the module that defines it; resolved by __getattr__ (PEP 562) when first used.
_EXPORTS = {
    "optimize": "xformopt.api", "run_pass": "xformopt.api", "load": "xformopt.api",
    "Result": "xformopt.api", "PassResult": "xformopt.api",
    "BenchResult": "xformopt.api", "SearchResult": "xformopt.api",
    "XformoptError": "xformopt.errors", "InputError": "xformopt.errors", "GateFailed": "xformopt.errors",
    "BudgetMissed": "xformopt.errors", "PassFailed": "xformopt.errors",
}

# `bench` and `search` are also subpackages, whose import would replace a function of the same name
# here; so xformopt.bench / xformopt.search are those packages, made callable (_CallablePackage).
_CALLABLE_PACKAGES = ("bench", "search")

__all__ = [  # noqa: RUF022 (grouped: functions, results, errors)
    "__version__", "optimize", "run_pass", "load", "bench", "search",
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


class _CallablePackage(types.ModuleType):
    """A subpackage that is also an API function: ``xformopt.bench(artifact, ...)`` is
    ``xformopt.api.bench(artifact, ...)``, while ``xformopt.bench.gate`` stays the module."""

    def __call__(self, *args, **kwargs):
        import importlib

        return getattr(importlib.import_module("xformopt.api"), self.__name__.rpartition(".")[2])(*args, **kwargs)


def _callable_package(name: str) -> None:
    """Called by xformopt/bench/__init__.py and xformopt/search/__init__.py on themselves."""
    sys.modules[name].__class__ = _CallablePackage


def __getattr__(name: str):
    import importlib

    if name in _CALLABLE_PACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'xformopt' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, *_CALLABLE_PACKAGES})
