"""Run a recipe: validate, run (or reuse) each pass, evaluate and time every stage, write the artifact.

Order of work is chosen so that bad input fails in seconds, before anything is exported: the model,
target, output path, held-out data and pass chain are all checked first.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from xformopt import cache, models, sources, targets
from xformopt.artifact import (
    MANIFEST_SCHEMA,
    atomic_dir,
    check_output,
    copy_stage,
    hash_dir,
    read_manifest,
    sha256_file,
    write_json,
)
from xformopt.data import TextDataset
from xformopt.errors import BudgetMissed, InputError, PassFailed, XformoptError
from xformopt.evaluate.run import evaluate_stages
from xformopt.locks import claim_output
from xformopt.measure import host as host_facts
from xformopt.measure import memory
from xformopt.measure.host import (
    cpu_model,
    effective_cpu_flags,
    host_info,
    library_versions,
)
from xformopt.models.validate import check_model_files, check_onnx_file, check_threads
from xformopt.onnx_graph import SEQ2SEQ_GRAPHS, seq2seq_stage
from xformopt.passes import get_pass
from xformopt.passes.base import PassContext
from xformopt.passes.record import PassRecord
from xformopt.passes.records import check_record
from xformopt.recipe import PassStep, Recipe, check_order, validate_options
from xformopt.report.build import build_report
from xformopt.report.render import write_report_files
from xformopt.report.types import Report, check_report
from xformopt.resources import vader_split_path
from xformopt.sources import hub
from xformopt.sources.gguf import gguf_input
from xformopt.stale import run_workdir_prefix, sweep_at_start

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


@dataclass
class RunResult:
    out: Path
    manifest: dict
    report: Report


def load_heldout(recipe: Recipe, spec: models.ModelSpec) -> TextDataset:
    ev = recipe.evaluation
    path = Path(ev.data) if ev.data else spec.task_def.default_data("test")
    columns = {"text": ev.text_column, "text_pair": ev.text_pair_column, "label": ev.label_column}
    return spec.task_def.load(path, label2id=spec.label2id or None, limit=ev.limit, seed=ev.seed, columns=columns)


VERIFICATION_ROWS = 200


def verification_sample(spec: models.ModelSpec, data: str | None, text_column: str | None = None) -> TextDataset:
    """The fixed seeded sample passes verify and time on: the same rows whatever ``--limit`` the
    report uses, so the evaluation size never invalidates a cached pass. No labels required."""
    task = spec.task_def
    path = Path(data) if data else task.default_data("test")
    return task.load(path, label2id=spec.label2id or None, limit=VERIFICATION_ROWS, seed=0,
                     columns={"text": text_column, "label": ""}, require_labels=False)


def verification_context(spec, target, data: str | None, text_column: str | None, threads: int, flags,
                         reported_texts=None) -> PassContext:
    sample = verification_sample(spec, data, text_column)
    return PassContext(spec, target, sample.texts, threads, flags, reported_texts=reported_texts, sample=sample)


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


def check_evaluation(recipe: Recipe, spec: models.ModelSpec) -> None:
    """Evaluation settings this model cannot take, refused before any work: a fixed-shape latency mode
    longer than the model's positions (it would only fail minutes in), a beam width for a model that
    does not generate text to text (it would silently do nothing)."""
    import json

    ev = recipe.evaluation
    if ev.num_beams is not None and spec.task_def.graph != "seq2seq":
        raise InputError(f"--num-beams sets the beam search of text-to-text models (translation, summarization); "
                         f"this model's task is {spec.task}: drop --num-beams")
    if "fixed" in ev.modes:
        limit = spec.family.positions(json.loads((spec.path / "config.json").read_text()))
        if limit and max(ev.seq) > limit:
            raise InputError(f"--seq {max(ev.seq)} is longer than the model's {limit} positions; use lengths up to {limit}")


def data_options(steps: list[tuple[str, dict]]) -> list[tuple[str, str, str]]:
    """(pass, option, value) for every data file a step's options name (the pass's ``data_options``)."""
    return [(name, key, value) for name, options in steps for key in get_pass(name).data_options
            if isinstance(value := (options or {}).get(key), str) and value]


def read_paths(model_path: Path, data: str | None = None, steps: list[tuple[str, dict]] = ()) -> tuple[Path, ...]:
    """What a run reads and -o must never be, sit inside or hold: the model, the data files, the cache."""
    values = [data, str(vader_split_path("test"))] + [value for _, _, value in data_options(list(steps))]
    return (Path(model_path), cache.cache_root().parent, *(Path(v.split("::")[0]) for v in values if v))


@dataclass
class Prepared:
    """A run's inputs once every check has passed: what work may start on."""

    spec: models.ModelSpec
    target: targets.Target
    protected: tuple[Path, ...]  # what -o must never overwrite (read_paths)


