"""The search driver: check everything, score the baseline and the reference INT8, run the trials
the sampler proposes on an executor, re-measure the front candidates serially, write the outputs.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from xformopt import progress as progress_events
from xformopt import recipe as recipes
from xformopt import sources, targets
from xformopt.accuracy_budget import points
from xformopt.atomic import write_text
from xformopt.benchmarking.optimum_reference import NAME, optimum_dynamic_int8
from xformopt.errors import InputError
from xformopt.measure import host as host_facts
from xformopt.recipe_search import front as fronts
from xformopt.recipe_search import outputs
from xformopt.recipe_search import sampler as samplers
from xformopt.recipe_search.executors import local
from xformopt.recipe_search.executors.ray import RayExecutor
from xformopt.recipe_search.remeasure import remeasure
from xformopt.recipe_search.space import SearchSpace
from xformopt.recipe_search.trial import (
    TrialJob,
    run_trial,
    score_artifact,
    score_outputs,
    validation_set,
)
from xformopt.runtime.encoder import TorchPredictor

_log = logging.getLogger(__name__)

CONFIG = "search-config.json"
REFERENCE = "reference-int8"  # the unpruned model through the `default` recipe: export -> fuse -> dynamic INT8
OPTIMUM = "optimum-int8"  # optimum's own dynamic INT8 of the unpruned model (xformopt/benchmarking/optimum_reference.py)


@dataclass
class Settings:
    model: str
    out: Path
    space: SearchSpace
    trials: int = 8
    objectives: list[str] = field(default_factory=lambda: ["accuracy", "latency"])
    max_accuracy_drop: float | str = 1.0
    sampler: str = "tpe"
    seed: int = 0
    ray: str | None = None
    workers: int | None = None
    cpus_per_trial: int = 1
    resume: bool = False
    force: bool = False
    remeasure_rounds: int = 200
    remeasure_rows: int = 200
    max_candidates: int = 16
    trust_remote_code: bool = False
    expand: bool = True  # after a trial with new prune/distill choices, run its fuse/quantize variants next


def trial_dir(out: Path, number: int) -> Path:
    return out / "trials" / f"{number:03d}"


def config_of(s: Settings, spec) -> dict:
    return {"model": s.model, "model_path": str(spec.path), "task": spec.task, "space": s.space.fingerprint(),
            "objectives": s.objectives, "sampler": s.sampler, "seed": s.seed}


def prepare_output(s: Settings, config: dict) -> None:
    """Refuse to mix searches: a non-empty DIR is continued (--resume, same model/space/seed),
    replaced (--force, only if it is a search directory), or an error."""
    out = s.out
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        if s.resume:
            raise InputError(f"--resume: {out} holds no search to continue; drop --resume to start one")
        return
    if not out.is_dir():
        raise InputError(f"{out} exists and is not a directory; choose another -o")
    previous = out / CONFIG
    if not previous.is_file():
        raise InputError(f"{out} exists and is not a search directory; choose another -o (it is left untouched)")
    if s.resume:
        old = json.loads(previous.read_text())
        changed = [k for k in config if old.get(k) != config[k]]
        if changed:
            raise InputError(f"--resume: {out} was searched with other {', '.join(changed)}; resume with the same "
                             "model, space, objectives, sampler and seed, or choose another -o")
        return
    if not s.force:
        raise InputError(f"{out} already holds a search; pass --resume to continue it or --force to replace it")
    shutil.rmtree(out)


def make_executor(s: Settings, cpus: int):
    if s.ray:
        return RayExecutor(s.ray, s.cpus_per_trial, s.workers)

    return local.make(s.workers or max(1, cpus // s.cpus_per_trial))


def baseline_on_validation(s: Settings, spec, validation: dict, threads: int) -> tuple:
    """The PyTorch fp32 model's metric on the validation rows; for embeddings, its outputs are the
    reference every trial's cosine is taken against (saved as .npy in DIR, which workers read)."""
    import numpy as np

    data = validation_set(spec, validation)
    path = s.out / "validation" / "baseline_outputs.npy"
    if path.is_file():
        outputs = np.load(path, allow_pickle=False)
    else:
        _log.info(f"scoring the PyTorch fp32 baseline on {len(data)} validation rows")
        outputs = TorchPredictor(spec, threads=threads).predict_data(data)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, outputs.astype(np.float32), allow_pickle=False)
    validation["baseline"] = str(path.resolve())  # metrics that compare with fp32 read it
    return score_outputs(spec, outputs, data, outputs), len(data), data


