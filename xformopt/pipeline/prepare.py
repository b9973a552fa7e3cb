"""A run's inputs, checked before any work: the output path, the target, the model, each step's own
refusals, the data files, the evaluation settings; then the held-out rows the report scores and the
fixed sample the passes verify on. Bad input fails here, in seconds, before anything is exported."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from xformopt import cache_stores, models, sources, targets
from xformopt.artifact import check_output
from xformopt.data import TextDataset
from xformopt.errors import InputError
from xformopt.measure import host as host_facts
from xformopt.measure.host import effective_cpu_flags
from xformopt.models.validate import check_model_files
from xformopt.passes import get_pass
from xformopt.passes.base import PassContext, check_steps
from xformopt.recipe import Recipe
from xformopt.resources import vader_split_path

_log = logging.getLogger(__name__)


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
    return (Path(model_path), cache_stores.home(), *(Path(v.split("::")[0]) for v in values if v))


@dataclass
class Prepared:
    """A run's inputs once every check has passed: what work may start on."""

    spec: models.ModelSpec
    target: targets.Target
    protected: tuple[Path, ...]  # what -o must never overwrite (read_paths)
    origin: dict  # where the model came from, for the manifest (sources.origin: hub revision, GGUF source)


def prepare(model: str, steps: list[tuple[str, dict]], out: Path, *, force: bool, target: str, task: str | None,
            data: str | None, trust_remote_code: bool, check: Callable[[models.ModelSpec], None] | None = None,
            recipe: Recipe | None = None) -> Prepared:
    """The input checks of every run (a recipe or one pass), in one order, before any work: the output
    path, the target, the model, each step's own refusals (``Pass.check``: the model's task, labelled
    fallbacks, its options), named data files, ``recipe``'s evaluation settings (:func:`check_evaluation`) and
    ``check`` (the caller's own) on the resolved model, the model's files, and -o against all it reads."""

    check_output(out, force)
    resolved_target = targets.resolve(target)
    spec, origin = sources.resolve_input(model, task, trust_remote_code=trust_remote_code)
    # what each pass refuses for this model (its task, its labels, its own rules), one call for all
    check_steps(spec, [(get_pass(name), options) for name, options in steps])
    for name, key, value in data_options(steps):
        if not Path(value.split("::")[0]).exists():
            raise InputError(f"{name}.{key}: data file not found: {value}")
    if recipe is not None:
        check_evaluation(recipe, spec)
    if check is not None:
        check(spec)
    check_model_files(spec.path, task=spec.task, trust_remote_code=trust_remote_code)
    protected = read_paths(spec.path, data, steps)
    check_output(out, force, protected)
    return Prepared(spec, resolved_target, protected, origin)


@dataclass
class RunInputs:
    """What a recipe run stands on once its inputs are checked, handed to the execute and write steps whole:
    the model, target and paths it reads, where the model came from, the held-out rows, the threads, the
    sample the passes verify on (its ``host_runs_target`` says whether this host runs the target)."""

    spec: models.ModelSpec
    target: targets.Target
    protected: tuple
    origin: dict
    heldout: TextDataset
    threads: int
    ctx: PassContext


def prepare_run(model: str, recipe: Recipe, out: Path, *, force: bool, trust_remote_code: bool) -> RunInputs:
    """The first step of ``pipeline.run`` in one call: :func:`prepare` with the recipe's evaluation settings
    checked, then the held-out rows and the verification context (so the model goes into this module once
    and comes back with all of it, instead of the run calling back and forth); logs what the run stands on."""
    ready = prepare(model, [(step.name, step.options) for step in recipe.passes], out, force=force,
                    target=recipe.target, task=recipe.task, data=recipe.evaluation.data,
                    trust_remote_code=trust_remote_code, recipe=recipe)
    heldout = load_heldout(recipe, ready.spec)
    threads = recipe.evaluation.threads or host_facts.usable_cpus()
    ctx = verification_context(ready.spec, ready.target, recipe.evaluation.data, recipe.evaluation.text_column,
                               threads, effective_cpu_flags(), reported_texts=heldout.texts)
    ready = RunInputs(ready.spec, ready.target, ready.protected, ready.origin, heldout, threads, ctx)
    spec, target = ready.spec, ready.target
    if not ctx.host_runs_target:
        _log.info(f"note: this host lacks {target.name} ({', '.join(target.requires)}): timings below are not the target's")
    _log.info(f"model {spec.source} ({spec.model_type}, {spec.task}), target {target.name}, {threads} threads, "
              f"held-out {len(heldout)} rows from {heldout.source}")
    return ready
