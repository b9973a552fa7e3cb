"""The INT8 accuracy budget (``quantize --max-accuracy-drop``): the most harmful GEMMs go back to float,
one ranked step at a time, until the task metric's drop on the budget rows fits; among the candidates that
pass, the fastest at batch 1 wins (fewest float GEMMs between near-equals)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from xformopt import accuracy_budget, progress
from xformopt.onnx_graph import load_graph, weighted_gemms
from xformopt.passes import calibration as cal
from xformopt.passes.base import PassContext, PassOptions
from xformopt.passes.fewest import fewest_that_pass
from xformopt.passes.timing import preferred_within_tolerance, time_stage_dirs
from xformopt.runtime.encoder import OrtPredictor


def allowed_drop(budget: float | str, float_points: float) -> float:
    """The budget in metric points: absolute, or a percentage of the float graph's value."""
    return accuracy_budget.points(budget, float_points)


def budget_outputs(ctx: PassContext, model_dir: Path, tokenizer_dir: Path, dataset, label: str) -> np.ndarray:
    return OrtPredictor(ctx.spec, model_dir, threads=ctx.threads, tokenizer_dir=tokenizer_dir).predict_data(
        dataset, progress=progress.tracker(label))


def budget_metric(ctx: PassContext, model_dir: Path, tokenizer_dir: Path, dataset, reference: np.ndarray | None) -> float:
    """The task metric in points (0-100) on the budget split (the task decides: its metric where the
    rows are labelled, else agreement with the float graph's outputs ``reference``)."""
    return budget_evaluation(ctx, model_dir, tokenizer_dir, dataset, reference)[0]


def budget_evaluation(ctx: PassContext, model_dir: Path, tokenizer_dir: Path, dataset,
                      reference: np.ndarray | None) -> tuple[float, dict]:
    """``budget_metric`` and the measures behind it where the task combines several (embeddings: cosine,
    recall@k, probe accuracy; Task.budget_components)."""
    task = ctx.spec.task_def
    out = budget_outputs(ctx, model_dir, tokenizer_dir, dataset, f"budget: scoring {model_dir.name} (rows)")
    parts = task.budget_components(out, reference, dataset) if reference is not None else {}
    return task.budget_points(out, reference, dataset)[1], parts


def float_reference(ctx: PassContext, src: Path, dataset) -> np.ndarray:
    return budget_outputs(ctx, src, src, dataset, "budget: float reference (rows)")


TIMING_TOLERANCE = 0.05


