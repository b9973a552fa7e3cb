"""The README stays a front door: short, its commands true to the CLI, its links live; the docs' commands too.

The quick start's main job (`xformopt optimize minilm`) is run for real by
tests/pipeline/test_integration_minilm.py::test_optimize_minilm; here every `xformopt ...` line of the README's
shell blocks is resolved against the Typer app (the command path exists, `--help` of it succeeds, every
option it passes is one of that command's options), and the Python block's `xformopt.NAME`s exist.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer

import xformopt
from xformopt.cli.app import app, main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_BYTES = 12_000

_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.M | re.S)


# The guides' and results' shell blocks are held to the same rule: instructions true to the current CLI.
DOCS = sorted(p for p in (ROOT / "docs").rglob("*.md") if "reference" not in p.parts)


def _blocks(language: str, page: Path = README) -> list[str]:
    return [body for lang, body in _BLOCK.findall(page.read_text(encoding="utf-8")) if lang == language]


def _commands(pages=(README,)) -> list[list[str]]:
    """Each `xformopt ...` invocation in the bash blocks, as words (comments, pipes and && split off)."""
    found = []
    for body in (body for page in pages for body in _blocks("bash", page)):
        for line in body.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            current: list[str] = []
            for word in words + ["&&"]:
                if word in ("&&", "|", ";"):
                    if current and current[0] == "xformopt":
                        found.append(current)
                    current = []
                else:
                    current.append(word)
    return found


def test_readme_is_short():
    assert len(README.read_bytes()) <= MAX_BYTES, "the README is the front door: move detail into docs/"


def test_readme_has_commands_to_check():
    paths = {" ".join(words[:2]) for words in _commands()}
    assert {"xformopt optimize", "xformopt bench", "xformopt serve"} <= paths


@pytest.mark.parametrize("words", _commands() + _commands(DOCS), ids=lambda words: " ".join(words))
def test_documented_command_parses(words, capsys):
    command = typer.main.get_command(app)
    path = ["xformopt"]
    rest = words[1:]
    while rest and rest[0] in getattr(command, "commands", {}):
        command = command.commands[rest[0]]
        path.append(rest.pop(0))
    assert len(path) > 1, f"{' '.join(words)}: no such command"
    ctx = command.context_class(command, info_name=path[-1])
    known = {opt for param in command.get_params(ctx) for opt in (*param.opts, *param.secondary_opts)}
    for word in rest:
        if word.startswith("-"):
            assert word.split("=", 1)[0] in known, f"{' '.join(path)} has no option {word}"
    try:
        main(path[1:] + ["--help"])  # returns after printing the help (Click runs not standalone there)
    except SystemExit as exc:
        assert exc.code in (0, None), f"`{' '.join(path)} --help` exited {exc.code}"
    assert capsys.readouterr().out.startswith(f"Usage: {' '.join(path)}")


def test_readme_python_names_exist():
    (code,) = _blocks("python")
    names = set(re.findall(r"\bxformopt\.(\w+)", code))
    assert names >= {"optimize", "load", "bench"}
    for name in names:
        assert callable(getattr(xformopt, name)), name


def test_readme_links_resolve_and_reach_every_guide():
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not t.startswith("http")]
    for target in local:
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
    guides = {f"docs/guides/{p.name}" for p in (ROOT / "docs" / "guides").glob("*.md") if p.name != "index.md"}
    assert guides <= set(local), f"guides the README does not link: {sorted(guides - set(local))}"
    assert "docs/reference/cli.md" in local and "docs/serving.md" in local
