"""Run a recipe: validate, run (or reuse) each pass, evaluate and time every stage, write the artifact.

Order of work is chosen so that bad input fails in seconds, before anything is exported: the model,
target, output path, held-out data and pass chain are all checked first.

One module per step, in the order :func:`run` takes them: ``prepare`` (the input checks, the held-out
rows and the sample passes verify on), ``execute`` (the passes, run or reused from the cache), ``write``
(evaluation, the report, the manifest and the artifact folder); ``single`` is one pass as a shell
command. The names callers use are re-exported here (``pipeline.run``, ``pipeline.prepare``, ...).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from xformopt import cache
from xformopt.artifact import hash_dir
from xformopt.locks import claim_output
from xformopt.models.validate import check_threads
from xformopt.pipeline.execute import Stage, context_key, execute, missed_budget, raise_if_budget_missed, run_passes
from xformopt.pipeline.manifest import build_manifest, input_record
from xformopt.pipeline.prepare import (
    VERIFICATION_ROWS,
    Prepared,
    RunInputs,
    check_evaluation,
    data_options,
    load_heldout,
    prepare,
    prepare_run,
    read_paths,
    verification_context,
    verification_sample,
)
from xformopt.pipeline.single import check_stage_dir, run_single
from xformopt.pipeline.write import evaluate, report_for, save_reference, write_artifact
from xformopt.recipe import Recipe
from xformopt.report.types import Report
from xformopt.stale import run_workdir_prefix, sweep_at_start

__all__ = [
    "VERIFICATION_ROWS", "Prepared", "RunInputs", "RunResult", "Stage", "build_manifest", "check_evaluation", "check_stage_dir",
    "context_key", "data_options", "evaluate", "execute", "input_record", "load_heldout", "missed_budget", "prepare", "prepare_run",
    "raise_if_budget_missed", "read_paths", "report_for", "run", "run_passes", "run_single", "save_reference",
    "verification_context", "verification_sample", "write_artifact",
]

_log = logging.getLogger(__name__)


@dataclass
class RunResult:
    out: Path
    manifest: dict
    report: Report


def run(
    model: str,
    recipe: Recipe,
    out: Path,
    *,
    force: bool = False,
    use_cache: bool = True,
    trust_remote_code: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
    wait: bool = False,
    extra_report: dict | None = None,
) -> RunResult:
    """The road of ``optimize``: prepare (every input check), execute the passes, evaluate the stages, report,
    write the artifact; each step is a module of this package."""
    check_threads(recipe.evaluation.threads)
    ready = prepare_run(model, recipe, out, force=force, trust_remote_code=trust_remote_code)
    spec, target, protected, heldout, threads, ctx = (ready.spec, ready.target, ready.protected, ready.heldout,
                                                      ready.threads, ready.ctx)
    if not ctx.host_runs_target:
        _log.info(f"note: this host lacks {target.name} ({', '.join(target.requires)}): timings below are not the target's")
    _log.info(f"model {spec.source} ({spec.model_type}, {spec.task}), target {target.name}, {threads} threads, "
        f"held-out {len(heldout)} rows from {heldout.source}")

    with claim_output(out, wait=wait), cache.session(), \
            tempfile.TemporaryDirectory(prefix=run_workdir_prefix()) as workdir:
        sweep_at_start(Path(os.path.abspath(out)).parent, cache.cache_root())
        input_hash = hash_dir(spec.path)
        stages, records = run_passes(recipe, ctx, use_cache, Path(workdir), input_hash)
        evaluation = evaluate(stages, spec, heldout, recipe, threads, progress)
        report = report_for(spec, target, stages, evaluation, recipe, ctx.host_runs_target, threads, heldout, extra_report)
        manifest = build_manifest(input_record(spec.source, spec, input_hash), target, [r.to_dict() for r in records],
                                  host=report["host"], recipe=recipe, heldout=heldout)
        manifest["memory"] = report["memory"]
        write_artifact(out, force, protected, stages[-1], manifest, report, evaluation["reference_outputs"], heldout)
    result = RunResult(out, manifest, report)
    raise_if_budget_missed(records, out, result)
    return result
