"""PNG plots of a report, drawn with matplotlib's Agg canvas (no pyplot, no window, no global backend).

- ``accuracy_latency.png``: the headline metric against batch-1 p50 latency, one point per stage,
  with the metric's 95% CI (y) and the p50..p90 latency range (x); the baseline is marked.
- ``latency_seq.png`` (only when the report has a ``fixed`` section): median latency against
  sequence length, one line per stage, one panel per batch size, shaded up to p90.

matplotlib is imported lazily, inside the functions, so importing xformopt stays fast and a broken
matplotlib can only cost the plots (see ``render.write_report_files``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from xformopt.plot_style import BASELINE_COLOR, DPI, STYLE, stage_colors
from xformopt.plot_style import figure as _figure
from xformopt.report.cells import (
    PERCENT_METRICS,
    fixed_grid,
    fmt_speedup,
    host_text,
    metric_label,
)
from xformopt.report.types import Report

ACCURACY_LATENCY = "accuracy_latency.png"
LATENCY_SEQ = "latency_seq.png"
OnError = Callable[[str, Exception], None]


def _title(fig, report: Report, what: str) -> None:
    model = report.get("model") or {}
    fig.suptitle(f"{model.get('source', '?')} \u2192 {report.get('target', '?')}: {what}",
                 fontsize=11, fontweight="bold", x=0.01, ha="left")
    s = report.get("settings") or {}
    host = host_text(report).split(" \u00b7 fingerprint")[0]
    note = "" if report.get("target_on_host", True) else "  (host lacks the target: not the target's timings)"
    fig.text(0.01, 0.935, f"{model.get('task', '?')} \u00b7 {s.get('threads', '?')} threads \u00b7 {host}{note}",
             fontsize=7.5, color="#555555", ha="left", va="top")


# --------------------------------------------------------------------------- accuracy vs latency


def _metric_point(row: dict, metric: str) -> tuple[float, float, float, float | None] | None:
    """(y, err below, err above, p1 or None) in plot units (accuracy in %), or None when missing."""
    m = (row.get("metrics") or {}).get(metric)
    if not m or m.get("value") is None:
        return None
    scale = 100.0 if metric in PERCENT_METRICS else 1.0
    value = m["value"] * scale
    if m.get("ci95"):
        lo, hi = (v * scale for v in m["ci95"])
        return value, max(value - lo, 0.0), max(hi - value, 0.0), None
    half = 1.96 * m.get("stderr", 0.0) * scale
    p1 = m.get("p1")
    return value, half, half, None if p1 is None else p1 * scale


def _label_candidates() -> list[tuple[tuple[float, float], str, str]]:
    """Offsets (points) to try for a label, nearest first: beside the marker, then further out."""
    near = [((7, 6), "left", "bottom"), ((7, -6), "left", "top"), ((-7, 6), "right", "bottom"),
            ((-7, -6), "right", "top"), ((0, 10), "center", "bottom"), ((0, -10), "center", "top")]
    far = []
    for step in range(1, 16):
        for dy in (6 + 12 * step, -6 - 12 * step):
            for dx, ha in ((7, "left"), (-7, "right"), (0, "center"), (40, "left"), (-40, "right")):
                far.append(((dx, dy), ha, "bottom" if dy > 0 else "top"))
    return near + far


def _place_labels(ax, points: list[tuple[float, float, str, str, bool]], obstacles: list, renderer) -> None:
    """Label each point at the nearest offset where it overlaps no marker, whisker, legend or other
    label and stays inside the axes; a label placed away from its point gets a thin leader line."""
    from matplotlib.text import Text

    taken = list(obstacles)
    for x, y, _, _, _ in points:  # a small box around every marker
        px, py = ax.transData.transform((x, y))
        taken.append((px - 6, py - 6, px + 6, py + 6))
    axes_box = ax.get_window_extent(renderer)

    def clear(box) -> bool:
        inside = axes_box.x0 <= box.x0 and box.x1 <= axes_box.x1 and axes_box.y0 <= box.y0 and box.y1 <= axes_box.y1
        return inside and not any(box.x0 < t[2] and t[0] < box.x1 and box.y0 < t[3] and t[1] < box.y1 for t in taken)

    def annotate(label, x, y, offset, ha, va, color, bold):
        leader = abs(offset[1]) > 12 or abs(offset[0]) > 12
        annotation = ax.annotate(
            label, (x, y), xytext=offset, textcoords="offset points", ha=ha, va=va, fontsize=8, color=color,
            fontweight="bold" if bold else "normal",
            arrowprops={
                "arrowstyle": "-", "color": color, "lw": 0.6, "alpha": 0.6, "shrinkA": 1, "shrinkB": 5,
                # from the text's corner nearest the point
                "relpos": ({"left": 0.0, "right": 1.0}.get(ha, 0.5), 1.0 if va == "top" else 0.0),
            } if leader else None,
        )
        annotation.set_in_layout(False)
        return annotation

    def text_box(annotation):
        annotation.update_positions(renderer)
        return Text.get_window_extent(annotation, renderer)  # the text alone, not its leader line

    candidates = _label_candidates()
    for x, y, label, color, bold in sorted(points, key=lambda p: p[0]):
        for offset, ha, va in candidates:
            annotation = annotate(label, x, y, offset, ha, va, color, bold)
            box = text_box(annotation)
            if clear(box):
                break
            annotation.remove()
        else:  # nowhere clear: the first choice, overlapping
            annotation = annotate(label, x, y, *candidates[0], color, bold)
            box = text_box(annotation)
        taken.append((box.x0, box.y0, box.x1, box.y1))


def _whisker_boxes(ax, x: float, y: float, x_hi: float, y_lo: float, y_hi: float) -> list[tuple]:
    """Pixel boxes of a point's error bars, so labels keep off them."""
    px, py = ax.transData.transform((x, y))
    px_hi, _ = ax.transData.transform((x_hi, y))
    _, py_lo = ax.transData.transform((x, y_lo))
    _, py_hi = ax.transData.transform((x, y_hi))
    return [(px - 4, py_lo - 2, px + 4, py_hi + 2), (px, py - 4, px_hi + 2, py + 4)]


