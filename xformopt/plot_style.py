"""One look for every figure xformopt draws (reports, the distill curve, search fronts): sizes,
colours and the matplotlib rc settings. matplotlib is imported only inside ``figure``."""

from __future__ import annotations

DPI = 150
SIZE = (8.0, 5.0)
BASELINE_COLOR = "#4d4d4d"
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
STYLE = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e5e5e5",
    "grid.linewidth": 0.8,
    "axes.axisbelow": True,
    "axes.edgecolor": "#888888",
    "xtick.color": "#444444",
    "ytick.color": "#444444",
    "legend.frameon": False,
    "legend.fontsize": 8,
    "savefig.facecolor": "white",
}


def stage_colors(names: list[str]) -> dict[str, str]:
    """The baseline (first stage) in grey, the others in palette order; the same in every plot."""
    colors = {}
    for i, name in enumerate(names):
        colors[name] = BASELINE_COLOR if i == 0 else PALETTE[(i - 1) % len(PALETTE)]
    return colors


def figure(**kwargs):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=SIZE, dpi=DPI, layout="constrained", **kwargs)
    FigureCanvasAgg(fig)
    return fig