def canonical(recipe: dict) -> str:
    return json.dumps(recipe["passes"], sort_keys=True, default=str)


def search(s: Settings) -> dict:
    """Run (or continue) the search; returns the search.json document (also written to DIR)."""
    optuna = samplers.require_optuna()
    spec = sources.resolve(s.model, s.space.base.task, trust_remote_code=s.trust_remote_code)
    spec.task_def.refuse("search", f"{s.model} is a {spec.task} model ({spec.model_type})")
    config = config_of(s, spec)
    prepare_output(s, config)
    cpus = host_facts.usable_cpus()
    executor = make_executor(s, cpus)  # a missing Ray, or no cluster at --ray, fails here: before any work
    # A Ray trial uses the CPUs it declared; a local one its share of this host's.
    threads = s.cpus_per_trial if s.ray else max(s.cpus_per_trial, cpus // executor.workers)
    s.out.mkdir(parents=True, exist_ok=True)
    (s.out / "trials").mkdir(exist_ok=True)
    write_text(s.out / CONFIG, json.dumps(config, indent=2) + "\n")
    cache_dir = os.environ.get("XFORMOPT_CACHE_DIR")
    validation = dict(s.space.validation)
    aborted = True  # until the trials are in: an interruption must not wait minutes for running trials
    try:
        baseline_metric, validation_rows, vdata = baseline_on_validation(s, spec, validation, cpus)
        allowed = points(s.max_accuracy_drop, baseline_metric * 100)
        _log.info(f"baseline (PyTorch fp32) on validation: {baseline_metric:.4f}; budget {allowed:.2f} points")

        def job_for(number: int | str, r, out: Path) -> TrialJob:
            rd = r.to_dict()
            rd["evaluation"]["threads"] = threads
            return TrialJob(number, str(Path(s.model).resolve()) if Path(s.model).exists() else s.model, rd, str(out.resolve()),
                            cache_dir, validation, s.trust_remote_code)

        reference = reference_int8(s, job_for)
        optimum = optimum_int8(s, spec, validation, threads)
        study = samplers.open_study(s.out, s.sampler, s.seed, s.objectives, s.resume)
        trials = run_trials(s, study, executor, job_for, optuna)
        aborted = False
    finally:
        executor.close(abort=aborted)
    complete = [t for t in trials if t["status"] == "complete"]
    if not complete:
        raise InputError(f"no trial completed ({len(trials)} failed: {trials[0].get('error') if trials else 'none ran'}); "
                         "see the trial errors in the log and fix the space")
    unique = [t for t in complete if "duplicate_of" not in t]
    # Front after front (by the noisy parallel latencies) until max_candidates: quiet timing is cheap next to
    # a trial, and a point two fronts back in parallel may lead once measured alone.
    candidates = fronts.layers(unique, len(unique))[: s.max_candidates]
    _log.info(f"re-measuring {len(candidates)} front candidates serially, interleaved with the baseline, optimum's INT8 and the "
          f"reference INT8 ({s.remeasure_rounds} rounds, {cpus} threads)")
    rows = min(s.remeasure_rows, len(vdata))
    paths = {f"trial-{t['trial']:03d}": trial_dir(s.out, t["trial"]) for t in candidates}
    for ref in (reference, optimum):
        if ref.get("status") == "complete":
            paths[ref["artifact"]] = s.out / ref["artifact"]
    measured = remeasure(spec, paths, vdata.texts[:rows], vdata.text_pairs[:rows] if vdata.text_pairs else None,
                         rounds=s.remeasure_rounds, warmup=10, threads=cpus, seed=s.seed,
                         progress=progress_events.tracker("re-measuring the front (interleaved)"))
    lat = measured["latency"]
    for t in trials:
        name = f"trial-{t['trial']:03d}"
        if name in lat:
            t["remeasured_latency_ms"] = lat[name]["median_ms"]
    points_ = [{**t, "latency_ms": t["remeasured_latency_ms"]} for t in candidates]
    front = fronts.pareto(points_)
    for ref in (reference, optimum):
        if ref.get("status") == "complete":
            ref["remeasured_latency_ms"] = lat[ref["artifact"]]["median_ms"]
    doc = outputs.document(s, spec, executor, trials, front, measured, reference, optimum,
                           {"metric": baseline_metric, "latency_ms": lat["pytorch"]["median_ms"]},
                           {"source": vdata.source, "rows": validation_rows}, allowed)
    outputs.write_all(s.out, doc, base_evaluation=s.space.base.evaluation.model_dump())
    return doc


def reference_int8(s: Settings, job_for) -> dict:
    """xformopt's export, ORT's fusion, dynamic INT8: the `default` recipe on the unpruned model,
    scored and re-measured like a trial, so the front is read against what users get without search."""
    out = s.out / REFERENCE
    saved = s.out / f"{REFERENCE}.json"
    if saved.is_file() and (out / "model.onnx").is_file():
        return json.loads(saved.read_text())
    r = recipes.validate({**recipes.load("default").to_dict(), "task": s.space.base.task,
                          "evaluation": {**recipes.load("default").evaluation.model_dump(), **s.space.evaluation}},
                         "reference")
    _log.info("building the reference INT8 artifact (recipe default: export -> fuse -> dynamic INT8)")
    result = run_trial(job_for("reference", r, out))
    result["recipe"] = "default"
    result["artifact"] = REFERENCE
    write_text(saved, json.dumps(result, indent=2) + "\n")
    if result["status"] != "complete":
        _log.warning(f"the reference INT8 artifact failed: {result.get('error')}")
    else:
        _log.info(f"reference INT8: metric {result['metric']:.4f}, latency {result['latency_ms']:.2f} ms")
    return result


def optimum_int8(s: Settings, spec, validation: dict, threads: int) -> dict:
    """The dynamic-INT8 artifact optimum's settings make of the unpruned model (xformopt/benchmarking/
    optimum_reference.py), scored on the validation rows and re-measured with the front: what users compare with."""
    saved = s.out / f"{OPTIMUM}.json"
    if saved.is_file() and (s.out / OPTIMUM / "model.onnx").is_file():
        return json.loads(saved.read_text())
    target = targets.resolve(s.space.base.target).name
    _log.info(f"building the {NAME} artifact ({target})")
    result = {"artifact": OPTIMUM, "target": target, "config": f"{NAME}: AutoQuantizationConfig.{target}"
              "(is_static=False, per_channel=False)"}
    try:
        optimum_dynamic_int8(spec.path, s.out / OPTIMUM, spec, target)
        metric, rows, _ = score_artifact(spec, s.out / OPTIMUM, validation, threads)
        result.update(status="complete", metric=metric, validation_rows=rows)
        _log.info(f"optimum INT8: metric {metric:.4f}")
    except Exception as exc:  # the comparison is missing, the search is not: say so and go on
        result.update(status="failed", error=f"{type(exc).__name__}: {exc}")
        _log.warning(f"optimum's INT8 artifact could not be built: {result['error']}")
    write_text(saved, json.dumps(result, indent=2) + "\n")
    return result


class _TrialLoop:
    """The search's bookkeeping: trials finished (resumed or run), recipes already paid for, trials
    running on the executor and asked trials waiting on a running duplicate."""

    def __init__(self, s: Settings, study, executor, job_for):
        from optuna.trial import TrialState

        self.s, self.study, self.executor, self.job_for, self.TrialState = s, study, executor, job_for, TrialState
        self.results: dict[int, dict] = {}
        self.running: dict[object, tuple] = {}
        self.waiting: dict[str, list] = {}  # recipe -> asked trials that duplicate a running one
        self.expensive_seen: set[str] = set()
        self.queued: set[str] = set()
        self.asks = 0

    def resume(self) -> None:
        """Take the study's finished trials; fail the interrupted ones (they run again under a new number)."""
        TrialState = self.TrialState
        for t in self.study.get_trials(deepcopy=False):
            if t.state in (TrialState.COMPLETE, TrialState.FAIL) and "result" in t.user_attrs:
                self.results[t.number] = t.user_attrs["result"]
            elif t.state in (TrialState.RUNNING, TrialState.WAITING):  # interrupted: run again under a new number
                self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
        if self.results:
            _log.info(f"resuming: {len(self.results)} trial(s) already finished")
        self.by_recipe = {canonical(r["recipe"]): r["trial"] for r in self.results.values() if r["status"] == "complete"}

    def expand(self, params: dict) -> None:
        """A new prune/distill prefix was paid for: queue its fuse/quantize variants (cheap, from the
        pass cache), so the sampler's budget goes to the expensive choices."""
        s = self.s
        cheap = set(s.space.cheap_keys())
        prefix = json.dumps({k: v for k, v in params.items() if k not in cheap}, sort_keys=True, default=str)
        if not s.expand or prefix in self.expensive_seen:
            return
        self.expensive_seen.add(prefix)
        for variant in s.space.siblings(params):
            key = canonical(s.space.recipe_for(variant).to_dict())
            if key not in self.by_recipe and key not in self.queued:
                self.queued.add(key)
                self.study.enqueue_trial(variant)

    def finish(self, trial, result) -> None:
        s, results = self.s, self.results
        result["trial"] = trial.number
        trial.set_user_attr("result", result)
        if result["status"] == "complete":
            self.study.tell(trial, samplers.values_for(result, s.objectives))
            if "duplicate_of" not in result and result.get("params"):
                self.expand(result["params"])
        else:
            self.study.tell(trial, state=self.TrialState.FAIL)
        results[trial.number] = result
        best = max((r["metric"] for r in results.values() if r["status"] == "complete"), default=None)
        info = f"{len(self.running)} running" + (f", best {best:.4f}" if best is not None else "")
        progress_events.report("search trials", self.counted(), s.trials, info)
        same = f" (the recipe of trial {result['duplicate_of']:03d}, not run again)" if "duplicate_of" in result else ""
        _log.info(f"trial {trial.number:03d}: {result['status']}{same}" + (
            f", metric {result['metric']:.4f}, latency {result['latency_ms']:.2f} ms (parallel)"
            if result["status"] == "complete" else f": {result.get('error')}"))

    def duplicate(self, trial, params, r, of: int) -> None:
        original = self.results[of]
        self.finish(trial, {k: v for k, v in original.items() if k not in ("attempts", "seconds")}
                    | {"params": params, "recipe": r, "duplicate_of": of, "artifact": original["artifact"]})

    def counted(self) -> int:  # duplicates of an earlier trial cost nothing and do not count toward --trials
        return sum(1 for r in self.results.values() if "duplicate_of" not in r)

    def submit_more(self, distinct_total: int) -> None:
        """Ask the sampler for trials while workers are free: run new recipes, answer duplicates from their twin."""
        s = self.s
        while (self.counted() + len(self.running) < s.trials and len(self.running) < self.executor.workers
               and len(self.by_recipe) < distinct_total and self.asks < 20 * s.trials):
            self.asks += 1
            trial = self.study.ask()
            params = samplers.propose(trial, s.space.choices)
            r = s.space.recipe_for(params, name=f"trial-{trial.number:03d}").to_dict()
            key = canonical(r)
            if key in self.by_recipe and self.by_recipe[key] in self.results:
                self.duplicate(trial, params, r, self.by_recipe[key])
                continue
            if key in self.by_recipe:
                self.waiting.setdefault(key, []).append((trial, params, r))
                continue
            out = trial_dir(s.out, trial.number)
            job = self.job_for(trial.number, s.space.recipe_for(params, name=f"trial-{trial.number:03d}"), out)
            self.by_recipe[key] = trial.number
            self.running[self.executor.submit(job)] = (trial, params, r, key, out)

    def collect(self) -> None:
        """Record the trials the executor finished, and the duplicates that waited on them."""
        for handle, result in self.executor.wait(list(self.running)):
            trial, params, r, key, out = self.running.pop(handle)
            result.update(params=params, recipe=r, artifact=str(out.relative_to(self.s.out)))
            if result["status"] == "complete" and not (out / "model.onnx").is_file():
                result.update(status="failed", error=f"the trial finished on {result.get('host')} but {out} has no "
                              "model.onnx: the search directory must be on a path every Ray node shares")
            self.finish(trial, result)
            if result["status"] != "complete":
                self.by_recipe.pop(key, None)
            for dup in self.waiting.pop(key, []):
                if result["status"] == "complete":
                    self.duplicate(dup[0], dup[1], dup[2], trial.number)
                else:
                    self.finish(dup[0], {"status": "failed", "error": f"duplicate of failed trial {trial.number}",
                                         "params": dup[1], "recipe": dup[2]})


def run_trials(s: Settings, study, executor, job_for, optuna) -> list[dict]:
    loop = _TrialLoop(s, study, executor, job_for)
    loop.resume()
    distinct_total = s.space.distinct_recipes()
    for r in list(loop.results.values()):  # resumed: the variants queued before the interruption are lost with it
        if r["status"] == "complete" and "duplicate_of" not in r and r.get("params"):
            loop.expand(r["params"])
    while (loop.counted() < s.trials and len(loop.by_recipe) < distinct_total) or loop.running:
        loop.submit_more(distinct_total)
        if not loop.running:
            break
        loop.collect()
    return [loop.results[n] for n in sorted(loop.results)]
