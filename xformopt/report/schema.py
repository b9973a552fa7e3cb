"""The report and bench documents' schema (docs/report-schema.md): their versioned names, read by the
report that writes them and the gate that compares them, and the numeric contract checked before a
gate compares anything: a gate that reads ``NaN`` passes everything, so every documented number must
be a finite number of the documented type, not only the few the gate happens to read.
"""

from __future__ import annotations

import math

from xformopt import tasks
from xformopt.errors import InputError

# Versioned: a field is never renamed or removed within a version, so CI jobs that read the JSON keep working.
REPORT_SCHEMA = "xformopt.report/1"  # report.json, written by report/build.py
BENCH_SCHEMA = "xformopt.bench/1"  # `xformopt bench --json`, written by bench/measure.py
KNOWN_SCHEMAS = (REPORT_SCHEMA, BENCH_SCHEMA)

MAX_DEPTH = 64  # documents xformopt writes are under 10 deep; deeper is not one of ours


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def first_non_finite(node, path: str = "", depth: int = 0) -> str | None:
    """The JSON path of the first NaN/Infinity in ``node`` (or of nesting past MAX_DEPTH)."""
    if depth > MAX_DEPTH:
        return f"{path or '(top)'} (nested deeper than {MAX_DEPTH})"
    if isinstance(node, float) and not math.isfinite(node):
        return path or "(top)"
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "comparison":  # a bench document's verdict on an earlier baseline: not measured data
                continue
            if (found := first_non_finite(value, f"{path}.{key}" if path else str(key), depth + 1)) is not None:
                return found
    elif isinstance(node, list):
        for i, value in enumerate(node):
            if (found := first_non_finite(value, f"{path}[{i}]", depth + 1)) is not None:
                return found
    return None


LATENCY_NUMBERS = ("median_ms", "p90_ms", "p99_ms", "mean_ms", "std_ms", "min_ms", "throughput_per_s")
SETTINGS_INTS = ("batch", "threads", "rounds", "warmup", "repeats", "seed")


def _fail(origin: str, path: str, what: str) -> None:
    raise InputError(f"{origin}: {path} {what}; re-create it with the current xformopt (a gate reads only "
                     "finite measured numbers)")


def check_latency(latency, origin: str, path: str, *, artifact: bool = False) -> None:
    if not isinstance(latency, dict):
        _fail(origin, path, "is not an object")
    required = ("median_ms", "spread_ms") if artifact else ("median_ms",)
    for key in required:
        if key not in latency:
            _fail(origin, f"{path}.{key}", "is missing")
    for key in (*LATENCY_NUMBERS, "spread_ms"):
        if key in latency and (not _is_number(latency[key]) or latency[key] < 0):
            _fail(origin, f"{path}.{key}", f"is {latency[key]!r}, not a non-negative number")
    if latency["median_ms"] <= 0:
        _fail(origin, f"{path}.median_ms", f"is {latency['median_ms']!r}, not a positive time")
    for key in ("n", "repeats"):
        if key in latency and (not _is_int(latency[key]) or latency[key] < 0):
            _fail(origin, f"{path}.{key}", f"is {latency[key]!r}, not a whole number")
    if "n" in latency and latency["n"] < 1:
        _fail(origin, f"{path}.n", f"is {latency['n']}, but a latency needs at least one timed call")
    # percentiles of one set of samples (or medians of per-repeat percentiles) cannot be out of order
    order = [key for key in ("min_ms", "median_ms", "p90_ms", "p99_ms") if key in latency]
    for low, high in zip(order, order[1:]):
        if latency[low] > latency[high]:
            _fail(origin, f"{path}", f"has {low} {latency[low]!r} above {high} {latency[high]!r}, which no "
                  "measurement gives")
    medians = latency.get("repeat_medians_ms")
    if medians is not None and (not isinstance(medians, list) or not all(_is_number(m) and m >= 0 for m in medians)):
        _fail(origin, f"{path}.repeat_medians_ms", "is not a list of non-negative numbers")


