"""The report is typed (xformopt/report/types.py): a real run's report.json validates against ``Report``,
a field the types do not declare is caught (strict in this suite: tests/conftest.py sets the switch, and
the pipeline holds every report it writes to the type), and docs/report-schema.md documents exactly the
fields the types declare."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from test_report import make_report

from xformopt import pipeline, recipe
from xformopt.report import types
from xformopt.report.types import check_report, report_errors
from xformopt.typed_json import STRICT_ENV

DOC = Path(__file__).resolve().parents[2] / "docs" / "report-schema.md"


@pytest.fixture(scope="module")
def real_report(tmp_path_factory, tiny_classifier, heldout_file) -> tuple[dict, dict]:
    """One optimize run with every timing mode (fixed shapes, throughput, the model call alone) and an
    ONNX final stage (so a profile too): the report as written to disk, and as the run returned it."""
    root = tmp_path_factory.mktemp("report-types")
    r = recipe.validate({
        "name": "tiny", "target": "auto", "passes": ["export", {"fuse": {"select": "all"}}, "quantize"],
        "evaluation": {"data": str(heldout_file), "limit": 24, "latency_rounds": 3, "warmup": 1, "repeats": 2,
                       "modes": ["real", "fixed", "throughput", "model"], "batch": [1, 2], "seq": [8],
                       "fixed_rounds": 3},
    })
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XFORMOPT_CACHE_DIR", str(root / "cache"))
        result = pipeline.run(str(tiny_classifier), r, root / "out")
    return json.loads((root / "out" / "report.json").read_text()), result.report


def test_a_real_report_matches_its_type(real_report):
    on_disk, returned = real_report
    for section in ("fixed", "throughput", "model_call", "profile", "memory"):  # the run covered the optional ones
        assert section in on_disk, section
    assert report_errors(on_disk) == []  # as read back from JSON (string keys in by_batch)
    assert report_errors(returned) == []  # as the pipeline built it


def test_the_hand_built_report_the_renderers_are_tested_on_matches_too():
    for task in ("text-classification", "feature-extraction"):
        assert report_errors(make_report(task, fixed=True, throughput=True, model_call=True)) == []


def _where(doc: dict, path: str):
    node = doc
    for part in path.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


@pytest.mark.parametrize("path, key", [
    ("", "surprise"),  # an undeclared top-level field
    ("stages.1", "latency_ms"),  # in a stage row
    ("stages.0.latency", "p95_ms"),  # in a latency
    ("stages.3.graph", "int4_gemms"),  # in a stage's graph facts
    ("artifact.latency", "spread"),  # in the artifact's solo timing
    ("settings.heldout", "file"),
    ("host", "cpu"),
])
def test_an_unexpected_field_is_named(path, key):
    report = make_report(fixed=True)
    (_where(report, path) if path else report)[key] = 1
    errors = report_errors(report)
    where = f"{path}.{key}" if path else key
    assert any(e.startswith(where) for e in errors), errors


@pytest.mark.parametrize("change, where", [
    (lambda r: r.pop("host_fingerprint"), "host_fingerprint"),  # a required field missing
    (lambda r: r["stages"][0].pop("speedup"), "stages.0.speedup"),
    (lambda r: r["artifact"]["latency"].pop("spread_ms"), "artifact.latency.spread_ms"),
    (lambda r: r["settings"].update(threads="two"), "settings.threads"),  # a value of the wrong type
    (lambda r: r["stages"][2]["graph"].update(fused_ops=["Attention"]), "stages.2.graph.fused_ops"),
    (lambda r: r["stages"][1]["metrics"]["accuracy"].pop("value"), "stages.1.metrics.accuracy.value"),
])
def test_a_missing_field_or_a_wrong_type_is_named(change, where):
    report = make_report()
    change(report)
    errors = report_errors(report)
    assert any(e.startswith(where) for e in errors), errors


def test_a_task_may_add_its_own_counts_to_a_metric():
    report = make_report()
    report["stages"][0]["metrics"]["accuracy"]["entities"] = 12  # token classification's, say
    assert report_errors(report) == []


def test_strict_raises_and_lenient_only_logs(monkeypatch, caplog):
    bad = {**make_report(), "surprise": 1}
    monkeypatch.setenv(STRICT_ENV, "1")
    with pytest.raises(TypeError, match="report.*surprise"):
        check_report(bad)
    monkeypatch.setenv(STRICT_ENV, "0")
    with caplog.at_level(logging.WARNING, logger="xformopt.report.types"):
        check_report(bad)
    assert "surprise" in caplog.text


def test_the_pipeline_holds_the_report_it_writes_to_the_type(tmp_path, tiny_classifier, heldout_file, monkeypatch):
    """A field the types do not know fails a run under the strict switch, before anything is written."""
    monkeypatch.setenv(STRICT_ENV, "1")
    monkeypatch.setenv("XFORMOPT_CACHE_DIR", str(tmp_path / "cache"))
    r = recipe.validate({"name": "tiny", "target": "auto", "passes": ["export"],
                         "evaluation": {"data": str(heldout_file), "limit": 8, "latency_rounds": 3, "warmup": 0,
                                        "repeats": 1}})
    with pytest.raises(TypeError, match="the report.*surprise"):
        pipeline.run(str(tiny_classifier), r, tmp_path / "out", extra_report={"surprise": 1})
    assert not (tmp_path / "out" / "report.json").exists()


# ------------------------------------------------------------------ docs/report-schema.md against the types

# section heading in the doc -> the type its table documents
SECTIONS = {
    "Top level": types.Report, "stages": types.StageRow, "LatencyStats": types.LatencyStats,
    "graph": types.GraphFacts, "memory": types.MemorySummary, "MemoryBlock": types.MemoryBlock,
    "artifact": types.Artifact, "settings": types.Settings, "host": types.Host, "shape_search": types.ShapeSearch,
}


def doc_tables() -> dict[str, dict[str, str]]:
    """Heading -> {field: its Meaning cell} for every ``| Field | Type | Meaning |`` table in the doc."""
    tables, heading, rows = {}, None, None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            heading, rows = line.lstrip("#").strip(), None
        elif line.startswith("| Field |"):
            rows = tables.setdefault(heading, {})
        elif rows is not None and (m := re.match(r"\| `([^`]+)` \| [^|]+ \| (.*) \|$", line)):
            rows[m.group(1)] = m.group(2)
    return tables


def _fields(typed) -> tuple[set[str], set[str]]:
    return set(typed.__required_keys__), set(typed.__optional_keys__)


@pytest.mark.parametrize("heading", sorted(SECTIONS))
def test_the_doc_documents_exactly_the_typed_fields(heading):
    documented = doc_tables().get(heading)
    assert documented, f"docs/report-schema.md has no field table under {heading!r}"
    required, optional = _fields(SECTIONS[heading])
    assert set(documented) == required | optional, (
        f"{heading}: documented, not typed: {sorted(set(documented) - required - optional)}; "
        f"typed, not documented: {sorted((required | optional) - set(documented))}")


@pytest.mark.parametrize("heading", sorted(SECTIONS))
def test_a_field_the_doc_calls_optional_is_optional_in_the_type(heading):
    """The doc marks a field that appears only sometimes in italics (*Optional*, *ONNX stages only*, ...)."""
    _, optional = _fields(SECTIONS[heading])
    marked = {name for name, meaning in doc_tables()[heading].items() if meaning.startswith("*")}
    assert marked <= optional, f"{heading}: the doc says {sorted(marked - optional)} may be absent; the type requires them"


def test_the_doc_tables_are_read():
    """The parser above finds the tables (a reformatted doc must not make the two tests above vacuous)."""
    tables = doc_tables()
    assert {"schema", "stages", "artifact"} <= set(tables["Top level"])
    assert {"median_ms", "p99_ms"} <= set(tables["LatencyStats"])
