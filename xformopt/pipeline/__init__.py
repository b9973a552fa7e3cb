"""Run a recipe: validate, run (or reuse) each pass, evaluate and time every stage, write the artifact.

Order of work is chosen so that bad input fails in seconds, before anything is exported: the model,
target, output path, held-out data and pass chain are all checked first.

One module per step, in the order :func:`run` takes them: ``prepare`` (the input checks, the held-out
rows and the sample passes verify on), ``execute`` (the passes, run or reused from the cache), ``write``
(evaluation, the report, the manifest and the artifact folder); ``single`` is one pass as a shell
command. The names callers use are re-exported here (``pipeline.run``, ``pipeline.prepare``, ...).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from xformopt import cache, cache_stores
from xformopt.locks import claim_output
from xformopt.models.validate import check_threads
from xformopt.pipeline.execute import (
    Executed,
    Stage,
    context_key,
    execute,
    execute_run,
    missed_budget,
    raise_if_budget_missed,
    run_passes,
)
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
from xformopt.pipeline.write import RunResult, evaluate, report_for, save_reference, write_artifact, write_run
from xformopt.recipe import Recipe
from xformopt.stale import run_workdir_prefix, sweep_at_start

__all__ = [
    "VERIFICATION_ROWS", "Executed", "Prepared", "RunInputs", "RunResult", "Stage", "build_manifest", "check_evaluation",
    "check_stage_dir", "context_key", "data_options", "evaluate", "execute", "execute_run", "input_record", "load_heldout",
    "missed_budget", "prepare", "prepare_run", "raise_if_budget_missed", "read_paths", "report_for", "run", "run_passes",
    "run_single", "save_reference", "verification_context", "verification_sample", "write_artifact", "write_run",
]


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
    """The road of ``optimize``: prepare (every input check), execute the passes, write (evaluate the stages,
    report, write the artifact); one call per step, each a module of this package, each handing the next
    what it needs (``RunInputs``, ``Executed``) so no step calls back into this one."""
    check_threads(recipe.evaluation.threads)
    ready = prepare_run(model, recipe, out, force=force, trust_remote_code=trust_remote_code)
    with claim_output(out, wait=wait), cache.session(), cache_stores.in_use(), \
            tempfile.TemporaryDirectory(prefix=run_workdir_prefix()) as workdir:
        sweep_at_start(Path(os.path.abspath(out)).parent, cache.cache_root())
        executed = execute_run(recipe, ready.ctx, use_cache, Path(workdir))
        result = write_run(ready, recipe, executed, out, force=force, progress=progress, extra_report=extra_report)
    raise_if_budget_missed(executed.records, out, result)
    return result
