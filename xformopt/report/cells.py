"""Cell text for every report view: numbers, metrics with CIs and deltas, graph facts, captions.

Shared by the console view, the Markdown and the plots, so a figure reads the same everywhere.
"""

from __future__ import annotations

import math

from xformopt.report.generation import rows
from xformopt.report.types import Report, StageRow
from xformopt.tasks import TASKS, headlines, metric_info

# Labels, scales and directions come from the tasks (xformopt/tasks: each declares its metrics).
METRICS = metric_info()
METRIC_LABELS = {name: m.label for name, m in METRICS.items()}
# Shown next to the headline metric when a stage has them, in this order.
SECONDARY_METRICS = tuple(name for name in METRICS if name not in headlines())
PERCENT_METRICS = frozenset(name for name, m in METRICS.items() if m.percent)
# Metrics measured against the baseline's own outputs: on the baseline row they are 1 by definition.
RELATIVE_METRICS = frozenset(name for name, m in METRICS.items() if m.relative)
LOWER_IS_BETTER = frozenset(name for name, m in METRICS.items() if m.lower_is_better)

FUSED_ABBREVIATIONS = {
    "Attention": "Attn",
    "MultiHeadAttention": "MHA",
    "EmbedLayerNormalization": "EmbLN",
    "SkipLayerNormalization": "SkipLN",
    "BiasSkipLayerNormalization": "BiasSkipLN",
    "LayerNormalization": "LN",
    "GemmFastGelu": "GemmFastGelu",
}

MINUS = "\u2212"
REF = "ref."
DASH = "\u2014"



# --------------------------------------------------------------------------- numbers


def _signed(value: float, digits: int) -> str:
    text = f"{value:+.{digits}f}"
    if float(text) == 0:
        text = f"+{abs(value):.{digits}f}"
    return text.replace("-", MINUS)


def fmt_ms(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return DASH
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.1f}"
    return f"{value:.2f}"