def budget_search(ctx, options: PassOptions, formats: dict, src: Path, work: Path, build, prepared: Path,
                  ranges: dict | None, harm_reader) -> tuple[Path, dict]:
    """Return the most harmful GEMMs to float until the metric drop fits the budget; the fastest passing wins."""
    task = ctx.spec.task_def
    dataset = cal.load_split(options.budget_data, "validation", ctx.spec, options.budget_limit, 0, labels=True)
    reference = float_reference(ctx, src, dataset)
    float_points = budget_metric(ctx, src, src, dataset, reference)
    allowed = allowed_drop(options.max_accuracy_drop, float_points)
    metric = task.budget_points(reference, reference, dataset)[0]
    ctx.log(f"accuracy budget: {metric} of the float graph {float_points:.2f} on {len(dataset)} budget rows; "
            f"allowed drop {allowed:.3f} points")

    candidates = [g for g in weighted_gemms(load_graph(src / "model.onnx")) if g["has_weight"]
                  and g["name"] not in options.exclude_nodes]
    max_float = len(candidates) // 2 if options.max_float_nodes is None else min(options.max_float_nodes, len(candidates))
    tried: list[dict] = []
    dirs: dict[int, Path] = {}

    def attempt(k: int, ranked: list[str]) -> dict:
        out = work / f"candidate-{k}"
        if k:
            build(out, [*options.exclude_nodes, *ranked[:k]])
        started = time.perf_counter()
        points, parts = budget_evaluation(ctx, out, src, dataset, reference)
        row = {"float_nodes": k, "kept_float": ranked[:k], "metric": round(points, 4),
               "drop": round(float_points - points, 4), "passes": float_points - points <= allowed + 1e-9,
               "eval_seconds": round(time.perf_counter() - started, 2), **({"components": parts} if parts else {})}
        ctx.log(f"budget candidate with {k} node(s) in float: {metric} {points:.2f} "
                f"(drop {row['drop']:.3f}, {'within' if row['passes'] else 'over'} budget)")
        tried.append(row)
        dirs[k] = out
        return row

    ranking: list[dict] = []
    ranked: list[str] = []
    row = attempt(0, ranked)
    if not row["passes"] and max_float > 0:
        started = time.perf_counter()
        harm_reader = harm_reader or cal.dataset_reader(ctx.spec, src, dataset)
        scores = cal.harm_scores(prepared, candidates, harm_reader, formats, ranges, work)
        ops = {g["name"]: g["op"] for g in candidates}
        ranking = [{"name": n, "op": ops[n], "harm": round(h, 6)} for n, h in sorted(scores.items(), key=lambda kv: -kv[1])]
        ranked = [r["name"] for r in ranking]
        ctx.log(f"ranked {len(ranked)} GEMMs by harm in {time.perf_counter() - started:.1f}s; most harmful: "
                + ", ".join(f"{r['name']} ({r['harm']:.4f})" for r in ranking[:3]))
        fewest_that_pass(lambda k: attempt(k, ranked)["passes"], max_float)

    passing = [r for r in tried if r["passes"]]
    timings: dict = {}
    if len(passing) > 1 and ctx.host_runs_target:
        ctx.log(f"timing {len(passing)} passing candidates interleaved at batch 1 ({options.timing_rounds} rounds)")
        timings = time_stage_dirs(ctx, {f"float{r['float_nodes']}": dirs[r["float_nodes"]] for r in passing},
                                  options.timing_rounds, data=dataset, tokenizer_dir=src)
        for r in passing:
            r["median_ms"] = round(timings[f"float{r['float_nodes']}"]["median_ms"], 4)
        # Like fuse: between near-equals (timing noise at batch 1) the most-quantized candidate wins.
        by_nodes = {r["float_nodes"]: r for r in passing}
        best = by_nodes[preferred_within_tolerance({k: r["median_ms"] for k, r in by_nodes.items()},
                                                   sorted(by_nodes), TIMING_TOLERANCE)]
        reason = (f"fewest float nodes among passing candidates within {TIMING_TOLERANCE:.0%} of the fastest "
                  f"median at batch 1 (interleaved)")
    elif passing:
        best = min(passing, key=lambda r: r["float_nodes"])
        reason = "the only passing candidate" if len(passing) == 1 else "fewest float nodes (host lacks the target: not timed)"
    else:
        best = min(tried, key=lambda r: (r["drop"], r["float_nodes"]))
        reason = f"no candidate within budget (up to {max_float} nodes in float); wrote the smallest drop"
    harm = {r["name"]: r for r in ranking}
    budget = {
        "budget_met": bool(passing),
        "max_accuracy_drop": options.max_accuracy_drop,
        "allowed_drop_points": round(allowed, 4),
        "metric": metric,
        "float_metric": round(float_points, 4),
        "metric_after": best["metric"],
        "drop": best["drop"],
        "data": cal.dataset_record(dataset, "budget"),
        "max_float_nodes": max_float,
        "kept_float": [{"name": n, "op": harm[n]["op"], "harm": harm[n]["harm"],
                        "why": f"harm rank {i + 1} of {len(ranking)}"} for i, n in enumerate(best["kept_float"])],
        "harm_ranking": ranking,
        "search": tried,
        "chosen": best["float_nodes"],
        "reason": reason,
    }
    ctx.log(f"budget {'met' if passing else 'NOT met'}: {metric} {best['metric']:.2f} (drop {best['drop']:.3f} "
            f"<= {allowed:.3f}? {bool(passing)}), {best['float_nodes']} node(s) in float; {reason}")
    return dirs[best["float_nodes"]], budget
