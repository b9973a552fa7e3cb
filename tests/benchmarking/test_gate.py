"""The regression gate's decisions on hand-made documents (no models, no timing), and its JUnit XML."""

from __future__ import annotations

import copy
import json
import math
import xml.etree.ElementTree as ET

import pytest

from xformopt.benchmarking import gate
from xformopt.benchmarking.junit import junit_xml
from xformopt.errors import InputError
from xformopt.measure.host import host_fingerprint
from xformopt.report.schema import BENCH_SCHEMA, REPORT_SCHEMA

HOST = {
    "cpu_model": "Intel(R) Xeon(R) Processor", "machine": "x86_64", "cores_usable": 2,
    "versions": {"onnxruntime": "1.32.0", "torch": "2.13.0+cpu"},
}
SOURCE = "/ci/work/xformopt/resources/vader_movie/test.jsonl (text='text', pair=None, label='label'); 200 of 2014 rows (limit 200, seed 0)"


def latency(median: float, medians: list[float] | None = None) -> dict:
    medians = medians if medians is not None else [median]
    return {
        "median_ms": median, "p90_ms": median * 1.5, "p99_ms": median * 2, "mean_ms": median, "std_ms": 0.1,
        "min_ms": median / 2, "throughput_per_s": 1000 / median, "n": 100 * len(medians), "repeats": len(medians),
        "repeat_medians_ms": medians,
        "spread_ms": (max(medians) - min(medians)) / 2 if len(medians) > 1 else 0.0,
    }


def document(*, median=3.10, medians=None, metric="accuracy", value=0.865, host=None, schema=REPORT_SCHEMA,
             threads=2, seed=0, rows=200, source=SOURCE, metrics=None) -> dict:
    host = copy.deepcopy(host or HOST)
    if metrics is None:
        metrics = {metric: {"value": value, "n": rows, "ci95": [value - 0.05, min(1.0, value + 0.04)]}} if metric == "accuracy" \
            else {metric: {"value": value, "n": rows, "stderr": 0.0002, "p1": value - 0.01}}
    return {
        "schema": schema,
        "created": "2026-01-01T00:00:00+00:00",
        "headline_metric": metric,
        "settings": {"mode": "real", "batch": 1, "threads": threads, "rounds": 100, "warmup": 10, "repeats": 5,
                     "seed": seed, "heldout": {"source": source, "rows": rows}},
        "host": host,
        "host_fingerprint": host_fingerprint(host),
        "artifact": {"stage": "quantize", "latency": latency(median, medians), "metrics": metrics},
    }


def verdicts(comparison: dict) -> dict[str, str]:
    return {c["name"]: c["verdict"] for c in comparison["checks"]}


# --------------------------------------------------------------------------- verdicts


def test_identical_measurements_pass():
    old = document(medians=[3.05, 3.10, 3.12])
    new = document(schema=BENCH_SCHEMA, medians=[3.05, 3.10, 3.12])
    result = gate.compare(old, new)
    assert result["passed"] and result["gated"] and result["comparable"]
    assert verdicts(result) == {"latency_median_ms": "pass", "accuracy": "pass"}
    assert gate.failure_message(result) is None


def test_clear_latency_regression_names_metric_old_new_and_limit():
    old = document(median=3.10, medians=[3.08, 3.10, 3.12])
    new = document(median=3.91, medians=[3.89, 3.91, 3.93])
    result = gate.compare(old, new, max_latency_regression=0.05)
    assert not result["passed"]
    assert verdicts(result)["latency_median_ms"] == "regression"
    check = result["checks"][0]
    assert check["tolerance"] == pytest.approx(2 * math.sqrt(0.02**2 + 0.02**2))
    assert check["threshold"] == pytest.approx(3.10 * 1.05 + check["tolerance"])
    assert gate.failure_message(result) == (
        "latency regression: median 3.91 ms vs 3.10 ms baseline (+26.1%), limit +5% + noise 0.06 ms"
    )