def prepare(model: str, steps: list[tuple[str, dict]], out: Path, *, force: bool, target: str, task: str | None,
            data: str | None, trust_remote_code: bool, check: Callable[[models.ModelSpec], None] | None = None) -> Prepared:
    """The input checks of every run (a recipe or one pass), in one order, before any work: the output
    path, the target, the model, each step's own refusals (``Pass.check``: the model's task, labelled
    fallbacks, its options), named data files, ``check`` (the caller's own, on the resolved model), the model's files, and -o against all it reads."""

    check_output(out, force)
    resolved_target = targets.resolve(target)
    spec = sources.resolve(model, task, trust_remote_code=trust_remote_code)
    for name, options in steps:  # what each pass refuses for this model (its task, its labels), in one line
        get_pass(name).check(spec, options or {})
    for name, key, value in data_options(steps):
        if not Path(value.split("::")[0]).exists():
            raise InputError(f"{name}.{key}: data file not found: {value}")
    if check is not None:
        check(spec)
    check_model_files(spec.path, task=spec.task, trust_remote_code=trust_remote_code)
    protected = read_paths(spec.path, data, steps)
    check_output(out, force, protected)
    return Prepared(spec, resolved_target, protected)


def input_record(source: str, spec: models.ModelSpec, sha256: str) -> dict:
    """The manifest's ``input``: the model a run (or a chain of single passes) started from."""
    return {"source": source, "path": str(spec.path), "sha256": sha256, "model_type": spec.model_type, "task": spec.task,
            "revision": hub.commit_of(spec.path),  # the hub commit a hub id resolved to, else null
            **gguf_input(spec.path)}  # the GGUF file a checkpoint was converted from, if it was


def build_manifest(input_: dict, target: targets.Target, passes: list[dict], *, host: dict | None = None,
                   recipe: Recipe | None = None, heldout: TextDataset | None = None) -> dict:
    """manifest.json of a stage or an artifact; ``host``, ``recipe`` and ``heldout`` only for a recipe run."""
    manifest = {"schema": MANIFEST_SCHEMA, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "input": input_, "target": target.to_dict()}
    if host is not None:
        manifest["host"] = host
    manifest["versions"] = library_versions()
    if recipe is not None:
        manifest["recipe"] = recipe.to_dict()
    if heldout is not None:
        manifest["heldout"] = {"path": heldout.path, "source": heldout.source, "rows": len(heldout)}
    manifest["passes"] = passes
    return manifest


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
                             {**versions, "context": context_key(ctx, step.options, pass_cls.depends_on)})
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
    check_threads(recipe.evaluation.threads)
    ready = prepare(model, [(step.name, step.options) for step in recipe.passes], out, force=force,
                    target=recipe.target, task=recipe.task, data=recipe.evaluation.data,
                    trust_remote_code=trust_remote_code, check=lambda spec: check_evaluation(recipe, spec))
    spec, target, protected = ready.spec, ready.target, ready.protected
    heldout = load_heldout(recipe, spec)
    threads = recipe.evaluation.threads or host_facts.usable_cpus()
    flags = effective_cpu_flags()
    ctx = verification_context(spec, target, recipe.evaluation.data, recipe.evaluation.text_column, threads, flags,
                               reported_texts=heldout.texts)
    if not ctx.host_runs_target:
        _log.info(f"note: this host lacks {target.name} ({', '.join(target.requires)}): timings below are not the target's")
    _log.info(f"model {spec.source} ({spec.model_type}, {spec.task}), target {target.name}, {threads} threads, "
        f"held-out {len(heldout)} rows from {heldout.source}")

    with claim_output(out, wait=wait), cache.session(), \
            tempfile.TemporaryDirectory(prefix=run_workdir_prefix()) as workdir:
        sweep_at_start(Path(os.path.abspath(out)).parent, cache.cache_root())
        input_hash = hash_dir(spec.path)
        stages, records = run_passes(recipe, ctx, use_cache, Path(workdir), input_hash)
        with memory.measured("evaluation") as evaluated:
            evaluation = evaluate_stages(stages, spec, heldout, recipe.evaluation, threads, progress)
        evaluation["memory"] = evaluated.to_dict()
        _log.info(f"evaluation: peak RSS {evaluated.peak / memory.MB:,.0f} MB; run peak {memory.process_peak_mb():,.0f} MB")
        host = host_info()
        report = build_report(spec, target, stages, evaluation, host, recipe, ctx.host_runs_target, threads, heldout)
        report.update(extra_report or {})  # e.g. the shape search that chose this recipe (xformopt/recipe_search/shapes.py)
        from xformopt.profiling.measure import profile_for_report

        if (profile := profile_for_report(stages[-1], heldout, threads, recipe.evaluation.seed)) is not None:
            report["profile"] = profile  # where the final stage's time goes: report.md shows the top lines
        check_report(report)  # report/types.py: strict in tests, a warning elsewhere
        manifest = build_manifest(input_record(spec.source, spec, input_hash), target, [r.to_dict() for r in records],
                                  host=host, recipe=recipe, heldout=heldout)
        manifest["memory"] = report["memory"]
        final = stages[-1]
        with atomic_dir(out, force, protected=protected) as tmp:
            copy_stage(final.path, tmp)  # model.onnx, or a Hugging Face directory after torch passes only
            write_json(tmp / "manifest.json", manifest)
            write_report_files(report, tmp)
            save_reference(tmp, evaluation["reference_outputs"], heldout)
    result = RunResult(out, manifest, report)
    raise_if_budget_missed(records, out, result)
    return result


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


