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


# --------------------------------------------------------------------------- what the README claims, against the code

# How the README names each row of the family table (xformopt/families.py); a new row must be named here and listed.
FAMILY_NAMES = {
    "bert": "BERT", "distilbert": "DistilBERT", "roberta": "RoBERTa", "xlm-roberta": "XLM-R", "camembert": "CamemBERT",
    "electra": "ELECTRA", "mpnet": "MPNet", "deberta-v2": "DeBERTa-v2/v3", "modernbert": "ModernBERT",
    "eurobert": "EuroBERT", "gte": "GTE", "nomic_bert": "NomicBERT", "jina_embeddings_v3": "Jina v3",
    "gpt2": "GPT-2", "llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3",
    "qwen3_5_text": "Qwen3.5", "phi3": "Phi-3", "ministral3": "Ministral 3", "gemma4_text": "Gemma 4",
    "t5": "T5", "mt5": "mT5", "bart": "BART", "mbart": "mBART", "marian": "Marian", "t5gemma2": "T5Gemma 2",
}


def _covers_row(label: str) -> str:
    section = README.read_text(encoding="utf-8").split("## What it covers", 1)[1].split("\n## ", 1)[0]
    row = re.search(rf"^\| \*\*{re.escape(label)}\*\* \| (.*) \|$", section, re.M)
    assert row, f"the README's 'What it covers' has no row {label!r}"
    return row.group(1)


def _listed(label: str) -> list[str]:
    """The row's comma-separated names, each cut at its first ';' or '(' (what follows is a remark)."""
    names = re.split(r";|\(", _covers_row(label))[0]
    return [name.strip() for name in names.split(",") if name.strip()]


@pytest.mark.parametrize("label, kind", [("encoders", "ENCODERS"), ("decoders", "DECODERS"),
                                         ("encoder-decoders", "SEQ2SEQS")])
def test_what_it_covers_lists_the_family_table(label, kind):
    from xformopt import families

    rows = getattr(families, kind)
    assert set(rows) <= set(FAMILY_NAMES), f"name the new rows in FAMILY_NAMES: {sorted(set(rows) - set(FAMILY_NAMES))}"
    assert sorted(_listed(label)) == sorted(FAMILY_NAMES[row] for row in rows)


def test_what_it_covers_lists_the_task_registry_and_the_generic_path():
    from xformopt import tasks

    assert set(re.findall(r"`([a-z-]+)`", _covers_row("tasks"))) == set(tasks.TASKS)
    assert "generic path" in _covers_row("any other text model")


def _extras_in_pyproject() -> dict[str, str]:
    """Each extra of pyproject.toml's [project.optional-dependencies] and its requirement list, as written."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    table = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r"^([a-z0-9_-]+) = \[(.*?)\]", table, re.M | re.S))


def test_the_readme_gives_each_extra_its_purpose():
    section = README.read_text(encoding="utf-8").split("## Install", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([a-z0-9_-]+)` \| \S", section, re.M))
    extras = {name for name, requirements in _extras_in_pyproject().items() if requirements.strip()}
    assert documented == extras  # the empty `dynamo` extra is kept only so that old install lines resolve


def test_ci_starts_with_the_readme_quick_start_read_from_the_readme():
    import importlib.util

    spec = importlib.util.spec_from_file_location("quickstart", ROOT / ".ci" / "quickstart.py")
    quickstart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quickstart)
    text = README.read_text(encoding="utf-8")
    block = _BLOCK.search(text.split("## Quick start", 1)[1]).group(2)
    first, _, last = block.strip().splitlines()
    assert quickstart.command("install", text) == first.split(" #")[0].strip()
    assert quickstart.command("test", text) == last.split(" #")[0].strip()
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.strip().startswith("#")]
    installs = [i for i, line in enumerate(ci) if "pip install" in line]
    runs = [i for i, line in enumerate(ci) if "pytest" in line or '"$test_command"' in line]
    # the first install CI makes is the README's line, and the first tests it runs are the README's command
    assert ci[installs[0]] == f"install_line='{quickstart.command('install', text)}'"
    assert ci[runs[0]] == f"test_command='{quickstart.command('test', text)}'"
    checked = " ".join(ci[runs[0]:])
    assert "quickstart.py install" in checked and "quickstart.py test" in checked and "exit 1" in checked
    assert '"$install_line"' in " ".join(ci[:ci.index('XFORMOPT_EXTRAS_SKIPPED="$skipped" eval "$test_command"')])