def test_slower_median_within_noise_passes():
    # 10% slower, beyond the 5% limit alone, but the repeats wobble by +-0.3 ms on both sides.
    old = document(median=3.0, medians=[2.7, 3.0, 3.3])
    new = document(median=3.3, medians=[3.0, 3.3, 3.6])
    check = gate.latency_check(old["artifact"]["latency"], new["artifact"]["latency"], 0.05)
    assert 3.3 > 3.0 * 1.05  # the relative limit alone would fail it
    assert check["tolerance"] == pytest.approx(2 * math.sqrt(0.3**2 + 0.3**2))
    assert check["verdict"] == "pass"
    assert check["evidence"]["baseline_repeat_medians_ms"] == [2.7, 3.0, 3.3]
    assert check["evidence"]["current_repeat_medians_ms"] == [3.0, 3.3, 3.6]


def test_single_repeat_has_no_noise_allowance():
    check = gate.latency_check(latency(3.0), latency(3.2), 0.05)
    assert check["tolerance"] == 0.0 and check["verdict"] == "regression"


def test_faster_is_never_a_regression():
    result = gate.compare(document(median=3.0), document(median=1.0))
    assert result["passed"]


def test_accuracy_drop_beyond_limit_fails():
    result = gate.compare(document(value=0.865), document(value=0.850), max_accuracy_drop=0.5)
    assert verdicts(result) == {"latency_median_ms": "pass", "accuracy": "regression"}
    check = result["checks"][1]
    assert check["change_points"] == pytest.approx(-1.5)
    assert check["evidence"]["baseline"]["ci95"] and check["evidence"]["current"]["n"] == 200
    assert gate.failure_message(result) == "accuracy regression: 85.00% vs 86.50% baseline (-1.50 pt), limit -0.5 pt"


def test_accuracy_drop_within_limit_passes():
    result = gate.compare(document(value=0.865), document(value=0.862), max_accuracy_drop=0.5)
    assert result["passed"]


def test_cosine_limit_is_in_points_times_100():
    # --max-accuracy-drop 0.5 allows 0.005 of cosine_to_baseline.
    old = document(metric="cosine_to_baseline", value=0.992)
    assert gate.compare(old, document(metric="cosine_to_baseline", value=0.988))["passed"]
    failed = gate.compare(old, document(metric="cosine_to_baseline", value=0.986))
    assert verdicts(failed)["cosine_to_baseline"] == "regression"
    assert "cosine_to_baseline regression: 0.9860 vs 0.9920 baseline (-0.60 pt)" in gate.failure_message(failed)


@pytest.mark.parametrize("new_value, verdict", [(29.6, "pass"), (29.4, "regression")])
def test_bleu_is_its_own_points(new_value, verdict):
    """BLEU is on a 0-100 scale already: 0.5 points of budget is 0.5 BLEU, not 0.005."""
    result = gate.compare(document(metric="bleu", value=30.0), document(metric="bleu", value=new_value),
                          max_accuracy_drop=0.5)
    check = result["checks"][1]
    assert check["verdict"] == verdict and check["change_points"] == pytest.approx(new_value - 30.0)
    assert check["threshold"] == pytest.approx(29.5)


def test_both_failures_in_one_line():
    result = gate.compare(document(median=3.0, value=0.9), document(median=6.0, value=0.8))
    message = gate.failure_message(result)
    assert "\n" not in message and message.startswith("latency regression") and "; accuracy regression" in message


def test_missing_metric_is_skipped_not_failed():
    new = document(metrics={})
    result = gate.compare(document(), new, gated=False)
    assert verdicts(result)["accuracy"] == "skipped" and result["passed"]


def test_gate_refuses_when_the_headline_metric_is_skipped():
    # A gate that compared latency only must not pass: exit 2, saying why and how to fix it.
    new = document(metric="cosine_to_baseline", value=0.999, metrics={})
    new["notes"] = ["cosine_to_baseline and probe_accuracy skipped: the artifact has no reference/ (fp32 baseline outputs)"]
    with pytest.raises(InputError) as info:
        gate.compare(document(metric="cosine_to_baseline", value=0.999), new)
    message = info.value.message
    assert "\n" not in message and message.startswith("cannot gate: the headline metric cosine_to_baseline could not be compared")
    assert "(cosine_to_baseline and probe_accuracy skipped: the artifact has no reference/ (fp32 baseline outputs))" in message
    assert "artifact's own held-out data" in message and "keep the artifact's reference/ folder" in message
    assert "gate passed" not in message


