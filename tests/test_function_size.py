"""No function over 80 lines: a long function is orchestration that wants its steps named.

The functions listed in ``KNOWN_LONG`` are older than the rule; each may shrink, never grow, and a new
one may not join them. The pass code (``passes/``) has no exceptions."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "xformopt"
LIMIT = 80
NO_EXCEPTIONS = ("passes/",)
# "path::function": its length when the rule came in
KNOWN_LONG = {
    "fusions/deberta_v2.py::fuse": 99,
}


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


def test_no_new_long_function():
    long = {k: n for k, n in function_lengths().items() if n > LIMIT}
    new = {k: n for k, n in long.items() if k not in KNOWN_LONG}
    grown = {k: (KNOWN_LONG[k], n) for k, n in long.items() if k in KNOWN_LONG and n > KNOWN_LONG[k]}
    assert not new, f"functions over {LIMIT} lines: {new}; split them into named steps"
    assert not grown, f"functions that grew past their size when the rule came in (was, now): {grown}"


@pytest.mark.parametrize("folder", NO_EXCEPTIONS)
def test_pass_code_has_no_exceptions(folder):
    assert not [k for k in KNOWN_LONG if k.startswith(folder)]
    assert any(k.startswith(folder) for k in function_lengths()), f"no functions found under {folder}"


def test_the_list_of_exceptions_is_current():
    """A function that was split, renamed or removed leaves the list (so the list never hides a new one)."""
    lengths = function_lengths()
    stale = [k for k, n in KNOWN_LONG.items() if lengths.get(k, 0) <= LIMIT]
    assert not stale, f"KNOWN_LONG names functions no longer over {LIMIT} lines: {stale}; remove them"
