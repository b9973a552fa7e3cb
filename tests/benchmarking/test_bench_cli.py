"""`xformopt bench` end to end on a tiny artifact: exit codes, the JSON document, -o and --junit.

The artifact is a tiny random BERT classifier run through `pipeline.run` (export only, 3 timing
rounds x 2 repeats). Verdicts that depend on timing use a fake `modes.solo_repeats` with fixed
numbers, so no test asserts anything about wall-clock time.
"""

from __future__ import annotations

import copy
import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers import error_lines, run_cli, write_heldout

from xformopt.measure import modes
from xformopt.measure.host import host_fingerprint

TOP_LEVEL_KEYS = {"schema", "created", "artifact_path", "model", "target", "headline_metric", "settings", "host",
                  "host_fingerprint", "artifact", "notes", "comparison"}
COMPARISON_KEYS = {"baseline", "baseline_schema", "baseline_created", "gated", "comparable", "settings_mismatch",
                   "host_mismatch", "host_mismatch_allowed", "reason", "limits", "checks", "passed"}
CHECK_KEYS = {"name", "kind", "unit", "baseline", "current", "change", "limit", "tolerance", "threshold", "verdict",
              "message", "evidence"}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, tiny_classifier, heldout_file) -> Path:
    from xformopt import pipeline, recipe

    r = recipe.validate({
        "name": "tiny-bench",
        "passes": ["export"],
        "evaluation": {"data": str(heldout_file), "limit": 30, "latency_rounds": 3, "warmup": 1, "repeats": 2},
    })
    out = tmp_path_factory.mktemp("bench") / "artifact"
    pipeline.run(str(tiny_classifier), r, out, use_cache=False)
    return out


@pytest.fixture
def report(artifact) -> dict:
    return json.loads((artifact / "report.json").read_text())


def fixed_latency(median: float, medians: list[float]) -> dict:
    return {"median_ms": median, "p90_ms": median * 1.2, "p99_ms": median * 1.5, "mean_ms": median, "std_ms": 0.01,
            "min_ms": median * 0.9, "throughput_per_s": 1000 / median, "n": 3 * len(medians), "repeats": len(medians),
            "repeat_medians_ms": medians, "spread_ms": (max(medians) - min(medians)) / 2}


@pytest.fixture
def timing(monkeypatch):
    """Make the artifact's solo timing return the given latency dict (no clock involved)."""
    calls = []

    def use(latency: dict) -> list:
        def fake(predictor, texts, pairs, *, rounds, warmup, repeats, seed=0, progress=None):
            calls.append({"rows": len(texts), "rounds": rounds, "warmup": warmup, "repeats": repeats, "seed": seed})
            return copy.deepcopy(latency)

        monkeypatch.setattr(modes, "solo_repeats", fake)
        return calls

    return use


def write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def with_latency(doc: dict, latency: dict) -> dict:
    doc = copy.deepcopy(doc)
    doc["artifact"]["latency"] = latency
    return doc


# --------------------------------------------------------------------------- measuring


