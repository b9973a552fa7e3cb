"""The road of the *model argument* of `xformopt.optimize`, counted the way issue 34 counted it: which
files the model enters on its way to an artifact, in call order, and where it climbs back up the layers.
`scripts/road.py` (without --follow) counts something broader (every module pair of the whole run, once).

Traced at run time (sys.setprofile) on a real `optimize` call. What *carries the model*:

- the model argument itself (the string typed, e.g. ``minilm``);
- a model folder a call returns while carrying the model (a str/Path to a folder with a config.json:
  the resolved local path, a pruned or distilled stage's folder), under both its spelling and its
  resolved path;
- a model spec object such a call returns (any class named ``ModelSpec``), and its ``path``;
- a value holding one of these one level down: an item of a list/tuple/set/dict, an attribute of an
  object (``self`` included: a method of an object that holds the spec carries it).

A *stop* is a call site at which the model enters a function in another file than its caller's: the
callee's arguments carry the model. Each call site (caller file and line -> callee function) counts once,
so a loop over rows is one stop, and a second pass through the same code (the final run after the shape
search's trial of the same shape) adds nothing; a file entered again from another call site counts again.
The caller is the nearest frame in the package (a call through the standard library or torch keeps its
package caller); module bodies (imports) are not calls. A *climb* is a stop into a higher layer than the
caller's (the traced checkout's tests/core/test_layers.py LAYERS; the package root above everything).

Each stop records *how* it carries the model: ``argument`` (the string, a model folder or the spec is an
argument), ``self`` (a method or property of the spec, or of an object holding it) or ``inside`` (an
argument holds it one level down, e.g. a pass context). The same stops are also read as a *walk*: the
sequence of files the model is in, calls and the returns from them, consecutive repeats merged; a step of
the walk is a stop, a step to a higher layer (a return from below, mostly) a climb. The walk over
``argument`` stops is the reading that lands nearest the issue's figures on the issue's tree (115 stops and
41 climbs against its 96 and 39; pipeline.py entered 8 times, so re-entered 7, before the shape search's
first pass runs, as the issue says), so it is the one compared with the target; the others are printed
beside it. The same walk read between *units* (a file the issue's redesign turned into a folder, such as
``models.py`` or ``pipeline.py``, counts once) lands nearer still on stops: 93 stops and 41 climbs. Its
*hand-offs* (the call sites at which the model crosses from one unit into another, each a call and a return
of that walk) are listed, so that what each one is for can be read.

*Floors*: the height of the import graph between modules and packages (every .py file of the package,
a package's __init__ being the package), its imports read as tests/core/test_layers.py reads them (any depth;
``from a.b import c`` names a.b, ``from xformopt import m`` names xformopt.m): the longest chain of modules,
each importing the next, modules that import each other (a cycle) being one floor. On 73f5784, the tree
of the issue's text, this gives its 18 floors for 46 units. *Units* are the modules and folders directly
under the package, as tests/core/test_layers.py counts them.

    python scripts/road_follow.py [MODEL] [--shape-search] [--limit N] [--json]   # or road.py --follow
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import threading
from collections import Counter
from functools import cache
from pathlib import Path, PurePath

# The shape search as tests/pipeline/test_shape_search.py runs it, on a real checkpoint: two short shapes, a budget
# every shape meets (so the fewest-FLOPs shape is kept and the final run reuses its passes).
PRUNE = {"layers": 1, "ffn_dim": 32, "measure_latency": False, "samples": 16, "eval_samples": 16}
DISTILL = {"train_samples": 64, "eval_samples": 16, "max_length": 32, "batch_size": 16, "patience": 0,
           "checkpoint_every": 0, "max_steps": 2, "eval_every": 2, "label_column": ""}


def shape_recipe(limit: int) -> dict:
    return {
        "name": "road-shapes", "target": "auto",
        "passes": [{"prune": PRUNE}, {"distill": DISTILL}, "export", {"quantize": {"mode": "dynamic"}}],
        "evaluation": {"limit": limit, "latency_rounds": 3, "warmup": 1, "repeats": 1},
        "shape_search": {"max_minutes": 30, "shapes": [{"layers": 2, "ffn_dim": 64}, {"layers": 1, "ffn_dim": 32}]},
    }


def _checkout() -> Path:
    import xformopt

    return Path(xformopt.__file__).resolve().parents[1]


def _test_layers():
    spec = importlib.util.spec_from_file_location("road_test_layers", _checkout() / "tests" / "test_layers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def layers() -> dict[str, int]:
    table = {unit: i for i, (_, units) in enumerate(_test_layers().LAYERS) for unit in units}
    table[""] = len(table) and max(table.values()) + 1  # the package root re-exports the API: above everything
    return table


def units() -> int:
    return len(_test_layers()._unit_graph())


def _module_of(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _existing(name: str, package: Path) -> str | None:
    """The longest prefix of a dotted name that is a module or package of the tree."""
    while name:
        base = package.parent / name.replace(".", "/")
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return name
        name = name.rpartition(".")[0]
    return None


def module_graph(package: Path) -> dict[str, set[str]]:
    """module -> the package modules it imports, read as tests/core/test_layers.py reads imports (any depth,
    relative ones resolved; ``from a.b import c`` names a.b, ``from xformopt import m`` names xformopt.m),
    each name taken to the longest prefix that is a module or package of the tree."""
    graph: dict[str, set[str]] = {}
    read = _test_layers()._imported
    for path in package.rglob("*.py"):
        me = _module_of(path, package)
        deps = graph.setdefault(me, set())
        for _, name in read(path):
            if (found := _existing(name, package)) and found != me:
                deps.add(found)
    return graph


def floors(package: Path) -> tuple[int, list[str]]:
    """The import graph's height in modules (cycles condensed to one floor) and its tallest chain."""
    graph = module_graph(package)
    order, low, stack, on, comp = {}, {}, [], set(), {}

    def strong(v: str) -> None:  # Tarjan: modules that import each other share one floor
        order[v] = low[v] = len(order)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in order:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            while True:
                w = stack.pop()
                on.discard(w)
                comp[w] = v
                if w == v:
                    break

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in order:
            strong(v)
    below: dict[str, set[str]] = {}
    for v, deps in graph.items():
        below.setdefault(comp[v], set()).update(comp[w] for w in deps if comp[w] != comp[v])

    @cache
    def tallest(c: str) -> tuple[str, ...]:
        return (c, *max((tallest(d) for d in below.get(c, ())), key=len, default=()))

    chain = max((tallest(c) for c in below), key=len)
    return len(chain), list(chain)