def plot_accuracy_latency(report: Report, path: Path) -> Path:
    import matplotlib
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    metric = report["headline_metric"]
    stages = report["stages"]
    colors = stage_colors([s["name"] for s in stages])
    percent = metric in PERCENT_METRICS
    with matplotlib.rc_context(STYLE):
        fig = _figure()
        ax = fig.add_subplot()
        points, whiskers = [], []
        any_p1 = False
        last = len(stages) - 1
        for i, row in enumerate(stages):
            lat = row.get("latency") or {}
            point = _metric_point(row, metric)
            if point is None or lat.get("median_ms") is None:
                continue
            y, below, above, p1 = point
            x = lat["median_ms"]
            p90 = lat.get("p90_ms", x)
            color = colors[row["name"]]
            baseline = i == 0
            if p1 is not None and not baseline:
                any_p1 = True
                ax.plot([x, x], [p1, y], color=color, linestyle=":", linewidth=1.0, alpha=0.8, zorder=2)
                ax.plot([x], [p1], marker="v", color=color, markersize=4, linestyle="none", zorder=3)
            ax.errorbar(
                [x], [y], xerr=[[0.0], [max(p90 - x, 0.0)]], yerr=[[below], [above]],
                fmt="*" if baseline else "o", markersize=12 if baseline else (8 if i == last else 6.5),
                color=color, ecolor=color, elinewidth=1.1, capsize=3, alpha=0.95, zorder=4,
                markeredgecolor="white", markeredgewidth=0.8,
            )
            label = f"{row['name']} (baseline)" if baseline else f"{row['name']} {fmt_speedup(row.get('speedup'))}"
            points.append((x, y, label, color, i == last and not baseline))
            whiskers.append((x, y, max(p90, x), min(y - below, p1 if p1 is not None and not baseline else y), y + above))
        if points:
            base_y = points[0][1] if stages and _metric_point(stages[0], metric) else None
            if base_y is not None:
                ax.axhline(base_y, color=BASELINE_COLOR, linestyle="--", linewidth=0.8, alpha=0.6, zorder=1)
            xmax = max((s.get("latency") or {}).get("p90_ms", 0) or 0 for s in stages)
            ax.set_xlim(0, max(xmax, max(p[0] for p in points)) * 1.18 or 1)
            ys = [p[1] for p in points]
            ax.margins(y=0.18)
            if max(ys) - min(ys) < 1e-9:  # all equal: give the axis some room
                pad = 1.0 if percent else 1e-4
                ax.set_ylim(min(ys) - pad, max(ys) + pad)
        if percent or metric == "cosine_to_baseline":
            ceiling, pattern = (100.0, "{:.1f}%") if percent else (1.0, "{:.4f}")
            # No tick labels above what the metric can reach (the margin above is room for labels).
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: "" if v > ceiling + 1e-9 else pattern.format(v)))
        ax.set_xlabel("latency at batch 1, real held-out lengths: p50 (ms), whisker to p90")
        ylabel = metric_label(metric) + (" (95% CI)" if percent else " (mean, 95% CI)")
        ax.set_ylabel(ylabel)
        handles = [
            Line2D([], [], marker="*", color=BASELINE_COLOR, linestyle="none", markersize=10, label="baseline (PyTorch fp32)"),
            Line2D([], [], color=BASELINE_COLOR, linestyle="--", linewidth=0.8, label="baseline level"),
        ]
        if any_p1:
            handles.append(Line2D([], [], marker="v", color="#777777", linestyle=":", markersize=4, label="1st-percentile row"))
        ax.legend(handles=handles, loc="lower right")
        _title(fig, report, f"{metric_label(metric).lower()} vs latency")
        fig.get_layout_engine().set(rect=(0, 0, 1, 0.92))
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        obstacles = [tuple(ax.get_legend().get_window_extent(renderer).extents)]
        for x, y, x_hi, y_lo, y_hi in whiskers:
            obstacles += _whisker_boxes(ax, x, y, x_hi, y_lo, y_hi)
        _place_labels(ax, points, obstacles, renderer)
        fig.savefig(path, dpi=DPI)
    return path