def fmt_rate(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return DASH
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def fmt_speedup(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return DASH
    return f"{value:.2f}\u00d7"


def fmt_mb(size_bytes: int | None) -> str:
    return DASH if size_bytes is None else f"{size_bytes / 1e6:.1f}"


def ci_half(m: dict) -> float | None:
    ci = m.get("ci95")
    if ci and len(ci) == 2:
        return (ci[1] - ci[0]) / 2
    if "stderr" in m:
        return 1.96 * m["stderr"]
    return None


def metric_text(row: dict, name: str, baseline: bool, detail: bool = True, ci: bool = True) -> str:
    """One metric cell: ``91.2% ±1.3 (−0.4 pt)``, ``0.9921 (p1 0.9858)``, ``0.905 (−0.004)``, ``ref.``.

    ``detail`` off drops the CI and the delta (compact layouts); ``ci`` off drops the CI only."""
    m = (row.get("metrics") or {}).get(name)
    if not m or m.get("value") is None:
        return DASH
    value = m["value"]
    if baseline and name in RELATIVE_METRICS:
        return REF
    # A metric against the baseline's own outputs is its own delta: no "(−1.6 pt)" after it.
    delta = None if baseline or name in RELATIVE_METRICS else (row.get("delta_to_baseline") or {}).get(name)
    if name in PERCENT_METRICS:
        text = f"{100 * value:.1f}%"
        half = ci_half(m)
        if detail and ci and half is not None:
            text += f" \u00b1{100 * half:.1f}"
        if detail and delta is not None:
            text += f" ({_signed(100 * delta, 1)} pt)"
        return text
    if name == "cosine_to_baseline":
        text = f"{value:.4f}"
        if detail and ci and m.get("p1") is not None:
            text += f" (p1 {m['p1']:.4f})"
        return text
    text = f"{value:.3f}"
    if detail and delta is not None:
        text += f" ({_signed(delta, 3)})"
    return text


def metric_notes(report: Report) -> list[str]:
    """What the compact cells abbreviate, said once under the table."""
    notes = []
    if any(((row.get("metrics") or {}).get("cosine_to_baseline") or {}).get("p1") is not None
           for row in report.get("stages", [])):
        notes.append("Cosine: mean per-row cosine to the fp32 baseline's outputs; p1 = its 1st percentile "
                     "(1% of rows are further from the baseline)")
    return notes


def metric_columns(report: Report) -> list[str]:
    """The headline metric first, then the secondary metrics any stage has."""
    headline = report["headline_metric"]
    present = {name for row in report["stages"] for name in (row.get("metrics") or {})}
    task = TASKS.get((report.get("model") or {}).get("task"))
    order = list(task.metrics) if task is not None else list(SECONDARY_METRICS)
    return [headline, *(name for name in order if name in present and name != headline)]


def metric_label(name: str) -> str:
    return METRIC_LABELS.get(name, name.replace("_", " "))


# --------------------------------------------------------------------------- graph facts


def prune_shape_text(shape: dict, sep: str = " x ") -> str:
    """A prune shape (the shape search's record) as layers x heads x FFN x hidden: a count, a fraction of the
    model's own (``0.5``), or "all" where the model's own; a pretrained student as ``pretrained NAME``."""
    if shape.get("student"):
        return f"pretrained {shape['student']}"
    def one(absolute: str, fraction: str) -> str:
        return str(shape[absolute]) if shape.get(absolute) else f"{shape[fraction]:g}" if shape.get(fraction) else "all"

    return sep.join(one(a, f) for a, f in (("layers", "layers_fraction"), ("heads_per_layer", "heads_fraction"),
                                           ("ffn_dim", "ffn_fraction"), ("hidden_size", "hidden_fraction")))


def fused_text(fused: dict | None, abbreviate: bool = True, sep: str = " \u00b7 ", space: str = " ") -> str:
    """``Attn 6 · SkipLN 12 · EmbLN 1 · BiasGelu 6`` (counts of zero left out)."""
    items = [
        f"{FUSED_ABBREVIATIONS.get(op, op) if abbreviate else op}{space}{n}"
        for op, n in (fused or {}).items() if n
    ]
    return sep.join(items) or DASH


def int8_text(graph: dict) -> str:
    if "matmulnbits" in graph:  # the int4 pass: weight-only MatMulNBits
        n = graph["matmulnbits"]
        return f"{n['4bit']}/{graph['weighted_gemms']} 4-bit" + (f", {n['8bit']} 8-bit" if n.get("8bit") else "")
    if "int8_gemms" not in graph:
        return DASH
    return f"{graph['int8_gemms']}/{graph['weighted_gemms']}"


def float_gemms_text(graph: dict, limit: int = 2) -> str:
    if "float_gemms" not in graph:
        return DASH
    names = list(graph["float_gemms"])
    if not names:
        return "none"
    shown = ", ".join(names[:limit]) + (f", +{len(names) - limit}" if len(names) > limit else "")
    return f"{len(names)} ({shown})"


def graph_rows(report: Report) -> list[StageRow]:
    """The ONNX stages that carry graph facts (fusions, quantization coverage)."""
    return [row for row in report["stages"] if row.get("kind") == "onnx" and "graph" in row]


def fusion_choice(report: Report) -> tuple[str, str] | None:
    """(kept candidate, reason) of the fuse pass, once (later stages inherit the same facts)."""
    for row in graph_rows(report):
        graph = row["graph"]
        if "fusion_kept" in graph:
            return graph["fusion_kept"], graph.get("fusion_reason", "")
    return None


# --------------------------------------------------------------------------- captions


def _final(report: Report) -> StageRow:
    return report["stages"][-1]


def title_text(report: Report) -> str:
    model = report.get("model") or {}
    kind = f" ({model['model_type']})" if model.get("model_type") else ""
    return f"{model.get('source', '?')} \u2192 {report.get('target', '?')} \u00b7 {model.get('task', '?')}{kind}"


def settings_text(report: Report) -> str:
    s = report.get("settings") or {}
    heldout = s.get("heldout") or {}
    rows = f" ({heldout['rows']} rows)" if "rows" in heldout else ""
    task = TASKS.get((report.get("model") or {}).get("task"))
    decoder = task is not None and task.decoder
    parts = [
        f"one cached decode step at batch 1 after real held-out prompts; perplexity on {heldout.get('rows', '?')} held-out texts"
        if decoder else f"batch {s.get('batch', 1)} over real held-out texts{rows}",
        f"{s.get('threads', '?')} threads",
        f"{s.get('rounds', '?')} interleaved rounds",
    ]
    if "warmup" in s:
        parts.append(f"warmup {s['warmup']}")
    return ", ".join(parts)


def host_text(report: Report) -> str:
    host = report.get("host") or {}
    parts = [host.get("cpu_model", "unknown CPU")]
    if host.get("cores_usable") is not None:
        parts.append(f"{host['cores_usable']}/{host.get('cores_logical', '?')} cores usable")
    versions = host.get("versions") or {}
    runtimes = [f"{lib} {versions[lib]}" for lib in ("onnxruntime", "torch") if versions.get(lib)]
    parts += runtimes
    if report.get("host_fingerprint"):
        parts.append(f"fingerprint {report['host_fingerprint']}")
    return " \u00b7 ".join(parts)


def memory_text(report: Report) -> str | None:
    """The run's peak resident memory and each step's (report["memory"]); None for reports without it."""
    mem = report.get("memory")
    if not mem:
        return None
    steps = {**mem.get("passes", {}), **({"evaluation": mem["evaluation"]["peak_rss_mb"]} if mem.get("evaluation") else {})}
    per_step = ", ".join(f"{name} {mb:,.0f}" for name, mb in steps.items())
    where = f" (highest step: {mem['peak_in']})" if mem.get("peak_in") else ""
    return f"Peak memory {mem['peak_rss_mb']:,.0f} MB resident{where}" + (f"; per step: {per_step} MB" if per_step else "")


def memory_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """Per step (each pass, then each stage's load and scoring inside the evaluation): RSS at its start,
    its peak, the rise, and how the peak was measured."""
    header = ["step", "start MB", "peak MB", "rise MB", "measured"]
    body = []

    def row(name: str, block: dict | None) -> None:
        if block:
            children = (f"; {block['child_processes']} child process(es), peak {block['children_peak_rss_mb']:,.0f} MB"
                        if block.get("child_processes") else "")
            body.append([name, f"{block['start_rss_mb']:,.0f}", f"{block['peak_rss_mb']:,.0f}",
                         f"{block['peak_delta_mb']:+,.0f}", block.get("method", "") + children])

    for stage in report.get("stages", []):
        row(stage["name"], (stage.get("memory") or {}).get("pass"))
    row("evaluation (all stages)", (report.get("memory") or {}).get("evaluation"))
    for stage in report.get("stages", []):
        memory = stage.get("memory") or {}
        row(f"  load {stage['name']}", memory.get("load"))
        row(f"  score {stage['name']}", memory.get("evaluate"))
    return header, body


def artifact_text(report: Report, markup: str = "plain") -> str | None:
    """The final artifact's solo timing: what ``xformopt bench`` reproduces and gates on."""
    artifact = report.get("artifact") or {}
    lat = artifact.get("latency")
    if not lat:
        return None
    stage = artifact.get("stage", _final(report)["name"])
    medians = lat.get("repeat_medians_ms") or []
    repeats = lat.get("repeats", len(medians))
    p50 = f"{fmt_ms(lat['median_ms'])} ms"
    if markup == "md":
        head = f"**Artifact alone** (`{stage}`, the figure `xformopt bench` gates on): p50 **{p50}**"
    elif markup == "rich":
        head = f"[bold]Artifact alone[/bold] ({stage}, what [cyan]xformopt bench[/cyan] gates on): p50 [bold]{p50}[/bold]"
    else:
        head = f"Artifact alone ({stage}, what `xformopt bench` gates on): p50 {p50}"
    spread = lat.get("spread_ms")
    if spread is not None and repeats and repeats > 1:
        head += f" \u00b1{fmt_ms(spread)}"
        if medians:
            head += f" (median of {repeats} repeats, {fmt_ms(min(medians))}\u2013{fmt_ms(max(medians))} ms)"
    tail = [f"p90 {fmt_ms(lat.get('p90_ms'))} ms", f"p99 {fmt_ms(lat.get('p99_ms'))} ms"]
    if lat.get("throughput_per_s"):
        tail.append(f"{fmt_rate(lat['throughput_per_s'])} samples/s")
    return head + ", " + ", ".join(tail) + "."


def target_warning(report: Report) -> str | None:
    if report.get("target_on_host", True):
        return None
    return f"This host lacks the {report.get('target')} instruction sets: the timings are not the target's."


# --------------------------------------------------------------------------- fixed / throughput


def fixed_grid(report: Report) -> tuple[list[str], list[tuple[int, int]], dict]:
    """(stages in report order, (batch, seq) cells sorted, {(stage, batch, seq): row})."""
    cells: dict = {}
    for entry in report.get("fixed") or []:
        cells[(entry["stage"], int(entry["batch"]), int(entry["seq"]))] = entry
    order = [row["name"] for row in report["stages"]]
    stages = [s for s in order if any(k[0] == s for k in cells)]
    stages += sorted({k[0] for k in cells} - set(stages))
    shapes = sorted({(k[1], k[2]) for k in cells})
    return stages, shapes, cells


def fixed_rows(report: Report, speedup_label: str | None = "Speedup") -> tuple[list[str], list[list[str]]]:
    """The fixed-shape grid: a row per (batch, seq), a column per stage (median ms), and the final
    stage's speedup over the baseline (headed ``speedup_label``, or "FINAL vs BASE" when None)."""
    stages, shapes, cells = fixed_grid(report)
    base, final = (stages[0], stages[-1]) if stages else (None, None)
    header = ["Batch", "Seq", *stages]
    with_speedup = len(stages) > 1
    if with_speedup:
        header.append(speedup_label or f"{final} vs {base}")
    body = []
    for batch, seq in shapes:
        row = [str(batch), str(seq)]
        for stage in stages:
            entry = cells.get((stage, batch, seq))
            row.append(fmt_ms(entry["median_ms"]) if entry else DASH)
        if with_speedup:
            b, f = cells.get((base, batch, seq)), cells.get((final, batch, seq))
            row.append(fmt_speedup(b["median_ms"] / f["median_ms"]) if b and f and f["median_ms"] > 0 else DASH)
        body.append(row)
    return header, body


def generation_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """Decoders: time to first token, per-token latency and tokens/s, with and without the KV cache."""
    return rows(report["generation"])


def model_call_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """The model call alone (``--latency-mode model``) beside the end-to-end median: what tokenization and
    the Python around the call cost each stage."""
    timed = report.get("model_call") or {}
    order = [row for row in report["stages"] if row["name"] in timed]
    header = ["Stage", "p50 ms", "p90 ms", "Speedup", "End to end p50 ms", "Outside the model ms"]
    body, base = [], timed[order[0]["name"]]["median_ms"] if order else None
    for row in order:
        lat, total = timed[row["name"]], (row.get("latency") or {}).get("median_ms")
        body.append([row["name"], fmt_ms(lat["median_ms"]), fmt_ms(lat.get("p90_ms")),
                     fmt_speedup(base / lat["median_ms"]) if base and lat["median_ms"] > 0 else DASH,
                     fmt_ms(total), fmt_ms(total - lat["median_ms"]) if total is not None else DASH])
    return header, body


def throughput_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    tp = report.get("throughput") or {}
    order = [row["name"] for row in report["stages"] if row["name"] in tp]
    order += [name for name in tp if name not in order]
    base = tp[order[0]]["samples_per_s"] if order else None
    header = ["Stage", "Samples/s", "Best batch", "Speedup", "By batch (samples/s)"]
    body = []
    for name in order:
        entry = tp[name]
        by = sorted(((int(k), v) for k, v in (entry.get("by_batch") or {}).items()))
        body.append([
            name,
            fmt_rate(entry["samples_per_s"]),
            str(entry.get("best_batch", DASH)),
            fmt_speedup(entry["samples_per_s"] / base) if base else DASH,
            " \u00b7 ".join(f"{b}: {fmt_rate(v)}" for b, v in by) or DASH,
        ])
    return header, body


# --------------------------------------------------------------------------- headline rows


def rows_for_display(report: Report, detail: bool = True) -> tuple[list[str], list[list[str]]]:
    """The headline table as plain strings (Markdown and the console share it).

    Columns: Stage, Size (MB), the headline metric, secondary metrics, p50/p90/p99 (ms), Speedup."""
    metrics = metric_columns(report)
    header = ["Stage", "Size (MB)", *(metric_label(m) for m in metrics), "p50 (ms)", "p90 (ms)", "p99 (ms)", "Speedup"]
    body = []
    for i, row in enumerate(report["stages"]):
        lat = row.get("latency") or {}
        body.append([
            row["name"],
            fmt_mb(row.get("size_bytes")),
            *(metric_text(row, m, baseline=i == 0, detail=detail, ci=j == 0) for j, m in enumerate(metrics)),
            fmt_ms(lat.get("median_ms")),
            fmt_ms(lat.get("p90_ms")),
            fmt_ms(lat.get("p99_ms")),
            fmt_speedup(row.get("speedup")),
        ])
    return header, body
