"""One trial: a recipe run through the pipeline into DIR/trials/NNN/, scored on the validation split.

This function is what every executor runs (in-process, in a pool worker, or as a Ray task), so it
takes and returns plain data. A rerun after a lost worker starts the trial directory afresh; the
pass cache (shared by all trials) keeps whatever passes had already finished.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from xformopt import pipeline, sources
from xformopt import recipe as recipes
from xformopt.atomic import write_text
from xformopt.errors import GateFailed, XformoptError
from xformopt.runtime.encoder import OrtPredictor


@dataclass
class TrialJob:
    number: int
    model: str
    recipe: recipes.Recipe | dict  # a Recipe in this process; its to_dict() across processes (search executors)
    out: str  # DIR/trials/NNN (absolute)
    cache_dir: str | None  # XFORMOPT_CACHE_DIR for the pass cache shared by the trials
    validation: dict  # see validation_set(); plus "baseline" (.npy of the fp32 outputs, feature extraction)
    trust_remote_code: bool = False

    def to_dict(self) -> dict:
        out = asdict(self)
        if isinstance(self.recipe, recipes.Recipe):
            out["recipe"] = self.recipe.to_dict()
        return out


def validation_set(spec, validation: dict):
    """The rows the front is scored on: the task's vendored validation split unless the space names a file."""
    task = spec.task_def
    path = validation.get("data") or task.default_data("validation")
    return task.load(path, label2id=spec.label2id or None, limit=validation.get("limit"), seed=validation.get("seed", 0),
                     columns={"text": validation.get("text_column"), "label": validation.get("label_column")})


def score_outputs(spec, outputs: np.ndarray, data, baseline: np.ndarray | None) -> float:
    """The report's headline metric on the report's scale (a fraction: accuracy, or cosine to fp32)."""
    task = spec.task_def
    metrics = task.score(outputs, baseline, data)
    return float(metrics[task.report_headline(metrics)]["value"])


def score_artifact(spec, artifact: Path, validation: dict, threads: int) -> tuple[float, int, np.ndarray]:
    """(headline metric, rows, the artifact's outputs on the validation rows)."""
    data = validation_set(spec, validation)
    outputs = OrtPredictor(spec, artifact, threads=threads).predict_data(data)
    baseline = np.load(validation["baseline"], allow_pickle=False)
    return score_outputs(spec, outputs, data, baseline), len(data), outputs


def outputs_path(out: Path) -> Path:
    """Where a trial keeps its artifact's validation outputs: beside the artifact, so the folder stays the
    artifact alone (the shape search reads them for its paired intervals instead of predicting again)."""
    return out.with_name(out.name + ".validation.npy")


def run_trial(job: TrialJob | dict) -> dict:
    """Run the trial; failures of the recipe itself come back as a result (status failed), not an exception."""
    if isinstance(job, dict):
        job = TrialJob(**job)
    if job.cache_dir:
        os.environ["XFORMOPT_CACHE_DIR"] = job.cache_dir
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    out = Path(job.out)
    attempts_file = out.with_name(out.name + ".attempts")
    attempts = (int(attempts_file.read_text()) if attempts_file.is_file() else 0) + 1
    write_text(attempts_file, str(attempts))  # a torn count would crash the retry
    if out.exists():  # a previous attempt on a lost worker: start the directory afresh
        shutil.rmtree(out)
    outputs_path(out).unlink(missing_ok=True)
    for leftover in out.parent.glob(f".{out.name}.*"):
        shutil.rmtree(leftover, ignore_errors=True)
    where = {"host": socket.gethostname(), "pid": os.getpid()}
    write_text(out.parent / f"{out.name}.worker", f"{where['host']} {where['pid']}\n")
    result = {"trial": job.number, "attempts": attempts, **where}
    started = time.perf_counter()
    r = job.recipe if isinstance(job.recipe, recipes.Recipe) else recipes.validate(job.recipe, f"trial {job.number}")
    try:
        budget_met = True
        try:
            run = pipeline.run(job.model, r, out, trust_remote_code=job.trust_remote_code)
            report = run.report
        except GateFailed as exc:  # an accuracy budget missed: the artifact is written and still a valid point
            budget_met = False
            import json

            report = json.loads((out / "report.json").read_text())
            run = getattr(exc, "result", None)  # BudgetMissed carries the run's result
        # The model as the run resolved it; resolved again only when a gate gave no result
        spec = run.spec if isinstance(run, pipeline.RunResult) else sources.resolve(
            job.model, r.task, trust_remote_code=job.trust_remote_code)
        threads = r.evaluation.threads
        metric, rows, outputs = score_artifact(spec, out, job.validation, threads)
        np.save(outputs_path(out), outputs, allow_pickle=False)
        result.update(
            status="complete", metric=metric, validation_rows=rows, budget_met=budget_met,
            validation_outputs=str(outputs_path(out)),
            latency_ms=float(report["artifact"]["latency"]["median_ms"]),
            test_metric=float(report["artifact"]["metrics"][report["headline_metric"]]["value"]),
            passes=[s["name"] for s in report["stages"][1:]],
        )
    except XformoptError as exc:
        result.update(status="failed", error=exc.message)
    except Exception as exc:  # a library failure inside a pass: the trial fails, the search goes on
        result.update(status="failed", error=f"{type(exc).__name__}: {exc}",
                      traceback=traceback.format_exc(limit=5))
    result["seconds"] = round(time.perf_counter() - started, 2)
    return result