# --------------------------------------------------------------------------- latency vs sequence length


def plot_latency_seq(report: Report, path: Path) -> Path:
    import matplotlib
    from matplotlib.ticker import FixedLocator, NullLocator

    stages, shapes, cells = fixed_grid(report)
    if not shapes:
        raise ValueError("the report has no fixed-shape timings")
    batches = sorted({b for b, _ in shapes})
    seqs = sorted({s for _, s in shapes})
    colors = stage_colors([s["name"] for s in report["stages"]] + [s for s in stages if s not in {r["name"] for r in report["stages"]}])
    with matplotlib.rc_context(STYLE):
        fig = _figure()
        axes = fig.subplots(1, len(batches), sharex=True, squeeze=False)[0]
        for ax, batch in zip(axes, batches):
            for stage in stages:
                pts = [(s, cells[(stage, batch, s)]) for s in seqs if (stage, batch, s) in cells]
                if not pts:
                    continue
                xs = [s for s, _ in pts]
                med = [c["median_ms"] for _, c in pts]
                p90 = [c.get("p90_ms", c["median_ms"]) for _, c in pts]
                color = colors.get(stage, BASELINE_COLOR)
                baseline = stage == report["stages"][0]["name"]
                ax.plot(xs, med, marker="o", markersize=4, linewidth=1.6, color=color,
                        linestyle="--" if baseline else "-", label=f"{stage} (baseline)" if baseline else stage)
                ax.fill_between(xs, med, p90, color=color, alpha=0.12, linewidth=0)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(FixedLocator(seqs))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([str(s) for s in seqs])
            if len(seqs) > 1:
                ax.set_xlim(seqs[0] / 1.25, seqs[-1] * 1.25)
            ax.set_ylim(bottom=0)
            ax.set_title(f"batch {batch}", loc="left", fontsize=9, color="#333333")
            ax.set_xlabel("sequence length (tokens)")
        axes[0].set_ylabel("median latency (ms), band to p90")
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 6))
        _title(fig, report, "latency vs sequence length")
        fig.get_layout_engine().set(rect=(0, 0, 1, 0.92))
        fig.savefig(path, dpi=DPI)
    return path


# --------------------------------------------------------------------------- files


def write_plots(report: Report, directory: Path, on_error: OnError | None = None) -> list[Path]:
    """Write every plot the report has data for; returns the files written.

    Without ``on_error`` the first failure raises; with it, a failed plot is reported
    (``on_error(file name, exception)``) and the others are still drawn."""
    directory = Path(directory)
    jobs = [(ACCURACY_LATENCY, plot_accuracy_latency)]
    if report.get("fixed"):
        jobs.append((LATENCY_SEQ, plot_latency_seq))
    written = []
    for name, draw in jobs:
        try:
            written.append(draw(report, directory / name))
        except Exception as exc:
            if on_error is None:
                raise
            on_error(name, exc)
    return written


__all__ = ["write_plots", "plot_accuracy_latency", "plot_latency_seq", "ACCURACY_LATENCY", "LATENCY_SEQ"]
