"""The package's layers (docs/architecture.md): imports go down only, no two units lean on each other,
and function-level imports of xformopt's own modules stay rare.

A unit is a subpackage (xformopt/passes/) or a top-level module (xformopt/data.py), as in
``import_cycles.py --packages``. Imports are read from the source at any depth (module level and
inside functions): an import hidden in a function is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "xformopt"

# Lowest first. A unit may import units of its own layer or of layers below it; the cycle check
# below keeps two units of one layer from needing each other. Mirrors docs/architecture.md.
LAYERS = [
    ("foundation", {"errors", "atomic", "locks", "stale", "progress", "signals", "plot_style", "accuracy_budget",
                    "artifact", "cache", "cache_stores", "safe_yaml", "no_telemetry", "version", "logs",
                    "typed_json"}),
    ("measurement", {"measure"}),
    ("data, model facts, families, tasks", {"scoring", "data_files", "data", "resources", "families", "tasks",
                                            "models", "targets", "onnx_graph", "exporting", "fusions"}),
    ("runtime", {"runtime"}),
    ("sources", {"sources"}),
    ("pass libraries", {"decoder", "seq2seq"}),
    ("passes, evaluation, reports", {"passes", "evaluate", "profiling", "report"}),
    ("recipes", {"recipe"}),
    ("pipeline and the bench library", {"pipeline", "benchmarking"}),
    ("entry points", {"api", "recipe_search", "serve", "loadtest", "clients"}),
    ("command line", {"cli"}),
]
MAX_FUNCTION_LEVEL_IMPORTS = 25


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _unit(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None  # None: the package root (its re-exports sit above everything)


def _imported(path: Path) -> list[tuple[ast.AST, str]]:
    """(node, absolute module) for every xformopt import in ``path``."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node, a.name) for a in node.names if a.name.startswith("xformopt")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            if base == "xformopt":  # `from xformopt import models`: each name is a unit (or the root's own name)
                out += [(node, f"xformopt.{a.name}") for a in node.names]
            elif base.startswith("xformopt."):
                out.append((node, base))
    return out


def _unit_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        me = _unit(_module_name(path))
        if me is None:
            continue
        deps = graph.setdefault(me, set())
        for _, module in _imported(path):
            other = _unit(module)
            if other is not None and other != me:
                deps.add(other)
    return graph


def _layer_of() -> dict[str, int]:
    return {unit: i for i, (_, units) in enumerate(LAYERS) for unit in units}


def test_every_unit_has_a_layer():
    missing = sorted(set(_unit_graph()) - set(_layer_of()))
    assert missing == [], f"{missing}: give each a layer in LAYERS and in docs/architecture.md"


def test_imports_go_down_only():
    layer = _layer_of()
    upward = [f"{unit} ({LAYERS[layer[unit]][0]}) imports {dep} ({LAYERS[layer[dep]][0]})"
              for unit, deps in _unit_graph().items() for dep in deps
              if unit in layer and dep in layer and layer[dep] > layer[unit]]
    assert upward == []


def test_no_two_units_need_each_other():
    graph = _unit_graph()
    seen: dict[str, int] = {}  # 1 on the current path, 2 done

    def cycle_from(unit: str, path: list[str]) -> list[str] | None:
        seen[unit] = 1
        for dep in sorted(graph.get(unit, ())):
            if seen.get(dep) == 1:
                return path[path.index(dep):] + [dep] if dep in path else [unit, dep]
            if dep not in seen and (found := cycle_from(dep, path + [dep])):
                return found
        seen[unit] = 2
        return None

    for unit in sorted(graph):
        if unit not in seen and (found := cycle_from(unit, [unit])):
            raise AssertionError("import cycle: " + " -> ".join(found))


def _is_unit(name: str) -> bool:
    return (ROOT / f"{name}.py").is_file() or (ROOT / name / "__init__.py").is_file()


def test_nothing_inside_the_package_imports_the_root():
    """The root re-exports the API (xformopt/__init__.py) and so sits above every unit, the CLI included:
    a module that took a name from it (``from xformopt import __version__``) would import everything
    above itself. ``from xformopt import models`` names a unit and is fine."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path == ROOT / "__init__.py":
            continue
        for node, module in _imported(path):
            if module == "xformopt" or (module.count(".") == 1 and not _is_unit(module.split(".")[1])):
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} imports {module}")
    assert found == []


def _reach(graph: dict[str, set[str]], unit: str) -> set[str]:
    seen, todo = set(), [unit]
    while todo:
        for dep in graph.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_runtime_stands_on_model_facts_and_tasks_only():
    """Opening an artifact (xformopt.load, serve, bench) needs what the model is and what its task
    answers, never where models come from: no GGUF, hub or split-wheel code, directly or below."""
    graph = _unit_graph()
    assert graph["runtime"] <= {"errors", "models", "tasks"}
    assert "sources" not in _reach(graph, "runtime") and "sources" not in _reach(graph, "models")


def test_measurement_imports_nothing_above_the_foundation():
    """Host facts, latency loops and timing modes stand alone: every layer above may time things."""
    assert _unit_graph()["measure"] <= LAYERS[0][1]


def test_function_level_imports_of_xformopt_stay_rare():
    """Inside functions only imports of heavy libraries belong (torch, onnxruntime, transformers, ...):
    an xformopt module there usually hides a layer problem."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        # By position: _imported parses the file again, so node ids of this tree would never match its nodes.
        inner = {(n.lineno, n.col_offset) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
        found += [f"{path.relative_to(ROOT.parent)}:{node.lineno}" for node, _ in _imported(path)
                  if (node.lineno, node.col_offset) in inner]
    assert len(set(found)) <= MAX_FUNCTION_LEVEL_IMPORTS, sorted(set(found))


def _task_names() -> set[str]:
    from xformopt import tasks

    return set(tasks.TASKS)


def _names_in(node: ast.AST, names: set[str]) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in names]


def test_no_code_outside_tasks_tests_a_task_name():
    """One home per task (docs/architecture.md): what a task's head, request body, route and load-test
    payload are lives in its tasks/ module; runtime/, serve/, loadtest/ and the rest ask the task
    (``tasks.get(name).head``, ``.serving``, ``.graph``) and never compare its name or key a table by it."""
    names, found = _task_names(), []
    for path in sorted(ROOT.rglob("*.py")):
        if path.relative_to(ROOT).parts[0] == "tasks":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            hits = []
            if isinstance(node, ast.Compare):
                hits = _names_in(node, names)
            elif isinstance(node, ast.Dict):
                hits = [k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in names]
            elif isinstance(node, ast.match_case):
                hits = _names_in(node.pattern, names)
            found += [f"{path.relative_to(ROOT.parent)}:{node.lineno} {hit!r}" for hit in hits]
    assert found == []
