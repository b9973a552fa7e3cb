"""The console view of a report: a headline table that picks the richest layout fitting the
terminal (good at 100 columns, readable at 80; stage names never truncated), the artifact's solo
timing, a graph table, fixed/throughput tables and a host caption."""

from __future__ import annotations

import math
from collections.abc import Iterable

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from xformopt.report.cells import (
    DASH,
    LOWER_IS_BETTER,
    REF,
    artifact_text,
    ci_half,
    fixed_rows,
    float_gemms_text,
    fmt_mb,
    fmt_ms,
    fmt_speedup,
    fused_text,
    fusion_choice,
    generation_rows,
    graph_rows,
    host_text,
    int8_text,
    memory_text,
    metric_columns,
    metric_label,
    metric_notes,
    metric_text,
    model_call_rows,
    prune_shape_text,
    settings_text,
    target_warning,
    throughput_rows,
    title_text,
)
from xformopt.report.types import Report


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


def _rows_table(title: str, header: list[str], body: list[list[str]], left: tuple[int, ...],
                no_wrap: tuple[int, ...] = (0,)) -> Table:
    """A titled table of text rows: the columns in ``left`` left-aligned, those in ``no_wrap`` never wrapped."""
    table = _table(title=title)
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i in left else "right", no_wrap=i in no_wrap)
    for row in body:
        table.add_row(*row)
    return table


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

    def __init__(self, report: Report):
        self.report = report

    # -- headline
    def _style_speedup(self, value: float | None) -> str:
        if value is None or not math.isfinite(value):
            return ""
        return "green" if value >= 1.05 else "red" if value <= 0.95 else ""

    def _style_headline(self, row: dict, metric: str) -> str:
        m = (row.get("metrics") or {}).get(metric) or {}
        delta = (row.get("delta_to_baseline") or {}).get(metric)
        half = ci_half(m)
        if metric == "cosine_to_baseline":
            return "yellow" if m.get("value", 1.0) < 0.99 else ""
        if metric in LOWER_IS_BETTER:
            return "red" if delta is not None and half is not None and delta > half else ""
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

    def model_call_table(self) -> Table | None:
        if not self.report.get("model_call"):
            return None
        return _rows_table("Model call alone \u00b7 batch 1, texts tokenized beforehand, interleaved",
                           *model_call_rows(self.report), left=(0,))

    def throughput_table(self) -> Table | None:
        if not self.report.get("throughput"):
            return None
        return _rows_table("Throughput \u00b7 length-bucketed batches over the held-out set",
                           *throughput_rows(self.report), left=(0, 4))

    def generation_table(self) -> Table | None:
        if not self.report.get("generation"):
            return None
        return _rows_table("Generation \u00b7 greedy, batch 1, ms, with and without the KV cache (interleaved)",
                           *generation_rows(self.report), left=(2, 3), no_wrap=(2, 5))

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
        profile = report.get("profile")
        if profile and "error" not in profile:
            from xformopt.profiling.render import headline

            grid.add_row(Text(f"Where the time goes ({profile.get('stage', 'final stage')}): {headline(profile)}; "
                              "`xformopt profile DIR` for the full profile.", style="dim"))
        searched = report.get("shape_search")
        if searched:
            kept = searched["kept"]
            what = "Student" if kept.get("student") else "Prune shape"
            dims = "" if kept.get("student") else " (layers x heads x FFN x hidden)"
            grid.add_row(Text(f"{what} {prune_shape_text(kept)}{dims}: {searched['why']}; "
                              f"{len(searched['tried'])} shape(s) considered, see report.md.", style="dim"))
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
        for note in metric_notes(self.report):
            grid.add_row(Text(f"{note}.", style="dim"))
        grid.add_row(Text(f"Latency: {settings_text(self.report)}.", style="dim"))
        if memory_text(self.report):
            grid.add_row(Text(f"{memory_text(self.report)}.", style="dim"))
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
        for extra in (self.model_call_table(), self.fixed_table(), self.throughput_table(), self.generation_table()):
            if extra is not None:
                parts += [Text(), extra]
        parts += [Text(), self.caption()]
        yield Group(*parts)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(20, options.max_width)


def console_table(report: Report) -> ReportView:
    """The console rendering of a report (a rich renderable: ``console.print(console_table(r))``)."""
    return ReportView(report)