def test_gate_on_latency_alone_when_neither_run_can_have_the_metric():
    # e.g. an embeddings chain of single-pass commands (no fp32 reference): still gated, on latency, and said so
    result = gate.compare(document(metric="cosine_to_baseline", metrics={}),
                          document(metric="cosine_to_baseline", metrics={}))
    assert result["gated"] and result["passed"] and "neither run has it" in result["latency_only"]
    assert verdicts(result) == {"latency_median_ms": "pass", "cosine_to_baseline": "skipped"}
    slow = gate.compare(document(metric="cosine_to_baseline", metrics={}),
                        document(metric="cosine_to_baseline", metrics={}, median=9.0, medians=[9.0] * 5))
    assert not slow["passed"] and verdicts(slow)["latency_median_ms"] == "regression"


def test_gate_refuses_when_the_baseline_lacks_the_headline_metric():
    with pytest.raises(InputError) as info:
        gate.compare(document(metrics={}), document())
    message = info.value.message
    assert message.startswith("cannot gate: the headline metric accuracy could not be compared (the baseline has no accuracy)")
    assert "gate against a baseline that has accuracy" in message


def test_gate_refuses_without_notes_too():
    with pytest.raises(InputError, match=r"could not be compared \(this run has no accuracy\)"):
        gate.compare(document(), document(metrics={}))


# --------------------------------------------------------------------------- like with like


def test_host_mismatch_is_refused_with_the_differing_fields():
    other = {**HOST, "cores_usable": 8, "versions": {**HOST["versions"], "onnxruntime": "1.20.0"}}
    with pytest.raises(InputError) as info:
        gate.compare(document(), document(host=other))
    message = info.value.message
    assert info.value.exit_code == 2 and "\n" not in message
    assert "cores_usable 2 in the baseline vs 8 here" in message and "onnxruntime version '1.32.0' in the baseline vs '1.20.0' here" in message
    assert "--allow-host-mismatch" in message


def test_host_mismatch_allowed_with_flag():
    other = {**HOST, "cpu_model": "AMD EPYC 9654"}
    result = gate.compare(document(), document(host=other), allow_host_mismatch=True)
    assert result["comparable"] and result["host_mismatch_allowed"] and result["passed"]
    assert result["host_mismatch"] == [{"field": "cpu_model", "baseline": HOST["cpu_model"], "current": "AMD EPYC 9654"}]


def test_settings_mismatch_refused_even_with_allow_host_mismatch():
    with pytest.raises(InputError) as info:
        gate.compare(document(threads=4), document(threads=2), allow_host_mismatch=True)
    message = info.value.message
    assert "threads 4 in the baseline vs 2 here" in message and "pass --threads 4" in message
    assert "--allow-host-mismatch does not cover settings" in message


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (dict(seed=1), dict(seed=0), "pass --seed 1"),
        (dict(rows=200), dict(rows=30), "heldout.rows 200 in the baseline vs 30 here"),
        (dict(source=SOURCE), dict(source=SOURCE.replace("test.jsonl", "other.jsonl")), "heldout.source"),
    ],
)
def test_settings_mismatch_names_the_flag(old, new, expected):
    with pytest.raises(InputError) as info:
        gate.check_comparable(document(**old), document(**new))
    assert expected in info.value.message
    if "heldout" in expected:
        assert "--data/--limit" in info.value.message


def test_mode_and_batch_mismatch_refused():
    old = document()
    old["settings"].update(mode="fixed", batch=8)
    with pytest.raises(InputError, match="mode 'fixed' in the baseline vs 'real' here.*batch 8 in the baseline vs 1 here"):
        gate.check_comparable(old, document())


def test_heldout_identity_ignores_the_directory():
    moved = SOURCE.replace("/ci/work/", "/home/me/checkout/")
    assert gate.settings_mismatches(document()["settings"], document(source=moved)["settings"]) == []
    assert gate.heldout_identity({"source": moved, "rows": 200})["source"].startswith("test.jsonl (text='text'")


def test_row_id_hashes_compared_when_both_have_them():
    old, new = document(), document()
    old["settings"]["heldout"]["row_ids_sha256"] = "aaaa"
    new["settings"]["heldout"]["row_ids_sha256"] = "bbbb"
    assert [d["field"] for d in gate.settings_mismatches(old["settings"], new["settings"])] == ["heldout.row_ids"]
    del old["settings"]["heldout"]["row_ids_sha256"]  # a report.json has none: not compared
    assert gate.settings_mismatches(old["settings"], new["settings"]) == []