class Follower:
    """Follows the model through the calls of one run (see the module docstring for what carries it)."""

    def __init__(self, model: str, package: Path):
        self.root = str(package) + os.sep
        self.strings = {str(model)}
        self.objects: dict[int, object] = {}  # id -> the object (held, so an id is never reused)
        self.carrying: set[int] = set()  # frames entered carrying the model: their return values are harvested
        self.sites: set[tuple] = set()
        self.stops: list[dict] = []
        self.errors: Counter = Counter()
        self.open: dict[int, dict] = {}  # frames of a stop still running: their return is a step back
        self.walk: list[dict] = []  # stops and the returns from them, in order

    def module(self, filename: str) -> str | None:
        if not filename.startswith(self.root):
            return None
        return _module_of(Path(filename), Path(self.root.rstrip(os.sep)))

    def _is(self, value) -> bool:
        if isinstance(value, (str, PurePath)):
            return str(value) in self.strings
        return id(value) in self.objects

    def carries(self, value) -> bool:
        if self._is(value):
            return True
        if isinstance(value, (str, bytes, PurePath, int, float, type(None))):
            return False
        if isinstance(value, dict):
            inner = list(value.values())[:64]
        elif isinstance(value, (list, tuple, set, frozenset)):
            inner = list(value)[:64]
        else:
            try:
                inner = list(vars(value).values())[:64]
            except TypeError:
                return False
        return any(self._is(v) for v in inner)

    def harvest(self, value) -> None:
        if isinstance(value, (str, PurePath)):
            try:
                folder = Path(value)
                if str(value) and (folder / "config.json").is_file():
                    self.strings |= {str(value), str(folder), str(folder.resolve())}
            except (OSError, ValueError):
                pass
        elif type(value).__name__ == "ModelSpec":
            self.objects[id(value)] = value
            self.harvest(getattr(value, "path", ""))
        elif isinstance(value, tuple):
            for v in value[:8]:
                self.harvest(v)

    def _args(self, frame) -> list:
        """The call's arguments (*args and **kwargs opened one level)."""
        code, local = frame.f_code, frame.f_locals
        n = code.co_argcount + code.co_kwonlyargcount
        values = [local.get(name) for name in code.co_varnames[:n]]
        if code.co_flags & 4:  # *args
            star = local.get(code.co_varnames[n])
            values += list(star)[:64] if isinstance(star, tuple) else [star]
            n += 1
        if code.co_flags & 8:  # **kwargs
            star = local.get(code.co_varnames[n])
            values += list(star.values())[:64] if isinstance(star, dict) else [star]
        return values

    def profile(self, frame, event, arg) -> None:
        try:
            self._see(frame, event, arg)
        except Exception as exc:  # noqa: BLE001 - the tracer must never change the traced run
            self.errors[type(exc).__name__] += 1

    def _see(self, frame, event, arg) -> None:
        if event == "return":
            if id(frame) in self.carrying:
                self.carrying.discard(id(frame))
                self.harvest(arg)
            if (stop := self.open.pop(id(frame), None)) is not None:  # back in the caller's file
                self.walk.append({"event": "return", "from": stop["to"], "to": stop["from"], "how": stop["how"]})
            return
        if event != "call" or not frame.f_code.co_filename.startswith(self.root):
            return
        if frame.f_code.co_name == "<module>":  # a module body: an import, not a call
            return
        how = self._how(frame)
        if how is None:
            return
        self.carrying.add(id(frame))
        caller = frame.f_back
        while caller is not None and not caller.f_code.co_filename.startswith(self.root):
            caller = caller.f_back
        if caller is None or caller.f_code.co_name == "<module>":
            return
        if caller.f_code.co_filename == frame.f_code.co_filename:
            return
        site = (caller.f_code.co_filename, caller.f_lineno, frame.f_code)
        if site in self.sites:
            return
        self.sites.add(site)
        stop = {"from": self.module(caller.f_code.co_filename), "to": self.module(frame.f_code.co_filename),
                "function": getattr(frame.f_code, "co_qualname", frame.f_code.co_name), "line": caller.f_lineno,
                "how": how, "event": "call"}
        self.stops.append(stop)
        self.open[id(frame)] = stop
        self.walk.append(stop)

    def _how(self, frame) -> str | None:
        """How the call carries the model: "argument" (the value itself is an argument), "self" (the method of
        an object that is or holds it), "inside" (an argument holds it one level down), or None."""
        values = self._args(frame)
        code = frame.f_code
        has_self = code.co_argcount > 0 and code.co_varnames[0] in ("self", "cls")
        rest = values[1:] if has_self else values
        if any(self._is(v) for v in rest):
            return "argument"
        if has_self and values and self.carries(values[0]):
            return "self"
        if any(self.carries(v) for v in rest):
            return "inside"
        return None

    def run(self, call) -> None:
        sys.setprofile(self.profile)
        threading.setprofile(self.profile)
        try:
            call()
        finally:
            sys.setprofile(None)
            threading.setprofile(None)


