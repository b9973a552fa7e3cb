"""The passes of a recipe, run (or reused from the pass cache) one after the other, each on the stage the
one before it wrote; every record held to its pass's type. A pass that kept its best effort but missed
its budget fails the run after the artifact is written (``raise_if_budget_missed``)."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from xformopt import cache, models
from xformopt.artifact import hash_dir, sha256_file
from xformopt.errors import BudgetMissed, PassFailed, XformoptError
from xformopt.measure import memory
from xformopt.measure.host import cpu_model, library_versions
from xformopt.passes import get_pass
from xformopt.passes.base import PassContext
from xformopt.passes.record import PassRecord
from xformopt.passes.records import check_record
from xformopt.recipe import Recipe

_log = logging.getLogger(__name__)


@dataclass
class Stage:
    """A model the report evaluates: the PyTorch baseline or the output of one pass."""

    name: str
    kind: str  # "hf" | "onnx"
    path: Path
    spec: models.ModelSpec  # the stage's own model: a pruned stage has its own layers, heads and widths
    record: PassRecord | None = None  # None for the PyTorch baseline

    @property
    def pass_record(self) -> dict:
        return self.record.record if self.record is not None else {}


def execute(pass_cls, ctx: PassContext, src: Path, dst: Path, options) -> dict:
    """Run one pass; an unexpected library error becomes a PassFailed that names the pass."""
    try:
        record = pass_cls().run(ctx, src, dst, options)
        check_record(pass_cls.name, pass_cls.Record, record)
        return record
    except XformoptError:
        raise
    except Exception as exc:
        if os.environ.get("XFORMOPT_DEBUG"):
            raise
        raise PassFailed(f"pass {pass_cls.name!r} failed: {type(exc).__name__}: {exc}") from exc


def context_key(ctx: PassContext, options: dict, depends_on: tuple[str, ...] = ("texts", "timing")) -> dict:
    """What else decides a pass's output, as the pass declares it (``Pass.depends_on``): the texts it
    verifies on, the reported rows, the threads and CPU it times with; always the content of the
    data files it reads. Nothing else, so e.g. ``--limit`` does not re-run an export."""
    import hashlib

    def digest(texts) -> str:
        return hashlib.sha256("\x1f".join(texts).encode()).hexdigest()

    files = {}
    for name, value in options.items():
        if isinstance(value, str) and value and Path(value.split("::")[0]).exists():
            path = Path(value.split("::")[0])
            files[name] = sha256_file(path) if path.is_file() else hash_dir(path)
    key: dict = {"files": files}
    if "texts" in depends_on:
        key["texts"] = digest(ctx.sample_texts)
        texts, pairs = ctx.spec.task_def.model_inputs(ctx.sample_data)
        if pairs is not None or list(texts) != list(ctx.sample_texts):  # the contexts or choices verified on too
            key["inputs"] = digest([*texts, *(pairs or [])])
    if "reported" in depends_on:
        key["reported"] = digest(ctx.heldout_texts)
    if "timing" in depends_on:
        key.update(threads=ctx.threads, cpu=cpu_model())
    return key


def run_passes(recipe: Recipe, ctx: PassContext, use_cache: bool, workdir: Path,
               input_key: str | None = None) -> tuple[list[Stage], list[PassRecord]]:
    """Run (or reuse from the cache) each pass; returns the stages and the per-pass records.

    Each pass runs on its input stage's own spec (the shape after a prune or distill)."""
    versions = library_versions()
    stages = [Stage("pytorch", "hf", ctx.spec.path, ctx.spec)]
    input_key = input_key or hash_dir(ctx.spec.path)
    records = []
    for i, step in enumerate(recipe.passes, start=1):
        pass_cls = get_pass(step.name)
        options = pass_cls.Options.model_validate(step.options)
        key = cache.pass_key(input_key, step.name, step.options, ctx.target.name, ctx.spec.task,
                             {**versions, "context": context_key(ctx, step.options, pass_cls.depends_on),
                              "facts": pass_cls.cache_facts(stages[-1].spec, step.options)})
        src = stages[-1].path
        step_ctx = dataclasses.replace(ctx, spec=stages[-1].spec)
        started = time.perf_counter()
        with memory.measured(step.name) as peak:
            hit = cache.lookup(key) if use_cache else None
            if hit:
                out_dir, record = hit
                _log.info(f"[{i}/{len(recipe.passes)}] {step.name}: reused from cache ({key})")
            else:
                _log.info(f"[{i}/{len(recipe.passes)}] {step.name}: running")

                def work(dst: Path, pass_cls=pass_cls, options=options, src=src) -> dict:
                    return execute(pass_cls, step_ctx, src, dst, options)

                if use_cache:
                    out_dir, record = cache.build(key, work, {"pass": step.name})
                else:
                    out_dir = workdir / f"{i:02d}-{step.name}"
                    out_dir.mkdir()
                    record = work(out_dir)
            memory.release()  # what the pass left for the collector goes now, not during the next pass
        seconds = time.perf_counter() - started
        _log.info(f"[{i}/{len(recipe.passes)}] {step.name}: done in {seconds:.1f}s, peak RSS {peak.peak / memory.MB:,.0f} MB")
        entry = PassRecord(step.name, record, step.options, key, bool(hit), round(seconds, 3), peak.to_dict())
        records.append(entry)
        stages.append(Stage(step.name, pass_cls.produces, out_dir, models.stage_spec(ctx.spec, out_dir), entry))
        input_key = key
    return stages, records


@dataclass
class Executed:
    """What the execute step hands the write step: every stage, the pass records and the input model's hash."""

    stages: list[Stage]
    records: list[PassRecord]
    input_hash: str


def execute_run(recipe: Recipe, ctx: PassContext, use_cache: bool, workdir: Path) -> Executed:
    """The second step of ``pipeline.run`` in one call: the input model hashed (the cache key of the first
    pass, the manifest's ``input.sha256``), then the passes run or reused (:func:`run_passes`)."""
    input_hash = hash_dir(ctx.spec.path)
    stages, records = run_passes(recipe, ctx, use_cache, workdir, input_hash)
    return Executed(stages, records, input_hash)


def missed_budget(records: list[PassRecord]) -> PassRecord | None:
    """The first pass that missed its accuracy budget or agreement floor, or None when every one held."""
    return next((entry for entry in records if entry.budget_met is False), None)


def raise_if_budget_missed(records: list[PassRecord], out: Path, result=None) -> None:
    """A pass that wrote its best effort but missed its accuracy budget or agreement floor fails the run
    (exit 1), after the artifact is written, so the result (carried by the error) can still be inspected
    (and accepted: ``exc.accept``)."""
    entry = missed_budget(records)
    if entry is not None:
        raise BudgetMissed(f"{entry.name}: {get_pass(entry.name).budget_failure(entry.record, out)}", result,
                           entry.accept)