def check_metrics(metrics, origin: str, path: str) -> None:
    if not isinstance(metrics, dict):
        _fail(origin, path, "is not an object")
    for name, metric in metrics.items():
        where = f"{path}.{name}"
        if not isinstance(metric, dict):
            _fail(origin, where, "is not a metric object ({value, n, ...})")
        if "value" not in metric:
            _fail(origin, f"{where}.value", "is missing")
        if not _is_number(metric["value"]):
            _fail(origin, f"{where}.value", f"is {metric['value']!r}, not a number")
        if "n" in metric and (not _is_int(metric["n"]) or metric["n"] < 0):
            _fail(origin, f"{where}.n", f"is {metric['n']!r}, not a whole number")
        if "stderr" in metric and (not _is_number(metric["stderr"]) or metric["stderr"] < 0):
            _fail(origin, f"{where}.stderr", f"is {metric['stderr']!r}, not a non-negative number")
        ci = metric.get("ci95")
        if ci is not None and not (isinstance(ci, list) and len(ci) == 2 and all(_is_number(c) for c in ci)):
            _fail(origin, f"{where}.ci95", "is not a [low, high] pair of numbers")
        if ci is not None and ci[0] > ci[1]:
            _fail(origin, f"{where}.ci95", f"is {ci!r}: its low end is above its high end")
        low, high = metric_bounds(name)
        for key, value in (("value", metric["value"]), *((f"ci95[{i}]", c) for i, c in enumerate(ci or ()))):
            if not low - _SLACK * max(1.0, abs(low)) <= value <= high + _SLACK * max(1.0, abs(high)):
                _fail(origin, f"{where}.{key}", f"is {value!r}, outside the {low:g} to {high:g} a {name} can take")


_SLACK = 1e-6  # float rounding at a bound (a perplexity of 0.9999999 from an NLL of -1e-7) is not nonsense


def metric_bounds(name: str) -> tuple[float, float]:
    """The values metric NAME can take (xformopt.tasks' Metric.bounds); unbounded when no task reports it."""

    metric = tasks.metric_info().get(name)
    return metric.bounds if metric is not None else (-math.inf, math.inf)


def check_settings(settings, origin: str) -> None:
    if not isinstance(settings, dict):
        _fail(origin, "settings", "is not an object")
    for key in ("mode",):
        if key in settings and not isinstance(settings[key], str):
            _fail(origin, f"settings.{key}", f"is {settings[key]!r}, not a string")
    for key in SETTINGS_INTS:
        if key in settings and settings[key] is not None and not _is_int(settings[key]):
            _fail(origin, f"settings.{key}", f"is {settings[key]!r}, not a whole number")
        # a count below its least meaningful value is no measurement (review: rounds -3 passed the gate)
        least = 0 if key in ("warmup", "seed") else 1
        if key in settings and _is_int(settings[key]) and not least <= settings[key] <= 2**63 - 1:
            _fail(origin, f"settings.{key}", f"is {settings[key]}, out of range (at least {least})")
    heldout = settings.get("heldout")
    if heldout is None:
        _fail(origin, "settings.heldout", "is missing")
    if not isinstance(heldout, dict):
        _fail(origin, "settings.heldout", f"is {heldout!r}, not an object {{source, rows}}")
    if "rows" in heldout and (not _is_int(heldout["rows"]) or heldout["rows"] < 0):
        _fail(origin, "settings.heldout.rows", f"is {heldout['rows']!r}, not a whole number")
    for key in ("source", "row_ids_sha256"):
        if key in heldout and not isinstance(heldout[key], str):
            _fail(origin, f"settings.heldout.{key}", f"is {heldout[key]!r}, not a string")


def check_numbers(doc: dict, origin: str) -> None:
    """Every documented number finite and of its type; raises a one-line InputError naming the field."""
    if (where := first_non_finite(doc)) is not None:
        _fail(origin, where, "is not a finite number (NaN or Infinity)")
    check_settings(doc.get("settings"), origin)
    artifact = doc.get("artifact")
    if not isinstance(artifact, dict):
        _fail(origin, "artifact", "is missing or not an object")
    check_latency(artifact.get("latency"), origin, "artifact.latency", artifact=True)
    check_metrics(artifact.get("metrics", {}), origin, "artifact.metrics")
    if "headline_metric" in doc and not isinstance(doc["headline_metric"], str):
        _fail(origin, "headline_metric", f"is {doc['headline_metric']!r}, not a string")
    for key in ("host_fingerprint", "created"):
        if key in doc and not isinstance(doc[key], str):
            _fail(origin, key, f"is {doc[key]!r}, not a string")
    if "host" in doc and not isinstance(doc["host"], dict):
        _fail(origin, "host", "is not an object")
    stages = doc.get("stages")
    if stages is not None:
        if not isinstance(stages, list):
            _fail(origin, "stages", "is not a list")
        for i, stage in enumerate(stages):
            if not isinstance(stage, dict):
                _fail(origin, f"stages[{i}]", "is not an object")
            if "latency" in stage:
                check_latency(stage["latency"], origin, f"stages[{i}].latency")
            if "metrics" in stage:
                check_metrics(stage["metrics"], origin, f"stages[{i}].metrics")
