"""The INT8 accuracy budget (``quantize --max-accuracy-drop``): the most harmful GEMMs go back to float,
one ranked step at a time, until the task metric's drop on the budget rows fits; among the candidates that
pass, the fastest at batch 1 wins (fewest float GEMMs between near-equals)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from xformopt import accuracy_budget, progress
from xformopt.onnx_graph import load_graph, weighted_gemms
from xformopt.passes.base import PassContext, PassOptions
from xformopt.passes.fewest import fewest_that_pass
from xformopt.passes.quantize import calibration as cal
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


@dataclass
class BudgetSearch:
    """What the search's steps share: the budget rows, the float graph's figures and every candidate tried
    (its record row in ``tried``, its directory in ``dirs``, both by the number of GEMMs kept in float)."""

    ctx: PassContext
    options: PassOptions
    src: Path
    work: Path
    build: Callable[[Path, list[str]], object]
    dataset: object
    reference: np.ndarray
    float_points: float
    allowed: float
    metric: str
    tried: list[dict] = field(default_factory=list)
    dirs: dict[int, Path] = field(default_factory=dict)

    def attempt(self, k: int, ranked: list[str]) -> dict:
        """Build (k > 0) and score the graph with the ``k`` most harmful GEMMs in float; record its row."""
        out = self.work / f"candidate-{k}"
        if k:
            self.build(out, [*self.options.exclude_nodes, *ranked[:k]])
        started = time.perf_counter()
        points, parts = budget_evaluation(self.ctx, out, self.src, self.dataset, self.reference)
        row = {"float_nodes": k, "kept_float": ranked[:k], "metric": round(points, 4),
               "drop": round(self.float_points - points, 4), "passes": self.float_points - points <= self.allowed + 1e-9,
               "eval_seconds": round(time.perf_counter() - started, 2), **({"components": parts} if parts else {})}
        self.ctx.log(f"budget candidate with {k} node(s) in float: {self.metric} {points:.2f} "
                     f"(drop {row['drop']:.3f}, {'within' if row['passes'] else 'over'} budget)")
        self.tried.append(row)
        self.dirs[k] = out
        return row


def start_search(ctx: PassContext, options: PassOptions, src: Path, work: Path, build) -> BudgetSearch:
    """Load the budget rows and score the float graph on them: the metric, its value and the allowed drop."""
    task = ctx.spec.task_def
    dataset = cal.load_split(options.budget_data, "validation", ctx.spec, options.budget_limit, 0, labels=True)
    reference = float_reference(ctx, src, dataset)
    float_points = budget_metric(ctx, src, src, dataset, reference)
    allowed = allowed_drop(options.max_accuracy_drop, float_points)
    metric = task.budget_points(reference, reference, dataset)[0]
    ctx.log(f"accuracy budget: {metric} of the float graph {float_points:.2f} on {len(dataset)} budget rows; "
            f"allowed drop {allowed:.3f} points")
    return BudgetSearch(ctx, options, src, work, build, dataset, reference, float_points, allowed, metric)


def float_candidates(src: Path, options: PassOptions) -> tuple[list[dict], int]:
    """The weighted GEMMs the budget may return to float, and how many of them at most."""
    candidates = [g for g in weighted_gemms(load_graph(src / "model.onnx")) if g["has_weight"]
                  and g["name"] not in options.exclude_nodes]
    max_float = len(candidates) // 2 if options.max_float_nodes is None else min(options.max_float_nodes, len(candidates))
    return candidates, max_float


def rank_by_harm(search: BudgetSearch, candidates: list[dict], prepared: Path, formats: dict, ranges: dict | None,
                 harm_reader) -> list[dict]:
    """The candidate GEMMs, most harmful (to the outputs, when quantized) first."""
    started = time.perf_counter()
    harm_reader = harm_reader or cal.dataset_reader(search.ctx.spec, search.src, search.dataset)
    scores = cal.harm_scores(prepared, candidates, harm_reader, formats, ranges, search.work)
    ops = {g["name"]: g["op"] for g in candidates}
    ranking = [{"name": n, "op": ops[n], "harm": round(h, 6)} for n, h in sorted(scores.items(), key=lambda kv: -kv[1])]
    search.ctx.log(f"ranked {len(ranking)} GEMMs by harm in {time.perf_counter() - started:.1f}s; most harmful: "
                   + ", ".join(f"{r['name']} ({r['harm']:.4f})" for r in ranking[:3]))
    return ranking


def time_passing(search: BudgetSearch, passing: list[dict]) -> dict:
    """Time the passing candidates interleaved at batch 1; the most-quantized near-equal of the fastest wins."""
    options = search.options
    search.ctx.log(f"timing {len(passing)} passing candidates interleaved at batch 1 ({options.timing_rounds} rounds)")
    timings = time_stage_dirs(search.ctx, {f"float{r['float_nodes']}": search.dirs[r["float_nodes"]] for r in passing},
                              options.timing_rounds, data=search.dataset, tokenizer_dir=search.src)
    for r in passing:
        r["median_ms"] = round(timings[f"float{r['float_nodes']}"]["median_ms"], 4)
    # Like fuse: between near-equals (timing noise at batch 1) the most-quantized candidate wins.
    by_nodes = {r["float_nodes"]: r for r in passing}
    return by_nodes[preferred_within_tolerance({k: r["median_ms"] for k, r in by_nodes.items()},
                                               sorted(by_nodes), TIMING_TOLERANCE)]


def pick_best(search: BudgetSearch, max_float: int) -> tuple[dict, str]:
    """The candidate to write and why: the fastest passing (timed where the host runs the target), else the
    fewest float nodes passing, else (budget missed) the smallest drop."""
    passing = [r for r in search.tried if r["passes"]]
    if len(passing) > 1 and search.ctx.host_runs_target:
        best = time_passing(search, passing)
        reason = (f"fewest float nodes among passing candidates within {TIMING_TOLERANCE:.0%} of the fastest "
                  f"median at batch 1 (interleaved)")
    elif passing:
        best = min(passing, key=lambda r: r["float_nodes"])
        reason = "the only passing candidate" if len(passing) == 1 else "fewest float nodes (host lacks the target: not timed)"
    else:
        best = min(search.tried, key=lambda r: (r["drop"], r["float_nodes"]))
        reason = f"no candidate within budget (up to {max_float} nodes in float); wrote the smallest drop"
    return best, reason


def budget_record(search: BudgetSearch, best: dict, reason: str, ranking: list[dict], max_float: int) -> dict:
    """The quantize record's ``budget`` entry (docs/report-schema.md)."""
    harm = {r["name"]: r for r in ranking}
    return {
        "budget_met": any(r["passes"] for r in search.tried),
        "max_accuracy_drop": search.options.max_accuracy_drop,
        "allowed_drop_points": round(search.allowed, 4),
        "metric": search.metric,
        "float_metric": round(search.float_points, 4),
        "metric_after": best["metric"],
        "drop": best["drop"],
        "data": cal.dataset_record(search.dataset, "budget"),
        "max_float_nodes": max_float,
        "kept_float": [{"name": n, "op": harm[n]["op"], "harm": harm[n]["harm"],
                        "why": f"harm rank {i + 1} of {len(ranking)}"} for i, n in enumerate(best["kept_float"])],
        "harm_ranking": ranking,
        "search": search.tried,
        "chosen": best["float_nodes"],
        "reason": reason,
    }


def budget_search(ctx, options: PassOptions, formats: dict, src: Path, work: Path, build, prepared: Path,
                  ranges: dict | None, harm_reader) -> tuple[Path, dict]:
    """Return the most harmful GEMMs to float until the metric drop fits the budget; the fastest passing wins."""
    search = start_search(ctx, options, src, work, build)
    candidates, max_float = float_candidates(src, options)
    ranking: list[dict] = []
    if not search.attempt(0, [])["passes"] and max_float > 0:
        ranking = rank_by_harm(search, candidates, prepared, formats, ranges, harm_reader)
        ranked = [r["name"] for r in ranking]
        fewest_that_pass(lambda k: search.attempt(k, ranked)["passes"], max_float)
    best, reason = pick_best(search, max_float)
    budget = budget_record(search, best, reason, ranking, max_float)
    met = budget["budget_met"]
    ctx.log(f"budget {'met' if met else 'NOT met'}: {search.metric} {best['metric']:.2f} (drop {best['drop']:.3f} "
            f"<= {search.allowed:.3f}? {met}), {best['float_nodes']} node(s) in float; {reason}")
    return search.dirs[best["float_nodes"]], budget
