"""The pass registry: name -> "module:Class", imported only when a pass is used (keeps start-up fast)."""

from __future__ import annotations

from importlib import import_module

from xformopt.passes.base import Pass

REGISTRY: dict[str, str] = {
    "prune": "xformopt.passes.prune.run:PrunePass",
    "distill": "xformopt.passes.distill.run:DistillPass",
    "export": "xformopt.passes.export.run:ExportPass",
    "fuse": "xformopt.passes.fuse.run:FusePass",
    "quantize": "xformopt.passes.quantize.run:QuantizePass",
    "int4": "xformopt.passes.int4.run:Int4Pass",
}


def get_pass(name: str) -> type[Pass]:
    module, cls = REGISTRY[name].split(":")
    return getattr(import_module(module), cls)


def all_passes() -> list[type[Pass]]:
    return [get_pass(name) for name in REGISTRY]
