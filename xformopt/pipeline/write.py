"""What a run leaves: the stages evaluated and timed, the report built from them (profiled, held to its
type), and the artifact folder, written whole or not at all (the manifest is built in ``manifest.py``)."""

from __future__ import annotations

import logging
from pathlib import Path

from xformopt import models, targets
from xformopt.artifact import atomic_dir, copy_stage, write_json
from xformopt.data import TextDataset
from xformopt.evaluate.run import evaluate_stages
from xformopt.measure import memory
from xformopt.measure.host import host_info
from xformopt.recipe import Recipe
from xformopt.report.build import build_report
from xformopt.report.render import write_report_files
from xformopt.report.types import Report, check_report

_log = logging.getLogger(__name__)


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