def test_informative_comparison_never_raises():
    result = gate.compare(document(threads=4, median=1.0), document(host={**HOST, "cores_usable": 16}, median=9.0), gated=False)
    assert not result["gated"] and not result["comparable"]
    assert "threads 4 in the baseline vs 2 here" in result["reason"] and "--allow-host-mismatch" in result["reason"]
    assert verdicts(result)["latency_median_ms"] == "regression" and not result["passed"]


# --------------------------------------------------------------------------- documents and parsing


def test_unknown_schema_refused():
    with pytest.raises(InputError, match="unknown schema 'xformopt.report/9'") as info:
        gate.check_document(document(schema="xformopt.report/9"), "baseline b.json")
    assert info.value.exit_code == 2


@pytest.mark.parametrize("mutate", [
    lambda d: d.pop("artifact"),
    lambda d: d["artifact"]["latency"].pop("median_ms"),
    lambda d: d["artifact"]["latency"].update(median_ms="fast"),
    lambda d: (d.pop("host"), d.pop("host_fingerprint")),
])
def test_incomplete_documents_refused(mutate):
    doc = document()
    mutate(doc)
    with pytest.raises(InputError):
        gate.check_document(doc, "baseline b.json")


def test_load_baseline_errors(tmp_path):
    with pytest.raises(InputError, match="baseline not found"):
        gate.load_baseline(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema": ')
    with pytest.raises(InputError, match="not valid JSON"):
        gate.load_baseline(broken)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(document(schema=BENCH_SCHEMA)))
    assert gate.load_baseline(good)["schema"] == BENCH_SCHEMA


@pytest.mark.parametrize(("text", "value"), [("5%", 0.05), ("0.05", 0.05), (" 2.5 % ", 0.025), ("0", 0.0), ("0%", 0.0), ("1", 1.0), ("150%", 1.5)])
def test_parse_fraction(text, value):
    assert gate.parse_fraction(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["abc", "", "%", "-5%", "-0.1", "5", "nan", "inf%"])
def test_parse_fraction_rejects(text):
    with pytest.raises(InputError) as info:
        gate.parse_fraction(text)
    assert info.value.exit_code == 2 and "--max-latency-regression" in info.value.message


# --------------------------------------------------------------------------- JUnit


def test_junit_one_testcase_per_check_and_failure_on_regression():
    result = gate.compare(document(median=3.10, medians=[3.1]), document(median=3.91, medians=[3.91]))
    root = ET.fromstring(junit_xml(result, artifact="minilm", properties={"host_fingerprint": "abc"}))
    assert root.tag == "testsuite" and root.get("name") == "xformopt.bench"
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == ("2", "1", "0", "0")
    cases = root.findall("testcase")
    assert [c.get("name") for c in cases] == ["latency_median_ms", "accuracy"]
    assert all(c.get("classname") == "xformopt.bench.minilm" for c in cases)
    failure = cases[0].find("failure")
    assert failure is not None and failure.get("message").startswith("latency regression: median 3.91 ms vs 3.10 ms")
    assert json.loads(failure.text)["threshold"] == pytest.approx(3.10 * 1.05)
    assert cases[1].find("failure") is None and cases[1].find("skipped") is None
    props = {p.get("name"): p.get("value") for p in root.find("properties")}
    assert props["gated"] == "true" and props["host_fingerprint"] == "abc"


def test_junit_informative_and_skipped_checks_are_skipped():
    informative = gate.compare(document(median=1.0), document(median=9.0), gated=False)
    root = ET.fromstring(junit_xml(informative))
    assert root.get("failures") == "0" and root.get("skipped") == "2"
    assert all(case.find("skipped") is not None for case in root.findall("testcase"))

    # A gated comparison with a skipped check (compare refuses to gate one whose headline metric is
    # skipped, so it is built from the informative one): the check is <skipped>, nothing fails.
    missing = {**gate.compare(document(), document(metrics={}), gated=False), "gated": True}
    root = ET.fromstring(junit_xml(missing))
    assert (root.get("failures"), root.get("skipped")) == ("0", "1")
    assert root.findall("testcase")[1].find("skipped").get("message").startswith("accuracy skipped")


