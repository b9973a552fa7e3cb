"""The regression gate: is a new measurement of an artifact worse than a baseline, beyond noise?

Pure logic on plain dicts (the only I/O is reading a baseline JSON file), so every decision is
testable on hand-made documents. The baseline is either a ``report.json`` written by
``xformopt optimize`` (schema ``xformopt.report/1``) or a bench document written by
``xformopt bench -o`` (schema ``xformopt.bench/1``): both carry ``settings``, ``host``,
``host_fingerprint``, ``headline_metric`` and an ``artifact`` section of the same shape
(``{stage, latency: <solo_repeats dict>, metrics}``).

Like with like
--------------
Two timings are only compared when they measure the same thing on the same kind of machine:

- settings (mode, batch, threads, seed, held-out rows) must match, always: a different thread
  count or other rows is a different experiment, and no flag overrides that. The message names
  the flag that makes them match (``--threads``, ``--seed``, ``--data``/``--limit``/column flags).
- the host fingerprint (CPU model, machine, usable cores, onnxruntime and torch versions) must
  match unless ``--allow-host-mismatch`` is given.

Latency: the noise rule
-----------------------
The artifact is timed alone in R repeats of N batch-1 calls; each repeat has a median, the
headline figure is the median of those, and ``spread_ms`` is half the range of the repeat
medians: how far two honest measurements of the same build land apart on this host. A latency
regression is declared iff::

    new_median > old_median * (1 + max_latency_regression) + noise
    noise      = 2 * sqrt(old_spread**2 + new_spread**2)

The two spreads are independent, so they add in quadrature (root of the sum of squares); the
factor 2 is a safety margin of about two "standard" wobbles, so a rerun of an unchanged build on
a quiet host passes and a real slow-down of more than the limit plus the noise fails. With
``repeats: 1`` the spread is 0 and only the relative limit applies; use 3 or more repeats in CI.

Accuracy
--------
The headline metric (``accuracy`` for classification, ``cosine_to_baseline`` for embeddings) is
compared in points: ``points = 100 * value``, so ``--max-accuracy-drop 0.5`` allows 0.5
percentage points of accuracy, or 0.005 of cosine; a metric already on a 0-100 scale (BLEU, chrF:
its task declares ``bounds`` up to 100) is its own points, so 0.5 allows 0.5 BLEU. A regression iff
``scale * (old - new) > max_accuracy_drop``. Both runs score the same rows with the same model
file, so the metric is (near) deterministic; the confidence intervals are reported as evidence
but do not widen the limit. A gate (``--baseline``) whose headline metric cannot be compared
(one side lacks it, e.g. an embeddings artifact without ``reference/``, or other ``--data``) is
refused with an InputError (exit 2) rather than passed on latency alone.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from xformopt import accuracy_budget
from xformopt.artifact import load_json
from xformopt.errors import InputError
from xformopt.measure.host import (
    FINGERPRINT_FIELDS,
    FINGERPRINT_VERSIONS,
    host_fingerprint,
)
from xformopt.report.cells import METRICS, PERCENT_METRICS
from xformopt.report.schema import KNOWN_SCHEMAS, check_numbers

LATENCY_CHECK = "latency_median_ms"
DEFAULT_MAX_LATENCY_REGRESSION = 0.05
DEFAULT_MAX_ACCURACY_DROP = 0.5  # points of the headline metric x 100
NOISE_FACTOR = 2.0

PASS, REGRESSION, SKIPPED = "pass", "regression", "skipped"


# --------------------------------------------------------------------------- parsing


def parse_fraction(text: str | float, flag: str = "--max-latency-regression") -> float:
    """``"5%"`` or ``"0.05"`` -> 0.05. A bare number above 1 is refused (did you mean N%?)."""
    raw = str(text).strip()
    percent = raw.endswith("%")
    number = raw[:-1].strip() if percent else raw
    try:
        value = float(number)
    except ValueError:
        raise InputError(f"{flag}: {text!r} is not a number; write it as 5% or 0.05") from None
    if not math.isfinite(value) or value < 0:
        raise InputError(f"{flag}: {text!r} must be a non-negative number, e.g. 5% or 0.05")
    if percent:
        return value / 100
    if value > 1:
        raise InputError(f"{flag}: {text!r} reads as {value * 100:g}%; write {value:g}% or {value / 100:g} if you meant that")
    return value


def format_fraction(value: float) -> str:
    return f"+{value * 100:g}%"


# --------------------------------------------------------------------------- baseline documents


def load_baseline(path: str | Path) -> dict:
    """Read and check a baseline (report.json or bench JSON); every problem is a one-line InputError."""
    hint = "pass a report.json of `xformopt optimize` or a JSON of `xformopt bench -o`"
    doc = load_json(Path(path), missing=f"baseline not found: {path}; {hint}", fix=hint)
    return check_document(doc, f"baseline {path}")


def check_document(doc, origin: str) -> dict:
    """A report or bench document with the sections the gate reads, else a one-line InputError."""
    if not isinstance(doc, dict):
        raise InputError(f"{origin} is not an xformopt report or bench document (not a JSON object)")
    schema = doc.get("schema")
    if schema not in KNOWN_SCHEMAS:
        raise InputError(f"{origin} has unknown schema {schema!r}; expected one of: {', '.join(KNOWN_SCHEMAS)}")
    settings, artifact = doc.get("settings"), doc.get("artifact")
    if not isinstance(settings, dict) or not isinstance(artifact, dict):
        raise InputError(f"{origin} lacks its 'settings' or 'artifact' section; re-create it with the current xformopt")
    latency = artifact.get("latency")
    if not isinstance(latency, dict) or not _number(latency.get("median_ms")):
        raise InputError(f"{origin} has no artifact latency (artifact.latency.median_ms); re-create it with the current xformopt")
    if not isinstance(artifact.get("metrics", {}), dict):
        raise InputError(f"{origin}: artifact.metrics is not an object")
    if not isinstance(doc.get("host"), dict) and not isinstance(doc.get("host_fingerprint"), str):
        raise InputError(f"{origin} records no host (host / host_fingerprint); re-create it with the current xformopt")

    check_numbers(doc, origin)  # every documented number finite and typed, not only those read below
    return doc


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# --------------------------------------------------------------------------- like with like

_SOURCE_NAME = re.compile(r"^(?P<name>.*?) \((?P<rest>text=.*)$", re.S)


def heldout_identity(heldout: dict | None) -> dict:
    """What makes two held-out sets the same rows: the file's name (not its directory, which differs
    between checkouts and CI runners), the columns, the sample note (limit, seed) and the row count.
    A bench document also records a hash of the row ids, compared when both sides have it."""
    heldout = heldout or {}
    source = str(heldout.get("source", ""))
    match = _SOURCE_NAME.match(source)
    if match:
        name = re.split(r"[/\\]", match.group("name").rstrip("/\\"))[-1]
        source = f"{name} ({match.group('rest')}"
    ident = {"source": source, "rows": heldout.get("rows")}
    if heldout.get("row_ids_sha256"):
        ident["row_ids_sha256"] = heldout["row_ids_sha256"]
    return ident


def settings_mismatches(old: dict, new: dict) -> list[dict]:
    """Differences that make two measurements different experiments; each names the flag to change."""
    out = []
    for key, hint in (
        ("mode", "bench times mode 'real'; use a report.json of `xformopt optimize` or a JSON of `xformopt bench` as the baseline"),
        ("batch", "bench times batch 1; use a report.json of `xformopt optimize` or a JSON of `xformopt bench` as the baseline"),
        ("threads", "pass --threads {old}"),
        ("seed", "pass --seed {old}"),
    ):
        if old.get(key) != new.get(key):
            out.append({"field": key, "baseline": old.get(key), "current": new.get(key),
                        "hint": hint.format(old=old.get(key))})
    a, b = heldout_identity(old.get("heldout")), heldout_identity(new.get("heldout"))
    hint = "pass --data/--limit (and the column flags) that select the baseline's held-out rows"
    if a["rows"] != b["rows"]:
        out.append({"field": "heldout.rows", "baseline": a["rows"], "current": b["rows"], "hint": hint})
    elif a["source"] != b["source"]:
        out.append({"field": "heldout.source", "baseline": a["source"], "current": b["source"], "hint": hint})
    elif "row_ids_sha256" in a and "row_ids_sha256" in b and a["row_ids_sha256"] != b["row_ids_sha256"]:
        out.append({"field": "heldout.row_ids", "baseline": a["row_ids_sha256"], "current": b["row_ids_sha256"], "hint": hint})
    return out


def host_mismatches(old: dict, new: dict) -> list[dict]:
    """Host fields that differ between two documents (empty when the fingerprints match)."""
    old_fp = old.get("host_fingerprint") or host_fingerprint(old.get("host") or {})
    new_fp = new.get("host_fingerprint") or host_fingerprint(new.get("host") or {})
    if old_fp == new_fp:
        return []
    old_host, new_host = old.get("host") or {}, new.get("host") or {}
    out = []
    for key in FINGERPRINT_FIELDS:
        if old_host.get(key) != new_host.get(key):
            out.append({"field": key, "baseline": old_host.get(key), "current": new_host.get(key)})
    for lib in FINGERPRINT_VERSIONS:
        a, b = (old_host.get("versions") or {}).get(lib), (new_host.get("versions") or {}).get(lib)
        if a != b:
            out.append({"field": f"{lib} version", "baseline": a, "current": b})
    return out or [{"field": "host_fingerprint", "baseline": old_fp, "current": new_fp}]


def _describe(diffs: list[dict]) -> str:
    return ", ".join(f"{d['field']} {d['baseline']!r} in the baseline vs {d['current']!r} here" for d in diffs)


def comparability(baseline: dict, current: dict, allow_host_mismatch: bool = False) -> dict:
    """Settings and host differences, and the one-line reason they refuse the comparison (or None)."""
    settings = settings_mismatches(baseline.get("settings") or {}, current.get("settings") or {})
    host = host_mismatches(baseline, current)
    reasons = []
    if settings:
        hints = "; ".join(dict.fromkeys(d["hint"] for d in settings))
        reasons.append(f"baseline settings differ ({_describe(settings)}): {hints}"
                       + (" (--allow-host-mismatch does not cover settings)" if allow_host_mismatch else ""))
    if host and not allow_host_mismatch:
        reasons.append(f"baseline was measured on another host ({_describe(host)}); "
                       "bench on the baseline's host or pass --allow-host-mismatch")
    return {
        "comparable": not reasons,
        "settings_mismatch": settings,
        "host_mismatch": host,
        "host_mismatch_allowed": bool(host) and allow_host_mismatch,
        "reason": "; ".join(reasons) or None,
    }


def check_comparable(baseline: dict, current: dict, allow_host_mismatch: bool = False) -> dict:
    """``comparability`` that raises the refusal as an InputError (exit 2); call it before timing."""
    verdict = comparability(baseline, current, allow_host_mismatch)
    if not verdict["comparable"]:
        raise InputError(f"not comparable: {verdict['reason']}")
    return verdict


# --------------------------------------------------------------------------- checks


def latency_noise(old_spread: float, new_spread: float) -> float:
    """Noise allowance in ms: 2 * sqrt(old_spread^2 + new_spread^2) (see the module docstring)."""
    return NOISE_FACTOR * math.sqrt(old_spread**2 + new_spread**2)


def latency_check(old: dict, new: dict, max_regression: float) -> dict:
    """Regression iff new_median > old_median * (1 + max_regression) + noise."""
    old_med, new_med = float(old["median_ms"]), float(new["median_ms"])
    old_spread = float(old.get("spread_ms") or 0.0)
    new_spread = float(new.get("spread_ms") or 0.0)
    noise = latency_noise(old_spread, new_spread)
    threshold = old_med * (1 + max_regression) + noise
    change = new_med - old_med
    change_pct = 100 * change / old_med if old_med > 0 else math.inf
    regression = new_med > threshold
    message = (
        f"latency {'regression' if regression else 'ok'}: median {new_med:.2f} ms vs {old_med:.2f} ms baseline "
        f"({change_pct:+.1f}%), limit {format_fraction(max_regression)} + noise {noise:.2f} ms"
    )
    return {
        "name": LATENCY_CHECK,
        "kind": "latency",
        "unit": "ms",
        "baseline": old_med,
        "current": new_med,
        "change": change,
        "change_pct": change_pct,
        "limit": max_regression,
        "tolerance": noise,
        "threshold": threshold,
        "verdict": REGRESSION if regression else PASS,
        "message": message,
        "evidence": {
            "baseline_repeat_medians_ms": list(old.get("repeat_medians_ms") or []),
            "current_repeat_medians_ms": list(new.get("repeat_medians_ms") or []),
            "baseline_spread_ms": old_spread,
            "current_spread_ms": new_spread,
            "rule": "regression iff current > baseline * (1 + limit) + 2 * sqrt(baseline_spread^2 + current_spread^2)",
        },
    }


def _uncertainty(metric: dict) -> dict:
    return {k: metric[k] for k in ("n", "ci95", "stderr") if k in metric}


def points_scale(name: str) -> float:
    """Points per unit of a metric: 100 for a 0-1 score (accuracy, cosine), 1 for one on a 0-100 scale (BLEU)."""
    metric = METRICS.get(name)
    return 1.0 if metric is not None and metric.bounds[1] == 100.0 else 100.0


def metric_check(name: str, old_metrics: dict, new_metrics: dict, max_drop: float | str) -> dict:
    """Regression iff scale * (old - new) > the allowed drop in points (plain; the CIs are evidence only).

    ``max_drop``: points, or a percentage of the baseline's value ('1%', see accuracy_budget)."""
    old, new = (old_metrics or {}).get(name), (new_metrics or {}).get(name)
    relative = isinstance(max_drop, str)
    base = {"name": name, "kind": "metric", "unit": "points", "limit": None if relative else float(max_drop), "tolerance": 0.0,
            **({"limit_relative": max_drop} if relative else {})}
    if not (isinstance(old, dict) and _number(old.get("value"))) or not (isinstance(new, dict) and _number(new.get("value"))):
        missing = "baseline" if not (isinstance(old, dict) and _number(old.get("value"))) else "current run"
        return {
            **base, "baseline": None, "current": None, "change": None, "change_points": None, "threshold": None,
            "verdict": SKIPPED,
            "message": f"{name} skipped: the {missing} has no {name} (baseline-relative metrics need the artifact's own held-out rows)",
            "evidence": {},
        }
    old_v, new_v = float(old["value"]), float(new["value"])
    scale = points_scale(name)
    max_drop_points = accuracy_budget.points(max_drop, scale * old_v)
    base["limit"] = max_drop_points
    change_points = scale * (new_v - old_v)
    regression = -change_points > max_drop_points
    message = (
        f"{name} {'regression' if regression else 'ok'}: {_fmt_metric(name, new_v)} vs {_fmt_metric(name, old_v)} baseline "
        f"({change_points:+.2f} pt), limit -{max_drop_points:g} pt{f' ({max_drop} of the baseline)' if relative else ''}"
    )
    return {
        **base,
        "baseline": old_v,
        "current": new_v,
        "change": new_v - old_v,
        "change_points": change_points,
        "threshold": old_v - max_drop_points / scale,
        "verdict": REGRESSION if regression else PASS,
        "message": message,
        "evidence": {"baseline": _uncertainty(old), "current": _uncertainty(new)},
    }


