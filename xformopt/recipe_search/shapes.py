"""The shape chosen per task: with ``--max-accuracy-drop P``, a compressing recipe (prune -> distill ->
... with a ``shape_search`` section) tries its listed prune shapes and keeps the fastest artifact
within P of the PyTorch fp32 model on the validation rows.

Order and stop rule. Latency at batch 1 follows the encoder's FLOPs (the layers' GEMMs are the bulk of
the time once attention is fused), so the shapes are tried from the fewest FLOPs up and the first one
within P is kept: every cheaper shape was tried and missed. A shape whose run would not fit in what is
left of ``shape_search.max_minutes`` (estimated from the runs so far) is not started. When no shape
meets P the most accurate one tried is kept and the record says so (the quantize pass's own budget
still applies to it). Each drop carries its paired 95% bootstrap interval over the validation rows
(where the task's headline is a mean over rows): the budget is held on the point estimate, and the
record warns when the kept shape's interval reaches past it, i.e. when the rows cannot resolve P.

Machinery: a step ``optimize`` takes between checking its inputs (``pipeline.prepare``) and running the
kept recipe. Each shape is the run's recipe object with its shaping (and timed) step's options changed
(:meth:`Candidate.apply`, checked by the pass's options model), run by
:func:`~xformopt.recipe_search.trial.run_trial` into ``DIR.shape-search/NNN`` (the shared pass cache keeps its
prune/distill/export/fuse/quantize stages), scored on the validation rows by
:func:`~xformopt.recipe_search.trial.score_artifact` against the fp32 baseline; the tried artifacts are then timed
interleaved (:func:`~xformopt.recipe_search.remeasure.remeasure`) for the record. The final artifact is the
kept shape's recipe run again by the pipeline: every pass comes from the cache, the report's evaluation
runs as for any recipe.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xformopt import recipe as recipes
from xformopt.accuracy_budget import points
from xformopt.errors import InputError
from xformopt.measure.host import usable_cpus
from xformopt.passes import get_pass
from xformopt.passes.prune.flops import Shape, config_shape, encoder_flops
from xformopt.pipeline import Prepared
from xformopt.recipe_search.pretrained import PretrainedChoice, locate_students
from xformopt.recipe_search.remeasure import remeasure
from xformopt.recipe_search.shape_order import time_shapes
from xformopt.recipe_search.trial import TrialJob, run_trial, score_outputs, validation_set
from xformopt.runtime.encoder import TorchPredictor
from xformopt.scoring.metrics import mean_with_bootstrap

_log = logging.getLogger(__name__)

SHAPE_KEYS = ("layers", "heads_per_layer", "ffn_dim", "hidden_size", "layers_fraction", "heads_fraction", "ffn_fraction",
              "hidden_fraction")
TRIAL_TIMING = {"latency_rounds": 10, "warmup": 2, "repeats": 1, "modes": ["real"]}
WORK_MARKER = ".xformopt-shape-search"
FIRST_RUN_OVERHEAD_S = 180.0  # prune, export, fuse, quantize and scoring beside distill (2-core CPU, MiniLM)


def wanted(recipe: recipes.Recipe, max_accuracy_drop) -> bool:
    return max_accuracy_drop is not None and recipe.shape_search is not None


def validation_spec(recipe: recipes.Recipe) -> dict:
    """The validation rows: the run's --validation-data (the first pass option it set: distill's eval_data,
    quantize's budget_data), else the task's validation split."""
    options = (s.options.get(get_pass(s.name).flags.get("validation_data")) for s in recipe.passes)
    data = next((value for value in options if value), None)
    ev = recipe.evaluation
    return {"data": data, "text_column": ev.text_column, "label_column": ev.label_column, "seed": ev.seed}


@dataclass
class Candidate:
    """One shape to try: the shape itself (or ``{"student": name}``, a pretrained student), the minutes of the
    timed step (None: the recipe's), what it changes in the recipe's steps (step name -> options) and the steps
    it drops (a pretrained student replaces the shaping step's model)."""

    shape: dict
    minutes: float | None
    changes: dict[str, dict]
    untrained_ms: float | None = None  # the shape's untrained student timed on this host (order: measured)
    drops: tuple[str, ...] = ()
    student: PretrainedChoice | None = None

    def apply(self, recipe: recipes.Recipe) -> recipes.Recipe:
        """``recipe`` with this shape (each changed step checked by its pass's options model)."""
        for step in self.drops:
            recipe = recipe.without_step(step)
        for step, options in self.changes.items():
            recipe = recipe.with_step_options(step, options)
        return recipe


def candidates(recipe: recipes.Recipe) -> list[Candidate]:
    shaped, timed = recipes.shaped_step(recipe), recipes.timed_step(recipe)
    owner = get_pass(shaped.name)
    out = []
    for choice in recipe.shape_search.shapes:
        if choice.student is not None:
            taker = recipes.student_step(recipe).name
            changes = {taker: {get_pass(taker).student_option: choice.student}}
            shape, drops = {"student": choice.student}, (shaped.name,)
        else:
            shape = {k: getattr(choice, k) for k in SHAPE_KEYS}
            changes, drops = {shaped.name: {**shape, **{k: None for k in owner.shape_replaces}}}, ()
        if choice.distill_minutes is not None:
            changes.setdefault(timed.name, {})[get_pass(timed.name).minutes_option] = choice.distill_minutes
        out.append(Candidate(shape, choice.distill_minutes, changes, drops=drops))
    return out


def absolute_shape(config: dict, shape: dict) -> Shape:
    """A shape's kept dimensions (absolute or fractions; None: the model's) as the prune pass resolves them
    (xformopt/passes/prune/relative.py; a narrower hidden size keeps hidden / head size heads)."""
    full = config_shape(config)

    def kept(absolute: str, fraction: str, size: int) -> int:
        if shape.get(absolute):
            return min(int(shape[absolute]), size)
        return max(1, round(shape[fraction] * size)) if shape.get(fraction) else size

    hd = full.head_dim
    hidden = kept("hidden_size", "hidden_fraction", full.hidden)
    hidden = min(max(hd, round(hidden / hd) * hd), full.hidden)
    heads = hidden // hd if hidden < full.hidden else kept("heads_per_layer", "heads_fraction", full.heads[0])
    layers = kept("layers", "layers_fraction", full.num_layers)
    ffn = kept("ffn_dim", "ffn_fraction", full.ffn[0])
    return Shape(hidden, hd, [heads] * layers, [ffn] * layers)


def candidate_shape(config: dict, candidate: Candidate) -> Shape:
    """What a candidate's student is: the pruned shape resolved against ``config``, or a pretrained student's own."""
    return candidate.student.shape if candidate.student is not None else absolute_shape(config, candidate.shape)


def candidate_flops(config: dict, candidate: Candidate, length: float = 32.0) -> float:
    return encoder_flops(candidate_shape(config, candidate), length)["total"]


def shape_flops(config: dict, shape: dict, length: float = 32.0) -> float:
    """Encoder FLOPs of a shape at ``length`` tokens (xformopt/passes/prune/flops.py's model)."""
    return encoder_flops(absolute_shape(config, shape), length)["total"]


def flops_share(config: dict, shape: dict, length: float = 32.0) -> float:
    """The shape's share of the unpruned model's encoder FLOPs at ``length`` tokens."""
    return shape_flops(config, shape, length) / encoder_flops(config_shape(config), length)["total"]


def label(candidate: Candidate, config: dict | None = None) -> str:
    """``3 layers x 8 heads x FFN 512 x hidden 384`` (resolved against ``config`` when given); a pretrained
    student as ``pretrained minilm: 6 layers x ...``."""
    prefix = f"pretrained {candidate.shape['student']}: " if candidate.shape.get("student") else ""
    if config is not None:
        s = candidate_shape(config, candidate)
        text = prefix + f"{s.num_layers} layers x {s.heads[0]} heads x FFN {s.ffn[0]} x hidden {s.hidden}"
    elif prefix:
        text = prefix.rstrip(": ")
    else:
        shape = candidate.shape
        text = " x ".join(f"{k} {v:g}" for k, v in shape.items() if v is not None) or "the model's shape"
    return text + (f", distill {candidate.minutes:g} min" if candidate.minutes else "")


def _fresh_work_dir(out: Path) -> Path:
    """The folder the trials are written to, beside ``out``, emptied (only when this search wrote it)."""
    work = Path(str(out).rstrip("/") + ".shape-search")
    if work.exists():
        if not (work / WORK_MARKER).is_file():  # never remove a folder this search did not write
            raise InputError(f"{work} exists and is not a shape search's trial folder (the search writes its trials "
                             "there): move it, or choose another -o")
        shutil.rmtree(work)
    work.mkdir(parents=True)
    (work / WORK_MARKER).write_text(f"the trials of xformopt's shape search for {out}\n")
    return work


@dataclass
class _Baseline:
    """The PyTorch fp32 model on the validation rows: what every tried shape's drop is measured against."""

    validation: dict  # the validation spec each trial scores on (with the baseline outputs' file)
    vdata: object
    metric: float
    rows: object  # per-row scores, for the paired interval of a drop
    allowed: float  # the budget in points


def _score_baseline(spec, recipe: recipes.Recipe, max_accuracy_drop, work: Path, threads: int) -> _Baseline:
    validation = validation_spec(recipe)
    vdata = validation_set(spec, validation)
    _log.info(f"shape search: scoring the PyTorch fp32 model on {len(vdata)} validation rows ({vdata.source})")
    base_out = TorchPredictor(spec, threads=threads).predict_data(vdata)
    np.save(work / "baseline_outputs.npy", base_out.astype(np.float32), allow_pickle=False)
    validation["baseline"] = str((work / "baseline_outputs.npy").resolve())
    baseline = score_outputs(spec, base_out, vdata, base_out)
    base_rows = spec.task_def.row_scores(base_out, vdata)
    allowed = points(max_accuracy_drop, baseline * 100)
    return _Baseline(validation, vdata, baseline, base_rows, allowed)


def _try_shapes(ready: Prepared, model: str, recipe: recipes.Recipe, tries: list[Candidate], config: dict,
                base: _Baseline, work: Path, started: float, trust_remote_code: bool) -> tuple[list[dict], dict | None]:
    """Run the shapes fewest FLOPs first until one is within the budget (or none is left that fits the time);
    returns every entry tried or skipped, and the one within the budget (None when none was)."""
    spec, budget_s = ready.spec, recipe.shape_search.max_minutes * 60
    plain = recipe.without_shape_search()
    tried, kept = [], None
    timed = recipes.timed_step(plain)
    default_minutes = timed.options.get(get_pass(timed.name).minutes_option) if timed else None
    for n, candidate in enumerate(tries):
        resolved = candidate_shape(config, candidate)
        flops = encoder_flops(resolved, 32.0)["total"]
        entry = {"shape": candidate.shape, "student_kind": "pretrained" if candidate.student else "pruned",
                 "distill_minutes": candidate.minutes or default_minutes,
                 "flops_at_32_tokens": round(flops),
                 "flops_share_of_teacher": round(flops / encoder_flops(config_shape(config), 32.0)["total"], 4),
                 "untrained_ms": candidate.untrained_ms,
                 "resolved": {"layers": resolved.num_layers, "heads_per_layer": resolved.heads[0],
                              "ffn_dim": resolved.ffn[0], "hidden_size": resolved.hidden}}
        elapsed = time.monotonic() - started
        done = [t for t in tried if "seconds" in t]
        overhead = (float(np.mean([t["seconds"] - (t["distill_minutes"] or 0) * 60 for t in done])) if done
                    else FIRST_RUN_OVERHEAD_S)
        estimate = max(60.0, overhead) + (entry["distill_minutes"] or 0.0) * 60
        if elapsed + estimate > budget_s:
            tried.append({**entry, "status": "skipped",
                          "why": f"would not fit: about {estimate / 60:.1f} min left to run, "
                                 f"{(budget_s - elapsed) / 60:.1f} min left of the budget"})
            _log.info(f"shape search: {label(candidate, config)}: skipped (would not fit in the time left)")
            continue
        # the report's own timing of each tried artifact is not used (they are timed together below):
        # a short one; the evaluation rows stay the run's, so the final run reuses every pass from the cache
        r = candidate.apply(plain).model_copy(update={"name": f"{recipe.name}-shape-{n:02d}"}).with_evaluation(**TRIAL_TIMING)
        _log.info(f"shape search [{n + 1}/{len(tries)}]: {label(candidate, config)}")
        result = run_trial(TrialJob(n, model, r, str((work / f"{n:03d}").resolve()), None, base.validation,
                                    trust_remote_code))
        entry.update({k: result[k] for k in ("status", "metric", "seconds", "budget_met", "error") if k in result})
        entry["candidate"] = candidate
        if result["status"] == "complete":
            drop = round((base.metric - result["metric"]) * 100, 4)
            entry["drop_points"] = drop
            entry["within_budget"] = drop <= base.allowed + 1e-9
            entry.update(drop_interval(spec, result.get("validation_outputs"), base.vdata, base.rows, recipe.evaluation.seed))
            _log.info(f"shape search: {label(candidate, config)}: validation {result['metric']:.4f} ({drop:+.2f} points below fp32; "
                f"{'within' if entry['within_budget'] else 'outside'} the budget) in {result['seconds'] / 60:.1f} min")
        else:
            _log.info(f"shape search: {label(candidate, config)}: failed: {result.get('error')}")
        tried.append(entry)
        if entry.get("within_budget"):
            kept = entry
            break
    return tried, kept


def _kept_and_why(tried: list[dict], kept: dict | None, base: _Baseline, work: Path) -> tuple[dict, str]:
    """The shape kept (the first within the budget, else the most accurate run) and why, in words."""
    allowed, vdata = base.allowed, base.vdata
    complete = [t for t in tried if t.get("status") == "complete"]
    if not complete:
        shutil.rmtree(work, ignore_errors=True)
        raise InputError("shape search: no shape could be run (" + "; ".join(
            t.get("error") or t.get("why", "?") for t in tried) + "); see the log")
    if kept is None:
        kept = max(complete, key=lambda t: t["metric"])
        why = (f"no shape was within {allowed:.2f} points on the validation rows; kept the most accurate one tried "
               f"({kept['drop_points']:+.2f} points)")
    else:
        earlier = [t for t in tried if t is not kept]
        why = (f"the first shape tried within {allowed:.2f} points on the validation rows ({kept['drop_points']:+.2f})"
               + (f"; {len(earlier)} shape(s) tried before it (faster or fewer FLOPs) missed the budget or did not fit "
                  "the time" if earlier else "; the first shape in the order"))
    unresolved = kept.get("drop_ci95") and kept["drop_ci95"][1] > allowed
    if unresolved:  # the choice stands (the budget is on the point estimate); the record says how sure it is
        lo, hi = kept["drop_ci95"]
        why += (f"; on these {len(vdata)} rows the drop's 95% interval is {lo:+.2f} to {hi:+.2f} points, wider than the "
                "budget: more validation rows would narrow it")
        _log.info(f"shape search: warning: {len(vdata)} validation rows cannot resolve a {allowed:.2f}-point budget (the kept "
            f"shape's drop: 95% interval {lo:+.2f} to {hi:+.2f} points); pass more rows with --validation-data")
    return kept, why


def choose(ready: Prepared, model: str, recipe: recipes.Recipe, max_accuracy_drop, out: Path, *,
           trust_remote_code: bool) -> tuple[recipes.Recipe, dict]:
    """Run the shape search on inputs ``pipeline.prepare`` has checked (``ready``); returns the kept shape's
    recipe (shape_search dropped) and the record."""
    search = recipe.shape_search
    spec = ready.spec
    config = json.loads((Path(spec.path) / "config.json").read_text())
    tries, unavailable = locate_students(candidates(recipe), config, spec.task_def.torch_objective == "embedding")
    if not tries:
        raise InputError("shape search: no shape left to try (" + "; ".join(
            f"{t['shape']['student']}: {t['why']}" for t in unavailable) + ")")
    tries = sorted(tries, key=lambda c: candidate_flops(config, c))
    work = _fresh_work_dir(out)
    started = time.monotonic()
    threads = recipe.evaluation.threads or usable_cpus()
    base = _score_baseline(spec, recipe, max_accuracy_drop, work, threads)
    tries, ordering = _ordered(ready, recipe, tries, base, threads)
    _log.info(f"shape search: fp32 validation metric {base.metric:.4f}; budget {base.allowed:.2f} points; {len(tries)} "
              f"shapes, {ORDER_TEXT[search.order]}, within {search.max_minutes:g} min")
    tried, kept = _try_shapes(ready, model, recipe, tries, config, base, work, started, trust_remote_code)
    kept, why = _kept_and_why(tried, kept, base, work)
    tried += unavailable  # after the trials: a trial's folder is numbered by its place in ``tried``
    for t in tried:
        t["kept"] = t is kept
    latency = _time_tried(spec, work, tried, base.vdata, threads, recipe.evaluation.seed)
    record = {
        "max_accuracy_drop": max_accuracy_drop, "allowed_points": round(base.allowed, 4),
        "validation": {"source": base.vdata.source, "rows": len(base.vdata), "fp32_metric": round(base.metric, 6)},
        "order": f"{ORDER_TEXT[search.order]}; stop at the first within the budget",
        "ordering": ordering,
        "max_minutes": search.max_minutes, "seconds": round(time.monotonic() - started, 1),
        "tried": [{k: v for k, v in t.items() if k != "candidate"} for t in tried],
        "latency": latency, "kept": kept["shape"], "why": why,
    }
    if not search.keep_trials:
        shutil.rmtree(work, ignore_errors=True)
    return kept["candidate"].apply(recipe.without_shape_search()), record  # the run's own evaluation settings


ORDER_TEXT = {"measured": "fastest first as measured on this host (untrained students, fused fp32, batch 1)",
              "flops": "fewest encoder FLOPs first"}


def _ordered(ready: Prepared, recipe: recipes.Recipe, tries: list[Candidate], base: _Baseline,
             threads: int) -> tuple[list[Candidate], dict | None]:
    """``tries`` (fewest FLOPs first) in the order the search runs them, and how it was measured (None: by FLOPs).
    A failed measurement falls back to FLOPs and says so."""
    if recipe.shape_search.order != "measured":
        return tries, None
    shaper = recipes.shaped_step(recipe).name
    try:
        timing = time_shapes(ready.spec, ready.target, [c.shape for c in tries], list(base.vdata.texts[:64]), threads,
                             shaper)
    except Exception as exc:  # noqa: BLE001 -- the order informs the search; FLOPs order it when timing fails
        _log.info(f"shape search: shapes not timed ({type(exc).__name__}: {exc}); fewest FLOPs first")
        return tries, {"error": f"{type(exc).__name__}: {exc}"[:500]}
    for candidate, ms in zip(tries, timing["median_ms"]):
        candidate.untrained_ms = ms
    ordered = [c for _, c in sorted(enumerate(tries), key=lambda p: (timing["median_ms"][p[0]], p[0]))]
    return ordered, timing


def drop_interval(spec, outputs: str | None, vdata, base_rows, seed: int) -> dict:
    """The paired 95% interval of a tried artifact's drop below fp32 on the validation rows (a bootstrap over
    the rows both models scored; ``outputs``: the trial's saved outputs on them), in points; {} where the
    task's headline is not a mean over rows."""
    if base_rows is None or not outputs:
        return {}
    rows = spec.task_def.row_scores(np.load(outputs, allow_pickle=False), vdata)
    lo, hi = mean_with_bootstrap(base_rows - rows, seed)["ci95"]
    return {"drop_ci95": [round(100 * lo, 2), round(100 * hi, 2)]}


def _time_tried(spec, work: Path, tried: list[dict], vdata, threads: int, seed: int) -> dict | None:
    """The tried artifacts timed interleaved at batch 1 on validation texts (the record's latency column)."""
    paths = {f"shape-{i:03d}": work / f"{i:03d}" for i, t in enumerate(tried)
             if t.get("status") == "complete" and (work / f"{i:03d}" / "model.onnx").is_file()}
    if not paths:
        return None
    rows = min(100, len(vdata))
    try:
        measured = remeasure(spec, paths, vdata.texts[:rows], vdata.text_pairs[:rows] if vdata.text_pairs else None,
                             rounds=30, warmup=5, threads=threads, seed=seed, include_pytorch=False)
    except Exception as exc:  # noqa: BLE001 - the timings inform the record; the choice is made already
        _log.info(f"shape search: tried artifacts not timed ({type(exc).__name__}: {exc})")
        return None
    for i, t in enumerate(tried):
        stats = measured["latency"].get(f"shape-{i:03d}")
        if stats:
            t["latency_ms"] = round(stats["median_ms"], 3)
    return {k: measured[k] for k in ("mode", "batch", "rounds", "rows", "threads")}