def test_junit_escapes_markup_in_messages():
    result = gate.compare(document(), document())
    result["checks"][0]["message"] = 'a <b> & "c"'
    result["checks"][0]["verdict"] = "regression"
    root = ET.fromstring(junit_xml(result))
    assert root.find("testcase/failure").get("message") == 'a <b> & "c"'


# --------------------------------------------------------------------------- numbers no measurement gives (issue 21)


def _refusal(doc) -> str:
    with pytest.raises(InputError) as info:
        gate.check_document(doc, "baseline b.json")
    assert info.value.exit_code == 2 and "\n" not in info.value.message
    return info.value.message


@pytest.mark.parametrize("metric, value, ci, fragment", [
    ("accuracy", 0.8, [0.9, 0.7], "artifact.metrics.accuracy.ci95 is [0.9, 0.7]: its low end is above its high end"),
    ("accuracy", 1.2, None, "accuracy.value is 1.2, outside the 0 to 1"),
    ("accuracy", -0.1, None, "accuracy.value is -0.1"),
    ("macro_f1", 0.5, [0.4, 1.3], "macro_f1.ci95[1] is 1.3"),
    ("cosine_to_baseline", -1.5, None, "cosine_to_baseline.value is -1.5, outside the -1 to 1"),
    ("perplexity", 0.5, [0.4, 0.6], "perplexity.value is 0.5, outside the 1 to inf"),
], ids=["reversed-ci95", "accuracy-above-1", "negative-accuracy", "ci-above-1", "cosine-below-minus-1", "perplexity-below-1"])
def test_metrics_outside_what_they_can_take_are_refused(metric, value, ci, fragment):
    doc = document(metric=metric, metrics={metric: {"value": value, "n": 200, **({"ci95": ci} if ci else {})}})
    assert fragment in _refusal(doc)


@pytest.mark.parametrize("metric, value, ci", [
    ("accuracy", 0.0, [0.0, 0.02]), ("accuracy", 1.0, [0.98, 1.0]), ("cosine_to_baseline", -0.3, [-0.4, -0.2]),
    ("perplexity", 12.5, [11.0, 14.0]), ("perplexity", 1.0 - 1e-9, [1.0 - 1e-9, 1.0]),  # float rounding at a bound
    ("my_own_score", 250.0, [200.0, 300.0]),  # no task reports it: unbounded, only the ci order is checked
])
def test_metrics_at_their_bounds_are_accepted(metric, value, ci):
    doc = document(metric=metric, metrics={metric: {"value": value, "n": 200, "ci95": ci}})
    assert gate.check_document(doc, "baseline b.json") is doc


@pytest.mark.parametrize("change, fragment", [
    (dict(median_ms=4.0, p90_ms=3.0), "median_ms 4.0 above p90_ms 3.0"),
    (dict(p99_ms=1.0), "p90_ms 4.65 above p99_ms 1.0"),
    (dict(min_ms=9.0), "min_ms 9.0 above median_ms"),
    (dict(n=0), "latency.n is 0"),
    (dict(p90_ms=-1.0), "p90_ms is -1.0, not a non-negative number"),
])
def test_latency_numbers_out_of_order_are_refused(change, fragment):
    doc = document()
    doc["artifact"]["latency"].update(change)
    assert fragment in _refusal(doc)


def test_a_stage_latency_out_of_order_is_refused_too():
    doc = document()
    doc["stages"] = [{"name": "export", "latency": {**latency(3.0), "p90_ms": 2.0}}]
    assert "stages[0].latency has median_ms 3.0 above p90_ms 2.0" in _refusal(doc)


def test_a_baseline_with_a_key_given_twice_is_refused(tmp_path):
    """json.loads keeps the last of two "median_ms" silently; a gate must not pick one for the user."""
    text = json.dumps(document())
    doubled = text.replace('"median_ms": 3.1,', '"median_ms": 3.1, "median_ms": 0.1,', 1)
    assert doubled != text
    baseline = tmp_path / "b.json"
    baseline.write_text(doubled)
    with pytest.raises(InputError) as info:
        gate.load_baseline(baseline)
    assert info.value.message.startswith(f"{baseline}: key 'median_ms' is given twice in one object")
    baseline.write_text(text)
    assert gate.load_baseline(baseline)["artifact"]["latency"]["median_ms"] == 3.1
