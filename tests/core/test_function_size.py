"""No function over 80 lines anywhere in the package: a long function is orchestration that wants its
steps named. (The last of the older exceptions were split in issue 34's work; there are none.)"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "xformopt"
LIMIT = 80


def function_lengths() -> dict[str, int]:
    """Every function's length in lines (its ``def`` to its last line, decorators left out)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                key = f"{rel}::{node.name}"
                out[key] = max(out.get(key, 0), node.end_lineno - node.lineno + 1)
    return out


def test_functions_are_found_everywhere():
    """The walk reaches the package's folders (so an empty result cannot pass the size rule)."""
    lengths = function_lengths()
    for folder in ("passes/", "report/", "recipe_search/", "fusions/", "runtime/"):
        assert any(k.startswith(folder) for k in lengths), f"no functions found under {folder}"


def test_no_long_function():
    long = {k: n for k, n in function_lengths().items() if n > LIMIT}
    assert not long, f"functions over {LIMIT} lines: {long}; split them into named steps"
