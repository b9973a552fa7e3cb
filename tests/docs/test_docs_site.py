"""The docs site's generated references (scripts/docs_pages.py) follow the code, and none is committed.

`mkdocs build --strict` itself runs in .ci/run (broken links, anchors, nav, API references); these
tests check what the generators render, without mkdocs installed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import typer

ROOT = Path(__file__).resolve().parents[2]


def _pages():
    spec = importlib.util.spec_from_file_location("docs_pages_under_test", ROOT / "scripts" / "docs_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # the module writes pages only when run by mkdocs-gen-files (__main__ guard)
    return module


PLACEHOLDER = "Placeholder: the docs build replaces this page"


def test_generated_pages_are_not_committed():
    """Only placeholders live in docs/ at the generated pages' paths (so the README's links resolve on
    GitHub too); the build replaces them. The changelog page is CHANGELOG.md itself, never a copy."""
    pages = _pages()
    for page in pages.PAGES:
        path = ROOT / "docs" / page
        if page == "changelog.md":
            assert not path.exists(), "docs/changelog.md is generated from CHANGELOG.md at build time"
            continue
        text = path.read_text(encoding="utf-8")
        assert PLACEHOLDER in text and len(text) < 1000, f"docs/{page}: generated content committed"


def test_the_build_replaces_the_placeholders():
    pages = _pages()
    for page, render in pages.PAGES.items():
        if page != "changelog.md":
            assert PLACEHOLDER not in render()


def test_cli_page_has_every_command_and_option_help():
    from xformopt.cli.app import app

    page = _pages().cli_page()
    root = typer.main.get_command(app)
    stack = [(["xformopt"], root)]
    while stack:
        path, command = stack.pop()
        assert f"## `{' '.join(path)}`" in page
        ctx = command.context_class(command, info_name=path[-1])
        for param in command.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and record[1]:
                first_words = " ".join(record[1].split()[:4])
                assert first_words in " ".join(page.split()), f"{' '.join(path)} {record[0]}: help not on the page"
        for name, sub in getattr(command, "commands", {}).items():
            stack.append((path + [name], sub))


def test_cli_page_follows_a_changed_help_text(monkeypatch):
    """The page is the code's help: change an option's help and the page changes, with no page edited."""
    from xformopt.cli.app import app

    pages = _pages()
    original = typer.main.get_command

    def patched(typer_app):
        command = original(typer_app)
        bench = command.commands["bench"]
        option = next(p for p in bench.params if "--max-latency-regression" in getattr(p, "opts", ()))
        option.help = "A help text changed in the code only."
        return command

    assert "A help text changed in the code only." not in pages.cli_page()
    monkeypatch.setattr(typer.main, "get_command", patched)
    assert app is not None
    assert "A help text changed in the code only." in pages.cli_page()


def test_recipe_page_has_every_pass_and_option():
    from xformopt.passes import REGISTRY, get_pass
    from xformopt.recipe import EvaluationSettings

    page = _pages().recipe_page()
    for name in REGISTRY:
        assert f"## Pass `{name}`" in page
        for field in get_pass(name).Options.model_fields:
            assert f"| `{field}` |" in page, f"{name}.{field} missing from the recipe schema page"
    for field in EvaluationSettings.model_fields:
        assert f"| `{field}` |" in page


def test_exit_code_page_has_every_error_class():
    from xformopt import errors

    page = _pages().exit_page()
    for value in vars(errors).values():
        if isinstance(value, type) and issubclass(value, errors.XformoptError):
            assert f"| {value.exit_code} | `xformopt.{value.__name__}` |" in page
    assert "| 130 | SIGINT |" in page and "| 143 | SIGTERM |" in page


def test_changelog_release_matches_the_version():
    """The newest release section of CHANGELOG.md is the version `xformopt --version` prints."""
    import re

    import xformopt

    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "## [Unreleased]" in text  # every branch adds its entries under this heading
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", text, re.M)
    assert released and released[0] == xformopt.__version__


def test_report_schema_page_documents_every_key_of_a_real_report():
    """docs/report-schema.md is hand-written (the report has no pydantic model to render): every key of
    the reports `xformopt optimize` wrote for benchmarks/results/ must have its row there, and the build
    appends what the code defines (schemas, metrics per task, their bounds)."""
    import json
    import re

    doc = (ROOT / "docs" / "report-schema.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `([^`]+)` \|", doc, re.M))
    reports = sorted((ROOT / "benchmarks" / "results").glob("where-to-run-*/*report.json"))
    assert reports
    for path in reports:
        report = json.loads(path.read_text(encoding="utf-8"))
        sections = {"(top)": report, "stages[]": report["stages"][-1], "artifact": report["artifact"],
                    "settings": report["settings"], "host": report["host"], "memory": report["memory"]}
        for where, section in sections.items():
            assert set(section) <= documented, f"{path.name} {where}: {sorted(set(section) - documented)} undocumented"

    from xformopt import tasks

    appendix = _pages().report_appendix()
    for name in tasks.names():
        assert f"| `{name}` |" in appendix