def follow(model: str, *, shape_search: bool, limit: int) -> dict:
    import xformopt

    package = Path(xformopt.__file__).resolve().parent
    layer = layers()
    follower = Follower(model, package)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XFORMOPT_CACHE_DIR"] = str(Path(tmp) / "cache")  # a cold cache, kept for the search's reuse
        if shape_search:
            follower.run(lambda: xformopt.optimize(model, recipe=shape_recipe(limit), output=Path(tmp) / "out",
                                                   max_accuracy_drop=100))
        else:
            follower.run(lambda: xformopt.optimize(model, output=Path(tmp) / "out", limit=limit, use_cache=False))
    def rank(module: str | None) -> int:
        return layer.get(module.split(".")[1] if module and "." in module else "", -1)

    for step in follower.walk:
        step["climb"] = rank(step["to"]) > rank(step["from"])
    height, chain = floors(package)
    entered = Counter(s["to"] for s in follower.stops)
    return {"model": model, "shape_search": shape_search, "limit": limit, "checkout": str(_checkout()),
            **variant(follower.walk, rank, HOWS), "variants": {name: variant(follower.walk, rank, hows)
                                                               for name, hows in VARIANTS.items()},
            "files": len({s["to"] for s in follower.stops} | {s["from"] for s in follower.stops}),
            "entered_most": entered.most_common(8), "units": units(), "floors": height, "tallest_chain": chain,
            "unit_walk": unit_walk(follower.walk, rank), "hand_offs": hand_offs(follower.stops),
            "tracer_errors": dict(follower.errors), "road": follower.stops, "walk": follower.walk}


HOWS = ("argument", "self", "inside")
VARIANTS = {"the model as an argument only (no methods of the spec, no holders)": ("argument",),
            "the model as an argument or a method's object (no holders)": ("argument", "self")}


