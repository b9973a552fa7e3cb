"""What a search leaves in DIR: search.json (schema xformopt.search/1), search.md, pareto.png and
the best recipe as reusable YAML (best-recipe.yaml, accepted by `xformopt optimize --recipe`)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import yaml

from xformopt.atomic import write_json
from xformopt.atomic import write_text as write_text_atomic
from xformopt.recipe_search.executors import describe

SCHEMA = "xformopt.search/1"
BEST_RECIPE = "best-recipe.yaml"


def front_entry(t: dict) -> dict:
    return {"trial": t["trial"], "artifact": t["artifact"], "metric": t["metric"], "latency_ms": t["latency_ms"],
            "recipe": t["recipe"]}


def choose_best(front: list[dict], baseline_metric: float, allowed_points: float) -> dict | None:
    """The fastest front point within the accuracy budget; without one, the most accurate point."""
    within = [p for p in front if (baseline_metric - p["metric"]) * 100 <= allowed_points + 1e-9]
    if within:
        return min(within, key=lambda p: p["latency_ms"])
    return max(front, key=lambda p: p["metric"]) if front else None


def reference_entry(result: dict, **extra) -> dict | None:
    if result.get("status") != "complete":
        return None
    return {"artifact": result["artifact"], **extra, "metric": result["metric"], "latency_ms": result.get("remeasured_latency_ms")}


def document(s, spec, executor, trials, front, measured, reference, optimum, baseline, validation, allowed) -> dict:
    best = choose_best(front, baseline["metric"], allowed)
    return {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": {"source": s.model, "task": spec.task, "model_type": spec.model_type},
        "metric": {"name": spec.task_def.headline, "split": "validation", **validation,
                   "scale": "fraction, as report.json (accuracy, or cosine to the PyTorch fp32 outputs)"},
        "objectives": s.objectives,
        "sampler": {"name": s.sampler, "seed": s.seed},
        "space": s.space.to_dict(),
        "executor": describe(executor),
        "max_accuracy_drop": {"given": s.max_accuracy_drop, "points": allowed},
        "baseline": {"name": "pytorch", **baseline},
        "reference_int8": reference_entry(reference, recipe="default"),
        "optimum_int8": reference_entry(optimum, target=optimum.get("target"), config=optimum.get("config")),
        "trials": trials,
        "remeasure": measured,
        "front": [front_entry(p) for p in front],
        "best": None if best is None else {"trial": best["trial"], "artifact": best["artifact"], "recipe_file": BEST_RECIPE,
                                          "metric": best["metric"], "latency_ms": best["latency_ms"],
                                          "drop_points": round((baseline["metric"] - best["metric"]) * 100, 4)},
    }


def best_recipe_yaml(doc: dict, base_evaluation: dict) -> str | None:
    """The winning trial's recipe with the base recipe's evaluation settings (not the trial's short
    ones), so `optimize --recipe best-recipe.yaml` gives a full report."""
    best = doc["best"]
    if best is None:
        return None
    trial = next(t for t in doc["trials"] if t["trial"] == best["trial"])
    recipe = dict(trial["recipe"])
    recipe["name"] = f"search-{doc['space']['name']}-trial-{best['trial']:03d}"
    recipe["evaluation"] = base_evaluation
    header = (f"# Found by `xformopt search` ({doc['space']['name']}, trial {best['trial']:03d}): {doc['metric']['name']} "
              f"{best['metric']:.4f} on {doc['metric']['rows']} validation rows ({best['drop_points']:.2f} points below fp32), "
              f"{best['latency_ms']:.2f} ms re-measured at batch 1\n")
    return header + yaml.safe_dump(recipe, sort_keys=False)


def markdown(doc: dict) -> str:
    m = doc["metric"]
    lines = [f"# xformopt search: {doc['model']['source']}", "",
             f"Space `{doc['space']['name']}` ({doc['space']['size']} combinations), "
             f"{sum('duplicate_of' not in t for t in doc['trials'])} trials run "
             f"({sum('duplicate_of' in t for t in doc['trials'])} repeated proposals reused), "
             f"sampler {doc['sampler']['name']} (seed {doc['sampler']['seed']}), executor {doc['executor']['kind']} "
             f"({doc['executor']['workers']} workers). {m['name']} on {m['rows']} rows of the validation split; latency "
             f"re-measured serially, interleaved, batch 1, {doc['remeasure']['threads']} threads, "
             f"{doc['remeasure']['rounds']} rounds.", "",
             "| point | metric | drop (points) | latency ms | speed-up vs optimum INT8 | speed-up vs INT8 reference | recipe |",
             "|---|---|---|---|---|---|---|"]
    base = doc["baseline"]
    ref, opt = doc["reference_int8"], doc.get("optimum_int8")

    def speed(against, latency):
        return f"{against['latency_ms'] / latency:.2f}x" if against and against.get("latency_ms") and latency else ""

    def row(name, metric, latency, recipe):
        lines.append(f"| {name} | {metric:.4f} | {(base['metric'] - metric) * 100:+.2f} | {latency:.2f} | "
                     f"{speed(opt, latency)} | {speed(ref, latency)} | {recipe} |")

    row("PyTorch fp32", base["metric"], base["latency_ms"], "-")
    if opt and opt.get("latency_ms"):
        row("dynamic INT8, optimum's settings", opt["metric"], opt["latency_ms"], f"ORT quantize_dynamic, {opt['target']}")
    if ref:
        row("INT8 reference", ref["metric"], ref["latency_ms"], "default")
    for p in doc["front"]:
        passes = " → ".join(next(iter(s)) for s in p["recipe"]["passes"])
        row(f"trial {p['trial']:03d}" + (" **best**" if doc["best"] and doc["best"]["trial"] == p["trial"] else ""),
            p["metric"], p["latency_ms"], f"`{p['artifact']}` ({passes})")
    lines += ["", "All trials:", "", "| trial | status | metric | latency ms (parallel) | re-measured | params |", "|---|---|---|---|---|---|"]
    for t in doc["trials"]:
        metric = f"{t['metric']:.4f}" if t.get("metric") is not None else "-"
        lat = f"{t['latency_ms']:.2f}" if t.get("latency_ms") is not None else "-"
        rem = f"{t['remeasured_latency_ms']:.2f}" if t.get("remeasured_latency_ms") is not None else "-"
        note = t.get("error") or (f"duplicate of {t['duplicate_of']:03d}" if "duplicate_of" in t else "")
        params = ", ".join(f"{k}={v}" for k, v in (t.get("params") or {}).items())
        lines.append(f"| {t['trial']:03d} | {t['status']} {note} | {metric} | {lat} | {rem} | {params} |")
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    done = [t for t in doc["trials"] if t["status"] == "complete" and "duplicate_of" not in t]
    xs = [t.get("remeasured_latency_ms") or t["latency_ms"] for t in done]
    ax.scatter(xs, [t["metric"] for t in done], c="0.6", label="trials (parallel latency unless re-measured)")
    front = doc["front"]
    ax.plot([p["latency_ms"] for p in front], [p["metric"] for p in front], "o-", c="tab:red", label="front (re-measured)")
    for p in front:
        ax.annotate(f"{p['trial']:03d}", (p["latency_ms"], p["metric"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    base = doc["baseline"]
    ax.scatter([base["latency_ms"]], [base["metric"]], marker="s", c="k", label="PyTorch fp32")
    ref = doc["reference_int8"]
    if ref and ref.get("latency_ms"):
        ax.scatter([ref["latency_ms"]], [ref["metric"]], marker="D", c="tab:blue", label="INT8 reference (default recipe)")
    opt = doc.get("optimum_int8")
    if opt and opt.get("latency_ms"):
        ax.scatter([opt["latency_ms"]], [opt["metric"]], marker="^", c="tab:green", label="dynamic INT8, optimum's settings")
    ax.set_xscale("log")
    ax.set_xlabel("latency, batch 1, median ms (log)")
    ax.set_ylabel(f"{doc['metric']['name']} (validation)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(out: Path, doc: dict, base_evaluation: dict) -> None:
    write_json(out / "search.json", doc)
    write_text_atomic(out / "search.md", markdown(doc))
    plot(doc, out / "pareto.png")
    text = best_recipe_yaml(doc, base_evaluation)
    if text:
        write_text_atomic(out / BEST_RECIPE, text)
