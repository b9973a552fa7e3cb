"""The bench and profile documents are typed (xformopt/benchmarking/types.py, xformopt/profiling/types.py):
real documents, made by running `xformopt bench` (informative and gated) and `xformopt profile` on a tiny
artifact, validate against their types and come back from JSON unchanged; a field the types do not
declare is caught (strict in this suite); docs/bench-schema.md documents exactly the typed fields."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from helpers import run_cli

from xformopt.benchmarking import types as bench_types
from xformopt.benchmarking.types import bench_errors, check_bench
from xformopt.profiling import types as profile_types
from xformopt.profiling.types import check_profile, profile_errors
from xformopt.typed_json import STRICT_ENV, type_errors

DOC = Path(__file__).resolve().parents[2] / "docs" / "bench-schema.md"
REPORT_DOC = Path(__file__).resolve().parents[2] / "docs" / "report-schema.md"


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, tiny_classifier, heldout_file) -> Path:
    from xformopt import pipeline, recipe

    r = recipe.validate({
        "name": "tiny-types", "target": "auto", "passes": ["export", "quantize"],
        "evaluation": {"data": str(heldout_file), "limit": 16, "latency_rounds": 3, "warmup": 1, "repeats": 2},
    })
    out = tmp_path_factory.mktemp("bench-types") / "artifact"
    pipeline.run(str(tiny_classifier), r, out, use_cache=False)
    return out


@pytest.fixture(scope="module")
def documents(artifact, tmp_path_factory) -> dict[str, tuple[str, dict]]:
    """name -> (the JSON text as written, the document as the code returned it)."""
    from xformopt import api

    root = tmp_path_factory.mktemp("bench-docs")
    docs = {}
    own = api.bench(artifact, rounds=3, repeats=1, output=root / "own.json").doc  # informative: its own report
    docs["informative"] = ((root / "own.json").read_text(), own)
    gated = api.bench(artifact, rounds=3, repeats=1, baseline=root / "own.json", max_latency_regression="1000%",
                      output=root / "gated.json").doc  # the gate, against the first document
    docs["gated"] = ((root / "gated.json").read_text(), gated)
    return docs


def test_real_bench_documents_match_their_type_and_round_trip(documents):
    for name, (text, returned) in documents.items():
        written = json.loads(text)
        assert bench_errors(returned) == [], name
        assert bench_errors(written) == [], name
        assert json.loads(json.dumps(returned, default=str)) == written, name  # the JSON is the dict, unchanged
        assert list(written) == list(returned), name  # and its key order
    gate = documents["gated"][1]["comparison"]
    assert gate["gated"] and gate["checks"] and gate["passed"]  # the gate's checks were typed too
    assert {c["kind"] for c in gate["checks"]} == {"latency", "metric"}


def test_a_real_profile_document_matches_its_type_and_round_trips(artifact, tmp_path, capsys):
    code, out, err = run_cli(["profile", artifact, "--runs", "3", "--warmup", "1", "--json", "-o", tmp_path / "prof"],
                             capsys)
    assert code == 0, err
    printed = json.loads(out)
    written = json.loads((tmp_path / "prof" / "profile.json").read_text())
    assert profile_errors(printed) == [] and profile_errors(written) == []
    assert printed == written
    report = json.loads((artifact / "report.json").read_text())
    assert type_errors(profile_types.ReportProfile, report["profile"]) == []  # the report's profile section


@pytest.mark.parametrize("where, key", [("", "surprise"), ("comparison", "verdict"), ("comparison.checks.0", "p"),
                                        ("settings.heldout", "file"), ("artifact", "step_cost_ms")])
def test_an_unexpected_bench_field_is_named(documents, where, key):
    doc = json.loads(documents["gated"][0])
    node = doc
    for part in filter(None, where.split(".")):
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[key] = 1
    assert any(e.startswith(f"{where}.{key}" if where else key) for e in bench_errors(doc))


def test_strict_raises_and_lenient_only_logs(documents, monkeypatch, caplog):
    bad = {**json.loads(documents["informative"][0]), "surprise": 1}
    monkeypatch.setenv(STRICT_ENV, "1")
    with pytest.raises(TypeError, match="bench document.*surprise"):
        check_bench(bad)
    with pytest.raises(TypeError, match="profile document.*surprise"):
        check_profile({"surprise": 1})
    monkeypatch.setenv(STRICT_ENV, "0")
    with caplog.at_level(logging.WARNING, logger="xformopt.benchmarking.types"):
        check_bench(bad)
    assert "surprise" in caplog.text


def test_bench_writes_nothing_when_its_document_departs_from_the_type(artifact, tmp_path, monkeypatch):
    """Under the strict switch a field the types do not know fails the bench before -o is written."""
    from xformopt import api
    from xformopt.benchmarking import measure

    real = measure.measure
    monkeypatch.setattr(measure, "measure", lambda art, run: {**real(art, run), "notes": [1.5]})
    monkeypatch.setenv(STRICT_ENV, "1")
    with pytest.raises(TypeError, match="notes"):
        api.bench(artifact, rounds=3, repeats=1, output=tmp_path / "b.json")
    assert not (tmp_path / "b.json").exists()


# ------------------------------------------------------------------ docs/bench-schema.md against the types

SECTIONS = {
    "Bench document": bench_types.BenchDocument, "Bench settings": bench_types.BenchSettings,
    "comparison": bench_types.Comparison, "checks": bench_types.Check,
}


def doc_tables(doc: Path) -> dict[str, dict[str, str]]:
    """Heading -> {field: its Meaning cell} for every ``| Field | Type | Meaning |`` table."""
    tables, heading, rows = {}, None, None
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            heading, rows = line.lstrip("#").strip(), None
        elif line.startswith("| Field |"):
            rows = tables.setdefault(heading, {})
        elif rows is not None and (m := re.match(r"\| `([^`]+)` \| [^|]+ \| (.*) \|$", line)):
            rows[m.group(1)] = m.group(2)
    return tables


def _keys(typed) -> set[str]:
    return set(typed.__required_keys__) | set(typed.__optional_keys__)


@pytest.mark.parametrize("heading", sorted(SECTIONS))
def test_the_doc_documents_exactly_the_typed_fields(heading):
    documented = doc_tables(DOC).get(heading)
    assert documented, f"docs/bench-schema.md has no field table under {heading!r}"
    typed = SECTIONS[heading]
    assert set(documented) == _keys(typed)
    marked = {name for name, meaning in documented.items() if meaning.startswith("*")}
    assert marked <= set(typed.__optional_keys__), f"{heading}: the doc says {sorted(marked)} may be absent"


def test_the_profile_tables_cover_the_profile_types():
    """The report's profile table documents ReportProfile; the command's table adds the run's own fields."""
    body = doc_tables(REPORT_DOC)["profile"]
    assert set(body) == _keys(profile_types.ReportProfile)
    run = doc_tables(DOC)["Profile document"]
    assert set(body) | set(run) == _keys(profile_types.ProfileDocument)
