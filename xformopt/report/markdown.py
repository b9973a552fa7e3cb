"""GitHub-flavoured Markdown of a report, fit for a pull-request comment."""

from __future__ import annotations

from collections.abc import Iterable

from xformopt.profiling.render import summary_lines
from xformopt.report.cells import (
    DASH,
    artifact_text,
    fixed_rows,
    fused_text,
    fusion_choice,
    generation_rows,
    graph_rows,
    int8_text,
    memory_rows,
    memory_text,
    metric_label,
    metric_notes,
    model_call_rows,
    prune_shape_text,
    rows_for_display,
    settings_text,
    target_warning,
    throughput_rows,
)
from xformopt.report.types import Report


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|")


def _md_table(header: list[str], body: list[list[str]], left: Iterable[int] = (0,)) -> list[str]:
    left = set(left)
    lines = [
        "| " + " | ".join(_md_escape(h) for h in header) + " |",
        "|" + "|".join(":---" if i in left else "---:" for i in range(len(header))) + "|",
    ]
    lines += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in body]
    return lines


def _profile_lines(profile: dict | None) -> list[str]:
    """The top lines of the final stage's profile (report["profile"]), or why there is none."""
    if not profile:
        return []
    title = f"#### Where the time goes ({profile.get('stage', 'final stage')}, ONNX Runtime's profiler)"
    if "error" in profile:
        return [title, "", f"- not profiled: {profile['error']}", ""]

    return [title, "", *summary_lines(profile), ""]


def _shape_search_lines(searched: dict | None) -> list[str]:
    """What the shape search tried (report["shape_search"], xformopt/recipe_search/shapes.py) and why it kept one."""
    if not searched:
        return []
    v = searched["validation"]
    lines = [f"#### Prune shape chosen for this task (budget {searched['allowed_points']:.2f} points on "
             f"{v['rows']} validation rows, fp32 {v['fp32_metric']:.4f})", ""]
    body = []
    for t in searched["tried"]:
        shape = prune_shape_text(t["shape"], " × ")
        if t.get("resolved"):  # a relative shape: what it meant for this model, and its share of the model's FLOPs
            shape += f" = {prune_shape_text(t['resolved'], ' × ')} ({t['flops_share_of_teacher']:.0%} FLOPs)"
        body.append([shape, f"{t['distill_minutes']:g}" if t.get("distill_minutes") else "-",
                     f"{t['metric']:.4f}" if "metric" in t else "-",
                     f"{t['drop_points']:+.2f}" if "drop_points" in t else "-",
                     "{:+.2f} to {:+.2f}".format(*t["drop_ci95"]) if t.get("drop_ci95") else "-",
                     f"{t['latency_ms']:.2f}" if "latency_ms" in t else "-",
                     "kept" if t.get("kept") else (t.get("why") or t.get("error") or t.get("status", ""))[:80]])
    lines += _md_table(["layers × heads × FFN × hidden", "distill min", "validation", "drop (pt)", "95% interval",
                        "ms (b=1)", ""], body, left=(0, 6))
    return [*lines, "", f"- kept: {searched['why']} ({searched['seconds'] / 60:.1f} min)", ""]


def _headline_lines(report: Report, images: set[str]) -> list[str]:
    """The title, the stage table and the notes under it: what a reader sees without opening anything."""
    metric = report["headline_metric"]
    model = report.get("model") or {}
    host = report.get("host") or {}
    lines = [
        f"### xformopt: {model.get('source', '?')} \u2192 `{report.get('target', '?')}`",
        "",
        f"{model.get('task', '?')}{' (' + model['model_type'] + ')' if model.get('model_type') else ''} \u00b7 "
        f"headline metric: {metric_label(metric).lower()} \u00b7 latency at {settings_text(report)} \u00b7 "
        f"{host.get('cpu_model', 'unknown CPU')}.",
        "",
    ]
    warning = target_warning(report)
    if warning:
        lines += ["> [!WARNING]", f"> {warning}", ""]
    header, body = rows_for_display(report)
    lines += _md_table(header, body)
    lines.append("")
    lines += [f"{note}." for note in metric_notes(report)] + ([""] if metric_notes(report) else [])
    artifact = artifact_text(report, markup="md")
    if artifact:
        lines += [artifact, ""]
    if memory_text(report):
        lines += [f"{memory_text(report)}.", ""]
    if "accuracy_latency.png" in images:
        lines += [f"![{metric_label(metric)} vs latency per stage](accuracy_latency.png)", ""]
    return lines


