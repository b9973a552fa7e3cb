"""The road of one `xformopt.optimize` call through the package: which modules it enters, in which order,
and where a call climbs back up the layers (docs/architecture.md).

Traced at run time (sys.setprofile) on a real run, so an import or call hidden in a function counts as
well as one at module top. Module bodies (imports) are left out: a stop is a call. A *stop* is a first crossing from one xformopt module into another (caller
module -> callee module, the first time that pair occurs); a *climb* is a stop whose callee sits on a
higher layer than its caller (tests/core/test_layers.py's LAYERS; the package root and cli/ at the top).
Callbacks count where they run: a pass calling the CLI's log function is a climb.
*Floors* is the longest chain of imports between units (a subpackage or a top-level module; imports at
any depth), the house's height: each floor stands on the one below it.

    python scripts/road.py [MODEL] [--recipe R] [--limit N] [--json]
    python scripts/road.py --follow [MODEL] [--shape-search] [--limit N] [--json]

--follow counts the road the way issue 34 did instead: the files the *model argument* enters, call site by
call site, re-entries included (scripts/road_follow.py says what carries the model, and how floors are counted).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # the checkout whose tests/core/test_layers.py holds the layers


def _layers() -> dict[str, int]:
    sys.path.insert(0, str(HERE / "tests"))
    from test_layers import LAYERS  # the one table of layers

    table = {unit: i for i, (_, units) in enumerate(LAYERS) for unit in units}
    table[""] = len(LAYERS)  # the package root re-exports the API: above everything
    return table


def _module(filename: str, root: str) -> str | None:
    if not filename.startswith(root):
        return None
    rel = Path(filename).relative_to(root).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts)


def _unit_imports(package: Path) -> dict[str, set[str]]:
    """unit -> the units it imports (at module top or inside functions); the package root left out."""
    import ast

    units = {p.stem if p.is_file() else p.name for p in package.iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    graph: dict[str, set[str]] = {u: set() for u in units}
    for path in package.rglob("*.py"):
        rel = path.relative_to(package).parts
        me = rel[0].removesuffix(".py")
        if me == "__init__":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                # relative imports are not used in the package (ruff's TID252); the absolute form is counted
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in names:
                parts = name.split(".")
                if parts[0] == package.name and len(parts) > 1 and parts[1] in units and parts[1] != me:
                    graph[me].add(parts[1])
    return graph


def floors(package: Path) -> tuple[int, list[str]]:
    """The longest import chain between units (its length and the chain, top first)."""
    from functools import cache

    graph = _unit_imports(package)

    @cache
    def longest(unit: str) -> tuple[str, ...]:
        below = [longest(u) for u in graph[unit]]
        return (unit, *max(below, key=len, default=()))

    chain = max((longest(u) for u in graph), key=len)
    return len(chain), list(chain)


def trace(call):
    import xformopt

    root = str(Path(xformopt.__file__).resolve().parent) + "/"
    edges: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()

    def profile(frame, event, arg):
        if event != "call":
            return
        callee = _module(frame.f_code.co_filename, root)
        if callee is None or frame.f_code.co_name == "<module>":  # a module body running: an import, not a call
            return
        caller_frame = frame.f_back
        while caller_frame is not None and _module(caller_frame.f_code.co_filename, root) is None:
            caller_frame = caller_frame.f_back
        if caller_frame is None or caller_frame.f_code.co_name == "<module>":  # called while importing
            return
        caller = _module(caller_frame.f_code.co_filename, root)
        if caller is None or caller == callee:
            return
        if (caller, callee) not in seen:
            seen.add((caller, callee))
            edges.append((caller, callee))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return edges


def main() -> None:
    if "--follow" in sys.argv[1:]:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from road_follow import main as follow

        follow([a for a in sys.argv[1:] if a != "--follow"])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="minilm")
    parser.add_argument("--recipe", default=None)
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import xformopt

    layer = _layers()

    def unit(module: str) -> str:
        return module.split(".")[0] if module else ""

    with tempfile.TemporaryDirectory() as tmp:
        edges = trace(lambda: xformopt.optimize(args.model, recipe=args.recipe, output=Path(tmp) / "out",
                                                limit=args.limit, use_cache=False))
    rows = []
    for caller, callee in edges:
        climb = layer.get(unit(callee), -1) > layer.get(unit(caller), -1)
        rows.append({"from": caller or "xformopt", "to": callee or "xformopt", "climb": climb})
    modules = []
    for r in rows:
        for m in (r["from"], r["to"]):
            if m not in modules:
                modules.append(m)
    height, chain = floors(Path(xformopt.__file__).resolve().parent)
    doc = {"model": args.model, "recipe": args.recipe, "stops": len(rows), "climbs": sum(r["climb"] for r in rows),
           "modules": len(modules), "layers": len(set(layer.values())), "floors": height, "tallest_chain": chain,
           "road": rows}
    if args.json:
        print(json.dumps(doc, indent=1))
        return
    for r in rows:
        print(f"{'^' if r['climb'] else ' '} {r['from']} -> {r['to']}")
    print(f"{doc['stops']} stops, {doc['climbs']} climbs, {doc['modules']} modules; {doc['layers']} layers, "
          f"{doc['floors']} import floors ({' -> '.join(chain)})")


if __name__ == "__main__":
    main()
