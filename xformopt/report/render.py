"""Render a report: rich tables for people, Markdown for pull requests, JSON for machines, PNG plots.

Everything here reads only the report document (schema ``xformopt.report/1``, described in
docs/report-schema.md), so a report can be re-rendered at any later time from report.json alone
(``xformopt report DIR``). Optional sections (``graph``, ``artifact``, ``fixed``, ``throughput``,
secondary metrics) are rendered when present and skipped when absent.

Console layout: a headline table (one row per stage: size, headline metric with its CI and delta,
secondary metrics, batch-1 latency p50/p90/p99, speedup), the artifact's solo timing (the figure
``xformopt bench`` gates on), a small "Graph" table (fusions, INT8 coverage), the fixed-shape and
throughput tables when measured, and a host/settings caption. The headline table picks the richest
of a few layouts that fits the terminal, so it looks good at 100 columns and stays readable at 80;
stage names are never truncated.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.cells import cell_len
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

METRIC_LABELS = {
    "accuracy": "Accuracy",
    "cosine_to_baseline": "Cosine to fp32",
    "macro_f1": "Macro-F1",
    "agreement_with_baseline": "Agreement",
    "probe_accuracy": "Probe acc.",
}
# Shown next to the headline metric when a stage has them, in this order.
SECONDARY_METRICS = ("macro_f1", "agreement_with_baseline", "probe_accuracy")
PERCENT_METRICS = frozenset({"accuracy", "agreement_with_baseline", "probe_accuracy"})
# Metrics measured against the baseline's own outputs: on the baseline row they are 1 by definition.
RELATIVE_METRICS = frozenset({"cosine_to_baseline", "agreement_with_baseline"})

FUSED_ABBREVIATIONS = {
    "Attention": "Attn",
    "MultiHeadAttention": "MHA",
    "EmbedLayerNormalization": "EmbLN",
    "SkipLayerNormalization": "SkipLN",
    "BiasSkipLayerNormalization": "BiasSkipLN",
    "LayerNormalization": "LN",
    "GemmFastGelu": "GemmFastGelu",
}
PLOT_FILES = ("accuracy_latency.png", "latency_seq.png")

MINUS = "\u2212"
REF = "ref."
DASH = "\u2014"

Log = Callable[[str], None]


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


def _ci_half(m: dict) -> float | None:
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
        half = _ci_half(m)
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


def metric_columns(report: dict) -> list[str]:
    """The headline metric first, then the secondary metrics any stage has."""
    headline = report["headline_metric"]
    present = {name for row in report["stages"] for name in (row.get("metrics") or {})}
    return [headline, *(name for name in SECONDARY_METRICS if name in present and name != headline)]


def metric_label(name: str) -> str:
    return METRIC_LABELS.get(name, name.replace("_", " "))


# --------------------------------------------------------------------------- graph facts


def fused_text(fused: dict | None, abbreviate: bool = True, sep: str = " \u00b7 ", space: str = " ") -> str:
    """``Attn 6 · SkipLN 12 · EmbLN 1 · BiasGelu 6`` (counts of zero left out)."""
    items = [
        f"{FUSED_ABBREVIATIONS.get(op, op) if abbreviate else op}{space}{n}"
        for op, n in (fused or {}).items() if n
    ]
    return sep.join(items) or DASH


def int8_text(graph: dict) -> str:
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


def graph_rows(report: dict) -> list[dict]:
    """The ONNX stages that carry graph facts (fusions, quantization coverage)."""
    return [row for row in report["stages"] if row.get("kind") == "onnx" and "graph" in row]


def fusion_choice(report: dict) -> tuple[str, str] | None:
    """(kept candidate, reason) of the fuse pass, once (later stages inherit the same facts)."""
    for row in graph_rows(report):
        graph = row["graph"]
        if "fusion_kept" in graph:
            return graph["fusion_kept"], graph.get("fusion_reason", "")
    return None


# --------------------------------------------------------------------------- captions


def _baseline(report: dict) -> dict:
    return report["stages"][0]


def _final(report: dict) -> dict:
    return report["stages"][-1]


def title_text(report: dict) -> str:
    model = report.get("model") or {}
    kind = f" ({model['model_type']})" if model.get("model_type") else ""
    return f"{model.get('source', '?')} \u2192 {report.get('target', '?')} \u00b7 {model.get('task', '?')}{kind}"


def settings_text(report: dict) -> str:
    s = report.get("settings") or {}
    heldout = s.get("heldout") or {}
    rows = f" ({heldout['rows']} rows)" if "rows" in heldout else ""
    parts = [
        f"batch {s.get('batch', 1)} over real held-out texts{rows}",
        f"{s.get('threads', '?')} threads",
        f"{s.get('rounds', '?')} interleaved rounds",
    ]
    if "warmup" in s:
        parts.append(f"warmup {s['warmup']}")
    return ", ".join(parts)


def host_text(report: dict) -> str:
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


def artifact_text(report: dict, markup: str = "plain") -> str | None:
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


def target_warning(report: dict) -> str | None:
    if report.get("target_on_host", True):
        return None
    return f"This host lacks the {report.get('target')} instruction sets: the timings are not the target's."


# --------------------------------------------------------------------------- fixed / throughput


def fixed_grid(report: dict) -> tuple[list[str], list[tuple[int, int]], dict]:
    """(stages in report order, (batch, seq) cells sorted, {(stage, batch, seq): row})."""
    cells: dict = {}
    for entry in report.get("fixed") or []:
        cells[(entry["stage"], int(entry["batch"]), int(entry["seq"]))] = entry
    order = [row["name"] for row in report["stages"]]
    stages = [s for s in order if any(k[0] == s for k in cells)]
    stages += sorted({k[0] for k in cells} - set(stages))
    shapes = sorted({(k[1], k[2]) for k in cells})
    return stages, shapes, cells


def fixed_rows(report: dict, speedup_label: str | None = "Speedup") -> tuple[list[str], list[list[str]]]:
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


def throughput_rows(report: dict) -> tuple[list[str], list[list[str]]]:
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


def rows_for_display(report: dict, detail: bool = True) -> tuple[list[str], list[list[str]]]:
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


# --------------------------------------------------------------------------- console


class Items:
    """Items joined by `` · ``, wrapped between items only (``Attn 6`` never splits from its count)."""

    def __init__(self, items: list[str], sep: str = " \u00b7 "):
        self.items = items or [DASH]
        self.sep = sep

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(max(cell_len(i) for i in self.items), cell_len(self.sep.join(self.items)))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines, current = [], ""
        for item in self.items:
            candidate = f"{current}{self.sep}{item}" if current else item
            if current and cell_len(candidate) > options.max_width:
                lines.append(current)
                current = item
            else:
                current = candidate
        lines.append(current)
        yield Text("\n".join(lines), no_wrap=True, overflow="fold")


def _table(title: str | None = None, **kwargs) -> Table:
    return Table(
        title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, show_edge=False,
        pad_edge=False, collapse_padding=True, header_style="bold", **kwargs,
    )


class ReportView:
    """A rich renderable for a report that adapts its headline table to the console width."""

    # Content variants, richest first; each is tried with one-line, then two-line headers, and the
    # first whose natural width fits the console is used. The last ones only matter for very long
    # stage names or very narrow consoles.
    VARIANTS = (
        {"detail": True, "secondary": True, "secondary_delta": True, "p99": True, "p90": True, "size": True},
        {"detail": True, "secondary": True, "secondary_delta": False, "p99": True, "p90": True, "size": True},
        {"detail": True, "secondary": True, "secondary_delta": False, "p99": False, "p90": True, "size": True},
        {"detail": True, "secondary": False, "secondary_delta": False, "p99": False, "p90": True, "size": True},
        {"detail": False, "secondary": False, "secondary_delta": False, "p99": False, "p90": True, "size": True},
        {"detail": False, "secondary": False, "secondary_delta": False, "p99": False, "p90": False, "size": True},
        {"detail": False, "secondary": False, "secondary_delta": False, "p99": False, "p90": False, "size": False},
    )
    LAYOUTS = tuple({**v, "stacked": stacked} for v in VARIANTS for stacked in (False, True))

    def __init__(self, report: dict):
        self.report = report

    # -- headline
    def _style_speedup(self, value: float | None) -> str:
        if value is None or not math.isfinite(value):
            return ""
        return "green" if value >= 1.05 else "red" if value <= 0.95 else ""

    def _style_headline(self, row: dict, metric: str) -> str:
        m = (row.get("metrics") or {}).get(metric) or {}
        delta = (row.get("delta_to_baseline") or {}).get(metric)
        half = _ci_half(m)
        if metric == "cosine_to_baseline":
            return "yellow" if m.get("value", 1.0) < 0.99 else ""
        if delta is not None and half is not None and delta < -half:
            return "red"
        return ""

    def headline_table(self, layout: dict) -> Table:
        report = self.report
        metrics = metric_columns(report)
        if not layout["secondary"]:
            metrics = metrics[:1]
        unit = "\n" if layout["stacked"] else " "

        def label(name: str) -> str:
            return name.replace(" ", "\n", 1) if layout["stacked"] else name

        table = _table(title=title_text(report))
        table.add_column("Stage", no_wrap=True, style="bold")
        if layout["size"]:
            table.add_column(f"Size{unit}MB", justify="right", no_wrap=True)
        for m in metrics:
            table.add_column(label(metric_label(m)), justify="right", no_wrap=True)
        table.add_column(f"p50{unit}ms", justify="right", no_wrap=True)
        if layout["p90"]:
            table.add_column(f"p90{unit}ms", justify="right", no_wrap=True)
        if layout["p99"]:
            table.add_column(f"p99{unit}ms", justify="right", no_wrap=True)
        table.add_column("Speedup", justify="right", no_wrap=True)
        last = len(report["stages"]) - 1
        for i, row in enumerate(report["stages"]):
            lat = row.get("latency") or {}
            cells: list = [row["name"]]
            if layout["size"]:
                cells.append(fmt_mb(row.get("size_bytes")))
            for j, m in enumerate(metrics):
                if j == 0:
                    text = metric_text(row, m, baseline=i == 0, detail=layout["detail"])
                else:
                    text = metric_text(row, m, baseline=i == 0, detail=layout["secondary_delta"], ci=False)
                cells.append(Text(text, style="dim" if text == REF else (self._style_headline(row, m) if j == 0 else "")))
            cells.append(fmt_ms(lat.get("median_ms")))
            if layout["p90"]:
                cells.append(fmt_ms(lat.get("p90_ms")))
            if layout["p99"]:
                cells.append(fmt_ms(lat.get("p99_ms")))
            cells.append(Text(fmt_speedup(row.get("speedup")), style=self._style_speedup(row.get("speedup"))))
            table.add_row(*cells, style="bold" if i == last and i else None)
        return table

    def _fit(self, console: Console, options: ConsoleOptions, tables: Iterable[Table]) -> Table:
        wide = options.update_width(10_000)
        chosen = None
        for table in tables:
            chosen = table
            if Measurement.get(console, wide, table).maximum <= options.max_width:
                break
        return chosen

    # -- secondary tables
    def graph_table(self, stacked: bool = False) -> Table | None:
        rows = graph_rows(self.report)
        if not rows or not any(r["graph"] for r in rows):
            return None
        unit = "\n" if stacked else " "
        table = _table(title="Graph")
        table.add_column("Stage", no_wrap=True, style="bold")
        table.add_column("Fused ops")
        table.add_column("Fusion", no_wrap=True)
        table.add_column(f"INT8{unit}GEMMs", justify="right", no_wrap=True)
        table.add_column(f"Float{unit}GEMMs")
        for row in rows:
            graph = row["graph"]
            table.add_row(
                row["name"], Items(fused_text(graph.get("fused_ops"), sep="\n").split("\n")), graph.get("fusion_kept", DASH),
                int8_text(graph), float_gemms_text(graph),
            )
        return table

    def fixed_table(self) -> Table | None:
        if not self.report.get("fixed"):
            return None
        header, body = fixed_rows(self.report)
        stages = header[2:-1] if header[-1] == "Speedup" else header[2:]
        title = "Fixed shapes \u00b7 median latency (ms)"
        if len(stages) > 1:
            title += f" \u00b7 speedup {stages[-1]} vs {stages[0]}"
        table = _table(title=title)
        for i, name in enumerate(header):
            table.add_column(name, justify="right", no_wrap=i < 2, overflow="fold")
        for row in body:
            table.add_row(*row)
        return table

    def throughput_table(self) -> Table | None:
        if not self.report.get("throughput"):
            return None
        header, body = throughput_rows(self.report)
        table = _table(title="Throughput \u00b7 length-bucketed batches over the held-out set")
        for i, name in enumerate(header):
            table.add_column(name, justify="left" if i in (0, 4) else "right", no_wrap=i == 0)
        for row in body:
            table.add_row(*row)
        return table

    def notes(self) -> Table:
        """Wrapped lines (a grid wraps even on a soft-wrapping console)."""
        report = self.report
        grid = Table.grid(padding=(0, 0))
        grid.add_column(overflow="fold")
        artifact = artifact_text(report, markup="rich")
        if artifact:
            grid.add_row(Text.from_markup(artifact))
        warning = target_warning(report)
        if warning:
            grid.add_row(Text(f"Note: {warning}", style="yellow"))
        return grid

    def fusion_note(self) -> Text | None:
        choice = fusion_choice(self.report)
        if not choice:
            return None
        kept, reason = choice
        text = Text.assemble(("Fusion kept ", "dim"), (str(kept), "bold"), (f": {reason}" if reason else "", "dim"))
        return text

    def caption(self) -> Table:
        grid = Table.grid(padding=(0, 0))
        grid.add_column(overflow="fold")
        grid.add_row(Text(f"Latency: {settings_text(self.report)}.", style="dim"))
        grid.add_row(Text(f"Host: {host_text(self.report)}.", style="dim"))
        return grid

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        parts: list = [self._fit(console, options, (self.headline_table(layout) for layout in self.LAYOUTS))]
        parts.append(self.notes())
        graph = self.graph_table()
        if graph is not None:
            graph = self._fit(console, options, (graph, self.graph_table(stacked=True)))
            parts += [Text(), graph]
            note = self.fusion_note()
            if note is not None:
                grid = Table.grid()
                grid.add_column(overflow="fold")
                grid.add_row(note)
                parts.append(grid)
        for extra in (self.fixed_table(), self.throughput_table()):
            if extra is not None:
                parts += [Text(), extra]
        parts += [Text(), self.caption()]
        yield Group(*parts)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(20, options.max_width)


def console_table(report: dict) -> ReportView:
    """The console rendering of a report (a rich renderable: ``console.print(console_table(r))``)."""
    return ReportView(report)


console_report = console_table


# --------------------------------------------------------------------------- markdown


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


def markdown(report: dict, images: Iterable[str] = ()) -> str:
    """GitHub-flavoured Markdown for a pull-request comment.

    The headline table comes first; graph facts, fixed shapes, throughput, host and settings sit in
    a collapsed ``<details>`` block. ``images`` names the plot files (relative to report.md) that
    exist and may be embedded."""
    images = set(images)
    metric = report["headline_metric"]
    model = report.get("model") or {}
    s = report.get("settings") or {}
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
    artifact = artifact_text(report, markup="md")
    if artifact:
        lines += [artifact, ""]
    if "accuracy_latency.png" in images:
        lines += [f"![{metric_label(metric)} vs latency per stage](accuracy_latency.png)", ""]

    details: list[str] = []
    rows = graph_rows(report)
    if rows and any(r["graph"] for r in rows):
        details += ["#### Graph", ""]
        for row in rows:
            graph = row["graph"]
            fused = fused_text(graph.get("fused_ops"), abbreviate=False)
            facts = ["no fusions" if fused == DASH else f"fused {fused}"]
            if "int8_gemms" in graph:
                floats = graph.get("float_gemms") or []
                facts.append(f"INT8 GEMMs {int8_text(graph)}")
                facts.append("float GEMMs: " + (", ".join(f"`{g}`" for g in floats) if floats else "none"))
            details.append(f"- `{row['name']}`: " + "; ".join(facts))
        choice = fusion_choice(report)
        if choice:
            details.append(f"- fusion kept `{choice[0]}`: {choice[1]}")
        details.append("")
    if report.get("fixed"):
        h, b = fixed_rows(report, speedup_label=None)
        details += ["#### Fixed shapes: median latency (ms)", "", *_md_table(h, b, left=()), ""]
        if "latency_seq.png" in images:
            details += ["![Median latency vs sequence length](latency_seq.png)", ""]
    if report.get("throughput"):
        h, b = throughput_rows(report)
        details += ["#### Throughput", "", *_md_table(h, b, left=(0, 4)), ""]
    if host:
        versions = host.get("versions") or {}
        details += [
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
    if s:
        heldout = s.get("heldout") or {}
        details += ["#### Settings", ""]
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
    if details:
        lines += ["<details>", "<summary>Graph, host, settings" + (", fixed shapes" if report.get("fixed") else "")
                  + (", throughput" if report.get("throughput") else "") + "</summary>", "", *details, "</details>"]
    return "\n".join(lines).rstrip("\n") + "\n"


# --------------------------------------------------------------------------- files


def _warn(log: Log | None, message: str) -> None:
    if log is not None:
        log(message)
    else:
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def write_derived_files(report: dict, directory: Path, *, log: Log | None = None) -> list[Path]:
    """report.md and the PNG plots, from the report alone; returns the files written.

    report.md is written first, without images; the plots follow, and report.md is rewritten with
    links to the plots that were made. A plot failure is reported (``log`` or a warning) and never
    loses report.md."""
    from xformopt.report import plots

    directory = Path(directory)
    md_path = directory / "report.md"
    md_path.write_text(markdown(report))
    written = [md_path]
    def failed(name: str, exc: Exception) -> None:
        _warn(log, f"{name} not written: {type(exc).__name__}: {exc}")

    try:
        images = plots.write_plots(report, directory, on_error=failed)
    except Exception as exc:  # noqa: BLE001 - matplotlib missing or broken, a full disk, ...
        _warn(log, f"plots not written: {type(exc).__name__}: {exc}")
        images = []
    # Stale plots from an earlier run must not be linked: only what was written now is embedded.
    if images:
        md_path.write_text(markdown(report, images=[p.name for p in images]))
    return written + images


def write_report_files(report: dict, directory: Path, *, log: Log | None = None) -> list[Path]:
    """report.json, report.md and the plots into ``directory``; JSON first, so a failure later on
    never loses it. Returns the files written."""
    directory = Path(directory)
    json_path = directory / "report.json"
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    return [json_path, *write_derived_files(report, directory, log=log)]