def _fmt_metric(name: str, value: float) -> str:
    return f"{100 * value:.2f}%" if name in PERCENT_METRICS else f"{value:.4f}"


def compare(
    baseline: dict,
    current: dict,
    *,
    max_latency_regression: float = DEFAULT_MAX_LATENCY_REGRESSION,
    max_accuracy_drop: float | str = DEFAULT_MAX_ACCURACY_DROP,
    allow_host_mismatch: bool = False,
    gated: bool = True,
    baseline_path: str | None = None,
) -> dict:
    """The ``comparison`` section of a bench document.

    ``gated``: a CI gate (``--baseline``). A gated comparison refuses incomparable documents with an
    InputError, and so one whose headline metric could not be compared (a gate that checked only
    latency must not pass as a whole); an informative one (the artifact's own report, no
    ``--baseline``) records why they are not comparable and still lists the checks.
    """
    verdict = comparability(baseline, current, allow_host_mismatch or not gated)
    if gated and not verdict["comparable"]:
        raise InputError(f"not comparable: {verdict['reason']}")
    if not gated:  # informative: say what differs even though nothing is refused
        strict = comparability(baseline, current, False)
        verdict = {**verdict, "comparable": strict["comparable"], "reason": strict["reason"], "host_mismatch_allowed": False}
    headline = current.get("headline_metric") or baseline.get("headline_metric") or "accuracy"
    checks = [
        latency_check(baseline["artifact"]["latency"], current["artifact"]["latency"], max_latency_regression),
        metric_check(headline, baseline["artifact"].get("metrics") or {}, current["artifact"].get("metrics") or {}, max_accuracy_drop),
    ]
    latency_only = None
    if gated and checks[1]["verdict"] == SKIPPED:
        if _has_metric(baseline, headline) or _has_metric(current, headline):
            raise InputError(headline_skipped_message(headline, current))
        # Neither run can have it (e.g. an embeddings chain of export/fuse/quantize: no fp32 reference
        # outputs): refusing would leave such an artifact no gate at all, so latency is gated alone, said so.
        notes = [n for n in current.get("notes") or [] if isinstance(n, str) and headline in n and "skipped" in n]
        latency_only = f"{headline} not gated: neither run has it" + (f" ({notes[0]})" if notes else "")
        checks[1] = {**checks[1], "message": latency_only}
    return {
        "baseline": baseline_path,
        "baseline_schema": baseline.get("schema"),
        "baseline_created": baseline.get("created"),
        "gated": gated,
        **verdict,
        "limits": {"max_latency_regression": max_latency_regression, "max_accuracy_drop_points": checks[1]["limit"],
                   **({"max_accuracy_drop": max_accuracy_drop} if isinstance(max_accuracy_drop, str) else {})},
        "checks": checks,
        **({"latency_only": latency_only} if latency_only else {}),
        "passed": all(c["verdict"] != REGRESSION for c in checks),
    }