def save_reference(directory: Path, outputs, heldout: TextDataset) -> None:
    """The fp32 baseline's outputs on the held-out rows, so `bench` can score agreement/cosine
    without loading PyTorch. Plain .npy (no pickle) plus the row ids they belong to."""
    import numpy as np

    ref = directory / "reference"
    ref.mkdir()
    np.save(ref / "baseline_outputs.npy", np.asarray(outputs, dtype=np.float32), allow_pickle=False)
    write_json(ref / "rows.json", {"source": heldout.source, "row_ids": heldout.row_ids})


def check_stage_dir(path: Path, kind: str) -> None:
    """The input of a single-pass command must be the kind of stage that pass consumes."""
    if kind == "hf":
        if path.is_dir() and ((path / "model.onnx").is_file() or seq2seq_stage(path)):
            raise InputError(f"{path} is an ONNX stage; this pass takes a PyTorch model directory (the input of export)")
        return
    if not path.exists():
        raise InputError(f"input not found: {path}")
    if kind == "onnx":
        model = path / "model.onnx"
        if not model.is_file() and seq2seq_stage(path):  # an encoder-decoder stage: its two graphs
            for name in SEQ2SEQ_GRAPHS:
                check_onnx_file(path / name)
            return
        if not model.is_file():
            raise InputError(f"{path} has no model.onnx; pass the output folder of `xformopt export`")
        check_onnx_file(model)


def run_single(
    pass_name: str,
    model: str,
    out: Path,
    options: dict,
    *,
    target: str = "auto",
    task: str | None = None,
    data: str | None = None,
    force: bool = False,
    trust_remote_code: bool = False,
    wait: bool = False,
) -> dict:
    """One pass as a shell command: MODEL (or a previous stage's folder) in, a stage folder out.

    The output carries a manifest whose pass list extends the input's, so a chain of commands
    records the same history ``optimize`` would.
    """
    pass_cls = get_pass(pass_name)
    check_output(out, force)
    validated = validate_options(pass_name, options, f"xformopt {pass_name}")
    check_stage_dir(Path(model), pass_cls.consumes)
    previous = {}
    if (Path(model) / "manifest.json").is_file():
        previous = read_manifest(Path(model))
    # The same ordering contract as a recipe: the input's pass history plus this pass.
    history = [entry["pass"] for entry in previous.get("passes", [])]
    start = get_pass((history or [pass_name])[0]).consumes  # the chain may have begun from an ONNX stage
    chain = Recipe.model_construct(passes=[PassStep(name=name) for name in [*history, pass_name]])
    check_order(chain, origin=f"xformopt {pass_name} {model}", start=start)
    # A chain keeps the task its first command chose (e.g. export --task feature-extraction).
    task = task or (previous.get("input") or {}).get("task")
    ready = prepare(model, [(pass_name, validated.model_dump())], out, force=force, target=target, task=task,
                    data=data, trust_remote_code=trust_remote_code)
    spec, protected = ready.spec, ready.protected
    ctx = verification_context(spec, ready.target, data, None, host_facts.usable_cpus(), effective_cpu_flags())
    sweep_at_start(Path(os.path.abspath(out)).parent)
    started = time.perf_counter()
    with atomic_dir(out, force, wait=wait, protected=protected) as tmp:
        with memory.measured(pass_name) as peak:
            record = execute(pass_cls, ctx, spec.path, tmp, validated)
            memory.release()
        entry = PassRecord(pass_name, record, validated.model_dump(), seconds=round(time.perf_counter() - started, 3),
                           memory=peak.to_dict())
        input_ = previous.get("input") or input_record(model, spec, hash_dir(spec.path))
        write_json(tmp / "manifest.json", build_manifest(input_, ready.target, [*previous.get("passes", []), entry.to_dict()]))
    raise_if_budget_missed([entry], out, entry.to_dict())
    return entry.to_dict()