def walk_files(walk: list[dict], hows: tuple[str, ...]) -> list[str]:
    """The files the model is in, in order (calls and returns that carry it in one of ``hows``)."""
    files: list[str] = []
    for step in (s for s in walk if s["how"] in hows):
        for module in ((step["from"], step["to"]) if not files else (step["to"],)):
            if not files or files[-1] != module:
                files.append(module)
    return files


def variant(walk: list[dict], rank, hows: tuple[str, ...]) -> dict:
    """Stops and climbs counted over the calls that carry the model in one of ``hows``; and the same road read
    as a walk (the sequence of files the model is in, calls and the returns from them; a file entered
    again counts again; a climb is a step to a higher layer, by a call or a return)."""
    calls = [s for s in walk if s["event"] == "call" and s["how"] in hows]
    files = walk_files(walk, hows)
    steps = list(zip(files, files[1:]))
    return {"stops": len(calls), "climbs": sum(s["climb"] for s in calls),
            "walk_stops": len(steps), "walk_climbs": sum(rank(b) > rank(a) for a, b in steps)}


def unit_of(module: str | None) -> str:
    """The unit a module belongs to (tests/core/test_layers.py's: the top-level module or subpackage)."""
    return module.split(".")[1] if module and "." in module else ""


def unit_walk(walk: list[dict], rank) -> dict:
    """The walk of the model as an argument read between units instead of files: the issue counted files
    when ``models``, ``passes/<name>`` and ``pipeline`` were single files or flat folders, so a file the
    requested split turned into a folder counts once here. On the issue's tree this lands nearest its figures
    (93 stops and 41 climbs against 96 and 39; the file walk gives 115 and 41)."""
    units: list[str] = []
    for module in walk_files(walk, ("argument",)):
        if not units or units[-1] != unit_of(module):
            units.append(unit_of(module))
    steps = list(zip(units, units[1:]))
    return {"walk_stops": len(steps), "walk_climbs": sum(rank("x." + b) > rank("x." + a) for a, b in steps),
            "units": units}


def hand_offs(stops: list[dict]) -> list[dict]:
    """The call sites at which the model, as an argument, crosses from one unit into another: each is two steps
    of the unit walk (the call and the return), and the return a climb when the caller's layer is higher."""
    return [s for s in stops if s["how"] == "argument" and unit_of(s["from"]) != unit_of(s["to"])]


def render(doc: dict) -> str:
    lines = [f"{'^' if s['climb'] else ' '} {s['from']} -> {s['to']}.{s['function']}  (line {s['line']}; {s['how']})"
             for s in doc["road"]]
    most = ", ".join(f"{m} {n}" for m, n in doc["entered_most"])
    lines += ["", f"model {doc['model']!r}, shape search {'on' if doc['shape_search'] else 'off'}, limit {doc['limit']}",
              f"{doc['stops']} stops, {doc['climbs']} climbs, {doc['files']} files; entered most: {most}",
              f"read as a walk (calls and returns): {doc['walk_stops']} stops, {doc['walk_climbs']} climbs"]
    for name, v in doc["variants"].items():
        lines.append(f"{name}: {v['stops']} stops, {v['climbs']} climbs; as a walk {v['walk_stops']} stops, "
                     f"{v['walk_climbs']} climbs")
    issue = walk_files(doc["walk"], ("argument",))
    lines += ["", "the walk of the model as an argument (the issue's reading; the package name left out):",
              " > ".join(m.removeprefix("xformopt.") for m in issue),
              "", f"read between units: {doc['unit_walk']['walk_stops']} stops, {doc['unit_walk']['walk_climbs']} climbs",
              " > ".join(doc["unit_walk"]["units"]),
              "", f"hand-offs between units ({len(doc['hand_offs'])}; each a call and a return of that walk):",
              *(f"  {s['from']}:{s['line']} -> {s['to']}.{s['function']}" for s in doc["hand_offs"]),
              "",
              f"{doc['units']} units (modules and folders), {doc['floors']} import floors "
              f"({' -> '.join(doc['tallest_chain'])})"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="minilm")
    parser.add_argument("--shape-search", action="store_true",
                        help="run the prune shape search too (a two-shape search, budget met by any shape)")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--floors-only", action="store_true", help="the import floors and units, nothing run")
    args = parser.parse_args(argv)
    if args.floors_only:
        import xformopt

        package = Path(xformopt.__file__).resolve().parent
        height, chain = floors(package)
        print(f"{units()} units (modules and folders), {height} import floors ({' -> '.join(chain)})")
        return
    doc = follow(args.model, shape_search=args.shape_search, limit=args.limit)
    print(json.dumps(doc, indent=1) if args.json else render(doc))


if __name__ == "__main__":
    main()
