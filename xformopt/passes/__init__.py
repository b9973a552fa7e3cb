"""The pass registry: name -> "module:Class", imported only when a pass is used (keeps start-up fast)."""

from __future__ import annotations

from importlib import import_module

from xformopt.passes.base import Pass

REGISTRY: dict[str, str] = {
    "prune": "xformopt.passes.prune:PrunePass",
    "distill": "xformopt.passes.distill:DistillPass",
    "export": "xformopt.passes.export:ExportPass",
    "fuse": "xformopt.passes.fuse:FusePass",
    "quantize": "xformopt.passes.quantize:QuantizePass",
    "int4": "xformopt.passes.quantize_int4:Int4Pass",
}


def get_pass(name: str) -> type[Pass]:
    module, cls = REGISTRY[name].split(":")
    return getattr(import_module(module), cls)


def all_passes() -> list[type[Pass]]:
    return [get_pass(name) for name in REGISTRY]
