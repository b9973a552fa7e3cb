"""What a run leaves: the stages evaluated and timed, the report built from them (profiled, held to its
type), and the artifact folder, written whole or not at all (the manifest is built in ``manifest.py``).
:func:`write_run` is the whole step in one call, on what the prepare and execute steps handed down."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from xformopt import models, targets
from xformopt.artifact import atomic_dir, copy_stage, write_json
from xformopt.data import TextDataset
from xformopt.evaluate.run import evaluate_stages
from xformopt.measure import memory
from xformopt.measure.host import host_info
from xformopt.pipeline.execute import Executed
from xformopt.pipeline.manifest import build_manifest, input_record
from xformopt.pipeline.prepare import RunInputs
from xformopt.recipe import Recipe
from xformopt.report.build import build_report
from xformopt.report.render import write_report_files
from xformopt.report.types import Report, check_report

_log = logging.getLogger(__name__)


@dataclass
class RunResult:
    out: Path
    manifest: dict
    report: Report
    spec: models.ModelSpec  # the model the run started from, as resolved once (callers score against it)


def evaluate(stages, spec: models.ModelSpec, heldout: TextDataset, recipe: Recipe, threads: int, progress) -> dict:
    """Every stage scored and timed on the held-out rows (``evaluate/run.py``), with the memory it took."""
    with memory.measured("evaluation") as evaluated:
        evaluation = evaluate_stages(stages, spec, heldout, recipe.evaluation, threads, progress)
    evaluation["memory"] = evaluated.to_dict()
    _log.info(f"evaluation: peak RSS {evaluated.peak / memory.MB:,.0f} MB; run peak {memory.process_peak_mb():,.0f} MB")
    return evaluation


def report_for(spec: models.ModelSpec, target: targets.Target, stages, evaluation: dict, recipe: Recipe,
               host_runs_target: bool, threads: int, heldout: TextDataset, extra_report: dict | None) -> Report:
    """The report of a run: built from the evaluation, with what the caller adds (``extra_report``) and the
    final stage's profile, held to its type (report/types.py: strict in tests, a warning elsewhere)."""
    host = host_info()
    report = build_report(spec, target, stages, evaluation, host, recipe, host_runs_target, threads, heldout)
    report.update(extra_report or {})  # e.g. the shape search that chose this recipe (xformopt/recipe_search/shapes.py)
    from xformopt.profiling.measure import profile_for_report

    if (profile := profile_for_report(stages[-1], heldout, threads, recipe.evaluation.seed)) is not None:
        report["profile"] = profile  # where the final stage's time goes: report.md shows the top lines
    check_report(report)
    return report


def save_reference(directory: Path, outputs, heldout: TextDataset) -> None:
    """The fp32 baseline's outputs on the held-out rows, so `bench` can score agreement/cosine
    without loading PyTorch. Plain .npy (no pickle) plus the row ids they belong to."""
    import numpy as np

    ref = directory / "reference"
    ref.mkdir()
    np.save(ref / "baseline_outputs.npy", np.asarray(outputs, dtype=np.float32), allow_pickle=False)
    write_json(ref / "rows.json", {"source": heldout.source, "row_ids": heldout.row_ids})


def write_artifact(out: Path, force: bool, protected: tuple[Path, ...], final, manifest: dict, report: Report,
                   reference_outputs, heldout: TextDataset) -> None:
    """The artifact folder: the final stage, its manifest, the report files and the baseline's outputs."""
    with atomic_dir(out, force, protected=protected) as tmp:
        copy_stage(final.path, tmp)  # model.onnx, or a Hugging Face directory after torch passes only
        write_json(tmp / "manifest.json", manifest)
        write_report_files(report, tmp)
        save_reference(tmp, reference_outputs, heldout)


def write_run(ready: RunInputs, recipe: Recipe, executed: Executed, out: Path, *, force: bool,
              progress: Callable[[str, int, int], None] | None, extra_report: dict | None) -> RunResult:
    """The last step of ``pipeline.run`` in one call: every stage evaluated, the report, the manifest (with the
    model's origin read at resolve time) and the artifact folder."""
    spec, stages, heldout = ready.spec, executed.stages, ready.heldout
    evaluation = evaluate(stages, spec, heldout, recipe, ready.threads, progress)
    report = report_for(spec, ready.target, stages, evaluation, recipe, ready.ctx.host_runs_target, ready.threads, heldout,
                        extra_report)
    manifest = build_manifest(input_record(spec.source, spec, executed.input_hash, ready.origin), ready.target,
                              [r.to_dict() for r in executed.records], host=report["host"], recipe=recipe, heldout=heldout)
    manifest["memory"] = report["memory"]
    write_artifact(out, force, ready.protected, stages[-1], manifest, report, evaluation["reference_outputs"], heldout)
    return RunResult(out, manifest, report, spec)
