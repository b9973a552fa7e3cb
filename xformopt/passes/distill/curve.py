"""The distill pass's training curve, drawn from its record alone."""

from __future__ import annotations

from pathlib import Path

from xformopt.plot_style import BASELINE_COLOR, DPI, PALETTE, STYLE
from xformopt.plot_style import figure as _figure


def plot_training_curve(record: dict, path: Path, title: str = "distill") -> Path:
    """The ``distill`` pass's curve: training loss (left axis) and the held-out metrics (right axis) at
    each evaluation, the best step marked, the teacher's level dashed. Drawn from the pass record alone."""
    import matplotlib

    evals = record.get("evaluations") or []
    if not evals:
        raise ValueError("the record has no evaluations")
    metric = (record.get("selection") or {}).get("metric", "accuracy")
    best_step = (record.get("selection") or {}).get("best_step")
    with matplotlib.rc_context(STYLE):
        fig = _figure()
        ax = fig.add_subplot()
        # A mean over a few steps only (the evaluation at a stop between two regular ones) is noise: not drawn.
        window = max((e.get("train_steps", 1) for e in evals), default=1)
        loss_pts = [(e["step"], e["train_loss"]) for e in evals
                    if "train_loss" in e and e.get("train_steps", window) * 4 >= window]
        if loss_pts:
            ax.plot(*zip(*loss_pts), color=PALETTE[0], marker="o", markersize=3, linewidth=1.4, label="training loss")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("training loss (mean since the previous evaluation)", color=PALETTE[0])
        right = ax.twinx()
        right.grid(False)
        right.spines["right"].set_visible(True)
        shown = [m for m in (metric, "agreement", "cosine") if any(m in e for e in evals)]
        for i, m in enumerate(dict.fromkeys(shown)):
            pts = [(e["step"], e[m]) for e in evals if m in e]
            right.plot(*zip(*pts), color=PALETTE[1 + i], marker="s", markersize=3, linewidth=1.4,
                       label=f"held-out {m}" + (" (selection)" if m == metric else ""))
        teacher = ((record.get("quality") or {}).get("teacher") or {}).get(metric)
        if teacher is not None and metric != "cosine":
            right.axhline(teacher, color=BASELINE_COLOR, linestyle="--", linewidth=0.8, label=f"teacher {metric}")
        if best_step is not None:
            best = next((e for e in evals if e["step"] == best_step), None)
            ax.axvline(best_step, color="#999999", linestyle=":", linewidth=0.9)
            if best is not None and metric in best:
                right.plot([best_step], [best[metric]], marker="*", markersize=12, color=PALETTE[1], linestyle="none",
                           label=f"best: step {best_step}" + (
                               "" if (record.get("selection") or {}).get("keep", "best") == "best"
                               else " (saved: the last step)"))
        right.set_ylabel("held-out metric")
        handles = ax.get_legend_handles_labels()
        more = right.get_legend_handles_labels()
        fig.legend(handles[0] + more[0], handles[1] + more[1], loc="outside lower center", ncol=3)
        t = record.get("training") or {}
        secs = (t.get("seconds") or {}).get("total_with_teacher_pass")
        note = f"{t.get('steps', '?')} steps, {t.get('epochs', '?')} epochs, stopped: {t.get('stopped_because', '?')}"
        if secs is not None:
            note += f", {secs / 60:.1f} min"
        fig.suptitle(f"{title}: training curve", fontsize=11, fontweight="bold", x=0.01, ha="left")
        fig.text(0.01, 0.935, note, fontsize=7.5, color="#555555", ha="left", va="top")
        fig.get_layout_engine().set(rect=(0, 0, 1, 0.92))
        fig.savefig(path, dpi=DPI)
    return path
