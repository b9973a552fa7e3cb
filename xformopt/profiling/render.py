"""A profile as people read it: Markdown (profile.md, and the top lines optimize puts in report.md)
and a PNG of horizontal bars (time by category, op type and layer)."""

from __future__ import annotations

from pathlib import Path

from xformopt.plot_style import DPI, PALETTE, STYLE

PLOT = "profile.png"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _ms(value: float) -> str:
    return f"{value:.3f} ms" if value < 1 else f"{value:.2f} ms"


def headline(doc: dict) -> str:
    """One sentence: where the time goes, and whether the parts add up."""
    s, acc, e2e = doc["shares"], doc["accounted"], doc["end_to_end"]
    return (f"GEMMs {_pct(s['gemm'])}, attention {_pct(s['attention'])}, layer norms {_pct(s['layer norm'])}, "
            f"tokenization {_pct(s['tokenization'])} of a request; operators + tokenization "
            f"{_ms(acc['operators_plus_tokenization_median_ms'])} = {_pct(acc['share_of_end_to_end_median'])} of the "
            f"end-to-end median {_ms(e2e['median_ms'])} (profiler overhead {_pct(e2e['profiling_overhead'])})")


def gemm_lines(doc: dict) -> list[str]:
    lines = []
    peak = doc.get("gemm_peak") or {}
    if peak.get("fp32_gflops") and peak.get("int8_gflops"):
        # What INT8 can buy here at best: the int8 kernel's throughput over fp32's on this host.
        lines.append(f"this host's int8 GEMM peak is {peak['int8_gflops'] / peak['fp32_gflops']:.2f}x its fp32 peak "
                     f"({peak['int8_gflops']:.0f} vs {peak['fp32_gflops']:.0f} GFLOP/s)")
    for row in doc["gemm_throughput"]:
        if row["gflops_per_s"] is None:
            continue
        peak = (f" = {_pct(row['fraction_of_peak'])} of this host's {row['kind']} peak {row['peak_gflops_per_s']:.0f} GFLOP/s"
                if row.get("fraction_of_peak") is not None else "")
        lines.append(f"{row['kind']}: {row['gflops_per_s']:.1f} GFLOP/s achieved ({row['gflop_per_request']:.3f} GFLOP "
                     f"per request in {_ms(row['ms'])}){peak}")
    return lines


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|:---|" + "---:|" * (len(header) - 1),
            *("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows)]


def summary_lines(doc: dict, top: int = 5) -> list[str]:
    """The few lines report.md shows for the final stage."""
    lines = [f"- {headline(doc)}."]
    ops = ", ".join(f"{r['op_type']} {_pct(r['share'])}" for r in doc["op_types"][:top])
    lines.append(f"- top op types: {ops}.")
    lines += [f"- {line}." for line in gemm_lines(doc)]
    s = doc["settings"]
    lines.append(f"- {s['runs']} profiled requests, batch {s['batch']}, {s['inputs']}, {s['threads']} threads; "
                 "`xformopt profile DIR -o PROFILE_DIR` for the full profile and the trace.")
    return lines


def markdown(doc: dict, images: tuple[str, ...] = ()) -> str:
    s, e2e, acc = doc["settings"], doc["end_to_end"], doc["accounted"]
    host = doc.get("host") or {}
    flags = ", ".join(host.get("cpu_flags") or []) or "no flags read"
    lines = [f"### xformopt profile: {doc.get('artifact', '?')}", "",
             (f"{s['runs']} requests (batch {s['batch']}, {s['inputs']}, {s['rows']} held-out rows, {s['threads']} "
              f"threads, seed {s['seed']}) on {host.get('cpu_model', '?')} ({flags})."),
             "", headline(doc) + ".", ""]
    verdict = "come within" if acc["within_limit"] else "do NOT come within"
    lines += [(f"Operators + tokenization {verdict} {100 * acc['limit']:.0f}% of the end-to-end median "
               f"({_pct(acc['share_of_end_to_end_median'])}; within each request, median "
               f"{_pct(acc.get('median_share_per_request'))}); ORT's run median is {_ms(acc['ort_run_median_ms'])}, "
               f"of which kernels are {_pct(acc['operators_share_of_ort_run'])}. End-to-end median without the "
               f"profiler: {_ms(e2e['median_ms_profiling_off'])}."), ""]
    if PLOT in images:
        lines += [f"![time by category, op type and layer]({PLOT})", ""]
    lines += ["#### Per request", ""]
    lines += _table(["part", "ms", "share"], [[r["part"], f"{r['ms']:.3f}", _pct(r["share"])] for r in doc["breakdown"]])
    lines += ["", "#### By operator type", ""]
    lines += _table(["op type", "category", "ms", "calls", "share", "GFLOP/s"],
                    [[r["op_type"], r["category"], f"{r['ms']:.3f}", f"{r['calls_per_request']:g}", _pct(r["share"]),
                      "-" if r["gflops_per_s"] is None else f"{r['gflops_per_s']:.1f}"] for r in doc["op_types"]])
    lines += ["", "#### By layer", ""]
    lines += _table(["layer", "ms", "share"], [[r["layer"], f"{r['ms']:.3f}", _pct(r["share"])] for r in doc["layers"]])
    lines += ["", "#### GEMM throughput", ""]
    peak = doc.get("gemm_peak") or {}
    if peak:
        lines.append(f"This host's peak (ORT {peak['shape']['m']}x{peak['shape']['k']}x{peak['shape']['n']} GEMM, "
                     f"{peak['threads']} threads, {'cached' if peak.get('cached') else 'measured'} {peak.get('measured', '?')} at load "
                     f"{peak.get('load_average', '?')}; `--remeasure-peak` on a quiet host): "
                     f"fp32 {peak['fp32_gflops']:.0f} GFLOP/s, int8 {peak['int8_gflops']:.0f} GFLOP/s.")
        lines.append("")
    lines += [f"- {line}" for line in gemm_lines(doc)] or ["- no GEMM with shapes in the trace"]
    lines += ["", "#### Slowest nodes", ""]
    lines += _table(["node", "op type", "ms"], [[f"`{r['node']}`", r["op_type"], f"{r['ms']:.3f}"] for r in doc["top_nodes"]])
    lines += ["", (f"Trace: `{doc.get('trace') or 'trace.json'}` (open in https://ui.perfetto.dev or chrome://tracing; "
                   f"it also holds the {s['warmup']} warm-up runs).")]
    return "\n".join(lines) + "\n"


def write_plot(doc: dict, path: Path) -> Path:
    from matplotlib import rc_context
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure


    panels = [
        ("per request, by part", [(r["part"], r["ms"]) for r in doc["breakdown"]]),
        ("by operator type (top 12)", [(r["op_type"], r["ms"]) for r in doc["op_types"][:12]]),
        ("by layer", [(r["layer"], r["ms"]) for r in doc["layers"]]),
    ]
    height = 1.2 + 0.22 * sum(len(items) for _, items in panels)
    with rc_context(STYLE):
        fig = Figure(figsize=(8.0, max(height, 4.0)), dpi=DPI, layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(len(panels), 1, height_ratios=[max(len(items), 1) for _, items in panels])
        for ax, (title, items), color in zip(axes, panels, PALETTE):
            labels = [name for name, _ in items][::-1]
            values = [ms for _, ms in items][::-1]
            ax.barh(labels, values, color=color)
            ax.set_title(title, loc="left")
            ax.set_xlabel("ms per request (mean)")
        e2e = doc["end_to_end"]
        fig.suptitle(f"{doc.get('artifact', '?')}: end-to-end median {e2e['median_ms']:.2f} ms", x=0.01, ha="left",
                     fontsize=10, fontweight="bold")
        from xformopt.atomic import replacing

        with replacing(path) as tmp:
            fig.savefig(tmp, format="png")
    return path