def _has_metric(doc: dict, name: str) -> bool:
    return _number(((doc["artifact"].get("metrics") or {}).get(name) or {}).get("value"))


def no_comparison(reason: str) -> dict:
    """The ``comparison`` section when there is nothing to compare with (no --baseline and no
    report.json of the artifact's own): same keys as :func:`compare`, no checks, nothing gated."""
    return {
        "baseline": None, "baseline_schema": None, "baseline_created": None, "gated": False,
        "comparable": False, "settings_mismatch": [], "host_mismatch": [], "host_mismatch_allowed": False,
        "reason": reason, "limits": {}, "checks": [], "passed": True,
    }


def headline_skipped_message(headline: str, current: dict) -> str:
    """One line for a gate whose headline metric could not be compared: why, and how to fix it."""
    current_has = _number(((current["artifact"].get("metrics") or {}).get(headline) or {}).get("value"))
    if current_has:  # the baseline lacks it
        why = f"the baseline has no {headline}"
        fix = (f"gate against a baseline that has {headline}: a report.json of `xformopt optimize` or a JSON of "
               f"`xformopt bench -o` measured on the artifact's own held-out rows")
    else:
        notes = [n for n in current.get("notes") or [] if isinstance(n, str) and headline in n and "skipped" in n]
        why = notes[0] if notes else f"this run has no {headline}"
        fix = ("bench on the artifact's own held-out data (the data its report used; no other --data/--limit) and keep "
               "the artifact's reference/ folder (the fp32 baseline outputs)")
    return f"cannot gate: the headline metric {headline} could not be compared ({why}); {fix}"


def failure_message(comparison: dict) -> str | None:
    """One line naming every failed check (metric, current, baseline, limit), or None when all pass."""
    failed = [c["message"] for c in comparison.get("checks", []) if c["verdict"] == REGRESSION]
    return "; ".join(failed) or None
