"""Render a report: a rich table for people, Markdown for pull requests, JSON for machines."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

METRIC_LABELS = {"accuracy": "Accuracy", "cosine_to_baseline": "Cosine to fp32"}


def _metric_cell(row: dict, metric: str, baseline: bool) -> str:
    m = row["metrics"].get(metric)
    if m is None:
        return "-"
    text = f"{100 * m['value']:.2f}%" if metric == "accuracy" else f"{m['value']:.4f}"
    if not baseline:
        delta = row["delta_to_baseline"].get(metric, 0.0)
        text += f" ({100 * delta:+.2f} pt)" if metric == "accuracy" else f" ({delta:+.4f})"
    return text


def _graph_cell(row: dict) -> tuple[str, str]:
    graph = row.get("graph") or {}
    fused = ", ".join(f"{k} {v}" for k, v in graph.get("fused_ops", {}).items()) or "-"
    int8 = f"{graph['int8_gemms']}/{graph['weighted_gemms']}" if "int8_gemms" in graph else "-"
    return fused, int8


def rows_for_display(report: dict) -> tuple[list[str], list[list[str]]]:
    metric = report["headline_metric"]
    header = ["Stage", "Size (MB)", METRIC_LABELS.get(metric, metric), "p50 (ms)", "p90 (ms)", "Speedup", "Fused ops", "INT8 GEMMs"]
    body = []
    for i, row in enumerate(report["stages"]):
        fused, int8 = _graph_cell(row)
        body.append([
            row["name"],
            f"{row['size_bytes'] / 1e6:.1f}",
            _metric_cell(row, metric, baseline=i == 0),
            f"{row['latency']['median_ms']:.2f}",
            f"{row['latency']['p90_ms']:.2f}",
            f"{row['speedup']:.2f}x",
            fused,
            int8,
        ])
    return header, body


def console_table(report: dict) -> Table:
    header, body = rows_for_display(report)
    s = report["settings"]
    table = Table(
        title=f"{report['model']['source']} -> {report['target']} ({report['model']['task']})",
        caption=f"batch {s['batch']}, real held-out lengths, {s['threads']} threads, {s['rounds']} interleaved rounds",
    )
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i in (0, 6) else "right")
    for row in body:
        table.add_row(*row)
    return table


def markdown(report: dict) -> str:
    header, body = rows_for_display(report)
    s = report["settings"]
    lines = [
        f"### xformopt: {report['model']['source']} -> `{report['target']}`",
        "",
        f"Task {report['model']['task']}; latency at batch {s['batch']} over real held-out texts, "
        f"{s['threads']} threads, {s['rounds']} interleaved rounds; host {report['host']['cpu_model']}.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" if i in (0, 6) else "---:" for i in range(len(header))) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    if not report.get("target_on_host", True):
        lines += ["", f"> This host lacks the `{report['target']}` instruction sets: timings are not the target's."]
    return "\n".join(lines) + "\n"


def write_report_files(report: dict, directory: Path) -> None:
    (directory / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (directory / "report.md").write_text(markdown(report))