def _graph_details(report: Report) -> list[str]:
    """Per ONNX stage: what was fused, which GEMMs run in INT8 (or 4 bits) and which stayed float."""
    rows = graph_rows(report)
    if not (rows and any(r["graph"] for r in rows)):
        return []
    details = ["#### Graph", ""]
    for row in rows:
        graph = row["graph"]
        fused = fused_text(graph.get("fused_ops"), abbreviate=False)
        facts = ["no fusions" if fused == DASH else f"fused {fused}"]
        if "int8_gemms" in graph or "matmulnbits" in graph:
            floats = graph.get("float_gemms") or []
            facts.append(f"{'MatMulNBits' if 'matmulnbits' in graph else 'INT8 GEMMs'} {int8_text(graph)}")
            facts.append("float GEMMs: " + (", ".join(f"`{g}`" for g in floats) if floats else "none"))
        details.append(f"- `{row['name']}`: " + "; ".join(facts))
    choice = fusion_choice(report)
    if choice:
        details.append(f"- fusion kept `{choice[0]}`: {choice[1]}")
    details.append("")
    return details


def _measured_details(report: Report, images: set[str]) -> list[str]:
    """The optional measurements' tables: the model call alone, fixed shapes, generation, throughput, memory."""
    details: list[str] = []
    if report.get("model_call"):
        h, b = model_call_rows(report)
        details += ["#### The model call alone (texts tokenized beforehand)", "", *_md_table(h, b, left=(0,)), ""]
    if report.get("fixed"):
        h, b = fixed_rows(report, speedup_label=None)
        details += ["#### Fixed shapes: median latency (ms)", "", *_md_table(h, b, left=()), ""]
        if "latency_seq.png" in images:
            details += ["![Median latency vs sequence length](latency_seq.png)", ""]
    if report.get("generation"):
        h, b = generation_rows(report)
        details += ["#### Generation (greedy, batch 1, with and without the KV cache)", "", *_md_table(h, b, left=(2, 3)), ""]
    if report.get("throughput"):
        h, b = throughput_rows(report)
        details += ["#### Throughput", "", *_md_table(h, b, left=(0, 4)), ""]
    h, b = memory_rows(report)
    if b:
        details += ["#### Peak memory (resident set)", "", *_md_table(h, b, left=(0, 4)), ""]
    return details


def _host_details(report: Report) -> list[str]:
    """The machine that measured: CPU, flags, library versions, OS and the timing fingerprint."""
    host = report.get("host") or {}
    if not host:
        return []
    versions = host.get("versions") or {}
    details = [
        "#### Host",
        "",
        f"- CPU: {host.get('cpu_model', '?')} ({host.get('machine', '?')}), "
        f"{host.get('cores_usable', '?')} of {host.get('cores_logical', '?')} cores usable"
        + (f", {host['memory_total_gb']} GB" if host.get("memory_total_gb") else ""),
    ]
    if host.get("cpu_flags"):
        details.append(f"- flags: {', '.join(host['cpu_flags'])}")
    if versions:
        details.append("- " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    if host.get("os"):
        details.append(f"- {host['os']}, Python {host.get('python', '?')}")
    if report.get("host_fingerprint"):
        details.append(f"- fingerprint `{report['host_fingerprint']}`")
    details.append("")
    return details


def _settings_details(report: Report) -> list[str]:
    """How the stages were timed and scored: threads, rounds, repeats, seed, the held-out rows."""
    s = report.get("settings") or {}
    if not s:
        return []
    heldout = s.get("heldout") or {}
    details = ["#### Settings", ""]
    details.append(
        f"- latency: mode {s.get('mode', 'real')}, batch {s.get('batch', 1)}, {s.get('threads', '?')} threads, "
        f"{s.get('rounds', '?')} interleaved rounds, warmup {s.get('warmup', '?')}, "
        f"artifact timed alone in {s.get('repeats', '?')} repeats, seed {s.get('seed', '?')}"
    )
    if s.get("thread_pools"):
        details.append(f"- thread pools: {s['thread_pools']}")
    if heldout:
        details.append(f"- held-out: {heldout.get('rows', '?')} rows from `{heldout.get('source', '?')}`")
    if report.get("created"):
        details.append(f"- created {report['created']}, schema `{report.get('schema', '?')}`")
    details.append("")
    return details


def markdown(report: Report, images: Iterable[str] = ()) -> str:
    """GitHub-flavoured Markdown for a pull-request comment.

    The headline table comes first; graph facts, fixed shapes, throughput, host and settings sit in
    a collapsed ``<details>`` block. ``images`` names the plot files (relative to report.md) that
    exist and may be embedded."""
    images = set(images)
    lines = _headline_lines(report, images)
    lines += _profile_lines(report.get("profile"))
    lines += _shape_search_lines(report.get("shape_search"))
    details = [*_graph_details(report), *_measured_details(report, images), *_host_details(report),
               *_settings_details(report)]
    if details:
        lines += ["<details>", "<summary>Graph, memory, host, settings" + (", fixed shapes" if report.get("fixed") else "")
                  + (", model call" if report.get("model_call") else "")
                  + (", throughput" if report.get("throughput") else "") + "</summary>", "", *details, "</details>"]
    return "\n".join(lines).rstrip("\n") + "\n"