def test_bench_without_baseline_measures_and_exits_0(artifact, report, capsys):
    code, out, err = run_cli(["bench", artifact, "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert set(doc) == TOP_LEVEL_KEYS
    assert doc["schema"] == "xformopt.bench/1"
    assert set(doc["artifact"]) == {"stage", "latency", "metrics"} == set(report["artifact"])
    assert set(doc["artifact"]["latency"]) == set(report["artifact"]["latency"])
    assert len(doc["artifact"]["latency"]["repeat_medians_ms"]) == 2
    settings = doc["settings"]
    assert {k: settings[k] for k in ("mode", "batch", "threads", "rounds", "warmup", "repeats", "seed")} == {
        k: report["settings"][k] for k in ("mode", "batch", "threads", "rounds", "warmup", "repeats", "seed")}
    assert settings["heldout"]["rows"] == report["settings"]["heldout"]["rows"] == 24
    assert doc["host_fingerprint"] == host_fingerprint(doc["host"]) == report["host_fingerprint"]
    # Same rows as the reference outputs: the metrics are optimize's, value for value.
    assert set(doc["artifact"]["metrics"]) == {"accuracy", "macro_f1", "agreement_with_baseline"}
    for name, metric in report["artifact"]["metrics"].items():
        assert doc["artifact"]["metrics"][name]["value"] == pytest.approx(metric["value"])
    comparison = doc["comparison"]
    assert set(comparison) == COMPARISON_KEYS
    assert comparison["gated"] is False and comparison["baseline"].endswith("report.json")
    assert [c["name"] for c in comparison["checks"]] == ["latency_median_ms", "accuracy"]
    assert all(CHECK_KEYS <= set(c) for c in comparison["checks"])
    assert doc["notes"] == [] or all(isinstance(n, str) for n in doc["notes"])


def test_human_output_shows_measurement_and_informative_comparison(artifact, report, capsys, timing):
    timing(report["artifact"]["latency"])
    code, out, err = run_cli(["bench", artifact], capsys)
    assert code == 0, err
    assert "latency median" in out and "accuracy" in out
    assert "informative, not a gate" in out and "latency evidence: repeat medians" in out


def test_settings_default_to_the_report(artifact, report, capsys, timing):
    calls = timing(report["artifact"]["latency"])
    code, _, err = run_cli(["bench", artifact, "--json"], capsys)
    assert code == 0, err
    s = report["settings"]
    assert calls == [{"rows": 24, "rounds": s["rounds"], "warmup": s["warmup"], "repeats": s["repeats"], "seed": s["seed"]}]
    calls.clear()
    code, out, _ = run_cli(["bench", artifact, "--json", "--rounds", "5", "--repeats", "3", "--limit", "10"], capsys)
    assert code == 0
    assert calls[0]["rounds"] == 5 and calls[0]["repeats"] == 3 and calls[0]["rows"] == 10
    # 10 of the 24 rows are not the reference rows: baseline-relative metrics are skipped, and said so.
    doc = json.loads(out)
    assert set(doc["artifact"]["metrics"]) == {"accuracy", "macro_f1"}
    assert any("agreement_with_baseline skipped" in n for n in doc["notes"])


def test_other_data_skips_baseline_relative_metrics(artifact, report, tmp_path, test_rows, capsys, timing):
    timing(report["artifact"]["latency"])
    other = write_heldout(tmp_path / "other.jsonl", test_rows[100:112])
    code, out, err = run_cli(["bench", artifact, "--data", other, "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["settings"]["heldout"]["rows"] == 12
    assert "agreement_with_baseline" not in doc["artifact"]["metrics"] and "accuracy" in doc["artifact"]["metrics"]
    assert "agreement_with_baseline skipped" in err
    assert doc["comparison"]["comparable"] is False  # other rows than the report's: informative only


def test_data_flag_naming_the_recipe_file_keeps_the_reference_rows(artifact, report, heldout_file, capsys, timing):
    timing(report["artifact"]["latency"])
    code, out, err = run_cli(["bench", artifact, "--data", heldout_file, "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert "agreement_with_baseline" in doc["artifact"]["metrics"] and doc["notes"] == []
    assert doc["comparison"]["comparable"] is True


# --------------------------------------------------------------------------- gating


def test_bench_against_own_report_passes(artifact, report, capsys, timing):
    timing(report["artifact"]["latency"])  # a perfect reproduction of the report's timing
    code, out, err = run_cli(["bench", artifact, "--baseline", artifact / "report.json"], capsys)
    assert code == 0, err
    assert "gate passed" in out and "error" not in err


def test_bench_against_much_faster_baseline_fails(artifact, report, tmp_path, capsys, timing):
    timing(fixed_latency(2.0, [1.99, 2.0, 2.01]))
    baseline = write(tmp_path / "faster.json", with_latency(report, fixed_latency(2.0 / 3, [1.99 / 3, 2.0 / 3, 2.01 / 3])))
    junit, out_json = tmp_path / "ci" / "bench.xml", tmp_path / "ci" / "bench.json"
    code, out, err = run_cli(["bench", artifact, "--baseline", baseline, "--junit", junit, "-o", out_json], capsys)
    assert code == 1
    lines = error_lines(err.split("xformopt: wrote")[-1])
    assert lines[-1] == (
        "error: latency regression: median 2.00 ms vs 0.67 ms baseline (+200.0%), limit +5% + noise 0.02 ms"
    )
    assert "REGRESSION" in out and "gate failed" in out
    root = ET.parse(junit).getroot()
    assert root.get("tests") == "2" and root.get("failures") == "1"
    assert root.find("testcase[@name='latency_median_ms']/failure") is not None
    doc = json.loads(out_json.read_text())
    assert set(doc) == TOP_LEVEL_KEYS and doc["comparison"]["passed"] is False and doc["comparison"]["gated"] is True
    assert not list(out_json.parent.glob(".*tmp*"))  # atomic writes leave no temp files


def test_json_output_on_regression_still_exits_1(artifact, report, tmp_path, capsys, timing):
    timing(fixed_latency(2.0, [2.0, 2.0]))
    baseline = write(tmp_path / "faster.json", with_latency(report, fixed_latency(1.0, [1.0, 1.0])))
    code, out, err = run_cli(["bench", artifact, "--baseline", baseline, "--json"], capsys)
    assert code == 1
    doc = json.loads(out)
    assert doc["comparison"]["checks"][0]["verdict"] == "regression"
    assert "latency regression" in err


def test_limit_flag_widens_the_gate(artifact, report, tmp_path, capsys, timing):
    timing(fixed_latency(2.0, [2.0, 2.0]))
    baseline = write(tmp_path / "b.json", with_latency(report, fixed_latency(1.8, [1.8, 1.8])))
    assert run_cli(["bench", artifact, "--baseline", baseline], capsys)[0] == 1
    assert run_cli(["bench", artifact, "--baseline", baseline, "--max-latency-regression", "15%"], capsys)[0] == 0
    assert run_cli(["bench", artifact, "--baseline", baseline, "--max-latency-regression", "0.15"], capsys)[0] == 0


def test_accuracy_regression_fails(artifact, report, tmp_path, capsys, timing):
    timing(report["artifact"]["latency"])
    doctored = copy.deepcopy(report)
    current = doctored["artifact"]["metrics"]["accuracy"]["value"]
    doctored["artifact"]["metrics"]["accuracy"]["value"] = min(1.0, current + 0.1)
    if doctored["artifact"]["metrics"]["accuracy"]["value"] - current < 0.01:  # already ~100%: gate on a drop the other way
        pytest.skip("tiny model scores 100%")
    code, _, err = run_cli(["bench", artifact, "--baseline", write(tmp_path / "acc.json", doctored)], capsys)
    assert code == 1
    assert error_lines(err)[-1].startswith("error: accuracy regression: ")


def test_bench_json_is_a_valid_baseline(artifact, report, tmp_path, capsys, timing):
    timing(fixed_latency(2.0, [1.99, 2.01]))
    first = tmp_path / "first.json"
    assert run_cli(["bench", artifact, "-o", first], capsys)[0] == 0
    code, out, err = run_cli(["bench", artifact, "--baseline", first, "--json"], capsys)
    assert code == 0, err
    comparison = json.loads(out)["comparison"]
    assert comparison["baseline_schema"] == "xformopt.bench/1" and comparison["passed"]


def test_metric_text_percentages_match_the_report():
    from xformopt.cli.bench import _metric_text

    assert _metric_text("accuracy", {"value": 0.905, "n": 200, "ci95": [0.86, 0.94]}) == "90.50% (95% CI 86.0-94.0%), n=200"
    assert _metric_text("agreement_with_baseline", {"value": 0.99, "n": 200}) == "99.00%, n=200"
    # macro_f1 is a 0-1 score in the report (0.905), not a percentage
    assert _metric_text("macro_f1", {"value": 0.905, "n": 200, "ci95": [0.86, 0.94]}) == "0.9050 (95% CI 0.8600-0.9400), n=200"


# --------------------------------------------------------------------------- refusals (exit 2)


def test_gate_without_the_headline_metric_in_the_baseline_exits_2(artifact, report, tmp_path, capsys, timing):
    timing(report["artifact"]["latency"])
    doctored = copy.deepcopy(report)
    del doctored["artifact"]["metrics"]["accuracy"]
    code, out, err = run_cli(["bench", artifact, "--baseline", write(tmp_path / "no-acc.json", doctored)], capsys)
    assert code == 2 and "gate passed" not in out
    lines = [line for line in error_lines(err) if line.startswith("error:")]
    assert len(lines) == 1 and lines[0] == error_lines(err)[-1]
    assert lines[0].startswith("error: cannot gate: the headline metric accuracy could not be compared (the baseline has no accuracy)")


def test_gate_on_an_artifact_without_reference_exits_2(artifact_copy, capsys, timing):
    # As for an embeddings artifact without reference/: the headline metric is baseline-relative.
    report_path = artifact_copy / "report.json"
    doc = json.loads(report_path.read_text())
    doc["headline_metric"] = "cosine_to_baseline"
    doc["artifact"]["metrics"]["cosine_to_baseline"] = {"value": 0.999, "n": 24, "stderr": 0.0001, "p1": 0.99}
    report_path.write_text(json.dumps(doc))
    shutil.rmtree(artifact_copy / "reference")
    timing(doc["artifact"]["latency"])
    code, out, err = run_cli(["bench", artifact_copy, "--baseline", report_path], capsys)
    assert code == 2 and "gate passed" not in out
    errors = [line for line in error_lines(err) if line.startswith("error:")]
    assert len(errors) == 1
    assert errors[0].startswith("error: cannot gate: the headline metric cosine_to_baseline could not be compared")
    assert "reference/" in errors[0] and "held-out data" in errors[0]
    # Without --baseline the same run is informative and still exits 0.
    assert run_cli(["bench", artifact_copy], capsys)[0] == 0


def test_host_mismatch_refused_then_allowed(artifact, report, tmp_path, capsys, timing):
    timing(report["artifact"]["latency"])
    other = copy.deepcopy(report)
    other["host"]["cores_usable"] = 64
    other["host_fingerprint"] = host_fingerprint(other["host"])
    baseline = write(tmp_path / "other-host.json", other)
    code, _, err = run_cli(["bench", artifact, "--baseline", baseline], capsys)
    assert code == 2
    assert len(error_lines(err)) == 1
    assert "another host" in err and "cores_usable 64 in the baseline vs" in err and "--allow-host-mismatch" in err
    code, out, err = run_cli(["bench", artifact, "--baseline", baseline, "--allow-host-mismatch"], capsys)
    assert code == 0, err
    assert "allowed by --allow-host-mismatch" in out


def test_settings_mismatch_refused_even_with_flag(artifact, report, capsys, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("timed although the baseline is not comparable")

    monkeypatch.setattr(modes, "solo_repeats", never)
    threads = report["settings"]["threads"] + 1
    # more threads than this host's CPUs would be refused first (validate.check_threads): say it has them
    monkeypatch.setattr("xformopt.measure.host.usable_cpus", lambda *a, **k: threads)
    code, _, err = run_cli(["bench", artifact, "--baseline", artifact / "report.json", "--threads", threads,
                            "--allow-host-mismatch"], capsys)
    assert code == 2
    line = error_lines(err)[-1]
    assert line.startswith("error: not comparable: baseline settings differ")
    assert f"pass --threads {threads - 1}" in line and "does not cover settings" in line


def test_bad_artifact_path_exits_2(tmp_path, capsys):
    code, out, err = run_cli(["bench", tmp_path / "nope"], capsys)
    assert code == 2 and out == ""
    assert error_lines(err) == [f"error: artifact not found: {tmp_path / 'nope'}; pass the -o folder of `xformopt optimize`"]


def test_directory_without_manifest_exits_2(tmp_path, capsys):
    code, _, err = run_cli(["bench", tmp_path], capsys)
    assert code == 2 and "no manifest.json" in err and len(error_lines(err)) == 1


@pytest.fixture
def artifact_copy(artifact, tmp_path) -> Path:
    copy_dir = tmp_path / "copy"
    shutil.copytree(artifact, copy_dir)
    return copy_dir


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("report.json", "{not json", "report.json is not valid JSON"),
    ("report.json", '{"schema": "xformopt.report/99"}', "has schema 'xformopt.report/99'"),
    ("manifest.json", "[]", "manifest.json is not a JSON object"),
    ("report.json", '{"schema": "xformopt.report/1", "settings": {}, "artifact": {}, "host": {}}', "has no artifact latency"),
    ("model.onnx", "not an onnx model", "is not a valid ONNX model"),
    ("reference/rows.json", '{"row_ids": [1, 2]}', "does not describe baseline_outputs.npy"),
])
def test_corrupted_artifact_exits_2(artifact_copy, capsys, name, text, expected):
    (artifact_copy / name).write_text(text)
    code, _, err = run_cli(["bench", artifact_copy], capsys)
    assert code == 2
    errors = [line for line in error_lines(err) if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0]


def test_missing_report_exits_2(artifact_copy, capsys):
    (artifact_copy / "report.json").unlink()
    code, _, err = run_cli(["bench", artifact_copy], capsys)
    assert code == 2 and "has no report.json" in err


@pytest.mark.parametrize(("content", "expected"), [
    ('{"schema": "something/1"}', "unknown schema 'something/1'"),
    ("[1, 2", "is not valid JSON"),
])
def test_bad_baseline_exits_2(artifact, tmp_path, capsys, content, expected):
    baseline = tmp_path / "baseline.json"
    baseline.write_text(content)
    code, _, err = run_cli(["bench", artifact, "--baseline", baseline], capsys)
    assert code == 2 and expected in err and len(error_lines(err)) == 1


@pytest.mark.parametrize("value", ["abc", "5", "-1%"])
def test_bad_latency_limit_exits_2(artifact, capsys, value):
    code, _, err = run_cli(["bench", artifact, "--max-latency-regression", value], capsys)
    assert code == 2 and "--max-latency-regression" in err


def test_negative_accuracy_drop_is_a_usage_error(artifact, capsys):
    code, _, _ = run_cli(["bench", artifact, "--max-accuracy-drop", "-1"], capsys)
    assert code == 2
