"""The Python API: what every `xformopt` command does, as functions (docs/api.md).

``optimize`` runs a recipe into an artifact, ``run_pass`` one pass into a stage folder, ``load`` opens an
artifact for inference, ``bench`` re-measures (and gates) an artifact, ``search`` looks for the recipes
on the accuracy/latency front. The CLI parses its flags, calls one of these and renders the result.

Errors: every function raises :class:`xformopt.XformoptError` subclasses only (``xformopt.errors``):
``InputError`` for bad input (nothing was done or written), ``PassFailed`` when a pass broke,
``BudgetMissed`` (a ``GateFailed``) when a pass missed its accuracy budget: the artifact was written and
the exception's ``result`` holds it; pass ``check=False`` to get that result back instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from xformopt import logs, pipeline
from xformopt import recipe as recipes
from xformopt.benchmarking import run as bench_run
from xformopt.benchmarking.gate import failure_message
from xformopt.decoder.generator import TextGenerator
from xformopt.errors import BudgetMissed, GateFailed, InputError
from xformopt.models import artifact_task
from xformopt.passes import REGISTRY, get_pass
from xformopt.passes.record import PassRecord
from xformopt.recipe_search import run as runner
from xformopt.recipe_search import sampler as samplers
from xformopt.recipe_search import shapes
from xformopt.recipe_search import space as spaces
from xformopt.runtime.predictor import load_predictor
from xformopt.seq2seq.text import Text2TextModel

if TYPE_CHECKING:  # the recipe module loads pydantic and the pass registry: only when a run needs it
    from xformopt.recipe import Recipe
    from xformopt.report.types import Report

Log = Callable[[str], None]
RecipeLike = Union[str, Path, dict, "Recipe", None]  # a shipped name, a YAML path, a dict or a Recipe


def _forwarding_log(function):
    """The API's ``log=`` callable gets the ``xformopt`` logger's lines while ``function`` runs (the code
    below logs through the standard logging module, xformopt/logs.py); without one, nothing is printed
    unless the caller configured ``logging``."""

    @functools.wraps(function)
    def call(*args, log: Log | None = None, **kwargs):
        with logs.forwarded_to(log):
            return function(*args, **kwargs)

    return call


# --------------------------------------------------------------------------- optimize


@dataclass(kw_only=True)
class _Verdict:
    """``verdict``: "pass", or "budget-missed" (with ``check=False``; ``failure`` says which pass, by how much)."""

    verdict: str = "pass"
    failure: str | None = None

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


@dataclass
class Result(_Verdict):
    """What ``optimize`` made.

    ``artifact``: the artifact directory (model.onnx, tokenizer, manifest.json, report.json, report.md).
    ``manifest`` / ``report``: those two documents as dicts. ``verdict``: ``"pass"``, or ``"budget-missed"``
    (only with ``check=False``) when a pass kept its best effort but missed its accuracy budget;
    ``failure`` then says which and by how much. ``figures``: the headline numbers (see :attr:`figures`).
    """

    artifact: Path
    manifest: dict
    report: Report

    @property
    def figures(self) -> dict[str, Any]:
        """The artifact's headline figures against the PyTorch fp32 baseline: ``stage`` (the last pass),
        ``metric`` (the headline metric's name: accuracy, cosine_to_baseline, ...), ``value`` and
        ``baseline_value`` of that metric; ``latency_ms``, ``baseline_latency_ms`` and ``speedup`` from the
        interleaved batch-1 rounds (one comparison); ``solo_latency_ms``, the artifact timed alone in
        repeats (what ``bench`` re-measures); ``size_mb``."""
        stages = self.report.get("stages") or []
        if not stages:
            return {}
        first, last = stages[0], stages[-1]
        metric = self.report.get("headline_metric")
        artifact = self.report.get("artifact") or {}

        def value(metrics: dict) -> float | None:
            return (metrics.get(metric) or {}).get("value")

        return {
            "stage": last["name"], "metric": metric,
            "value": value(artifact.get("metrics") or last["metrics"]), "baseline_value": value(first["metrics"]),
            "latency_ms": last["latency"].get("median_ms"), "baseline_latency_ms": first["latency"].get("median_ms"),
            "speedup": last.get("speedup"), "solo_latency_ms": (artifact.get("latency") or {}).get("median_ms"),
            "size_mb": None if last.get("size_bytes") is None else round(last["size_bytes"] / 1e6, 2),
        }

    def __str__(self) -> str:
        f = self.figures
        head = f"{self.verdict}: {self.artifact}"
        if not f:
            return head
        def num(v, fmt):  # noqa: E306
            return "-" if v is None else format(v, fmt)
        text = (f"{head} ({f['stage']}): {f['metric']} {num(f['value'], '.4f')} (baseline {num(f['baseline_value'], '.4f')}), "
                f"{num(f['latency_ms'], '.2f')} ms (baseline {num(f['baseline_latency_ms'], '.2f')} ms, "
                f"{num(f['speedup'], '.2f')}x), {num(f['size_mb'], '.1f')} MB")
        return text + (f"; {self.failure}" if self.failure else "")


# Keyword arguments of optimize() that set the recipe's evaluation settings (EvaluationSettings fields).
_EVALUATION_ALIASES = {"latency_modes": "modes"}


def default_output(model: str) -> Path:
    """Where an artifact goes when no output is given: xformopt-out/<model name>."""
    return Path("xformopt-out") / (Path(str(model)).name or "model")


def resolve_recipe(recipe: RecipeLike = None, *, target: str | None = None, data: str | Path | None = None,
                   origin: str = "<command line>", **overrides) -> Recipe:
    """The recipe a run will use: ``recipe`` (a shipped name, a YAML path, a dict or a ``Recipe``; None is
    ``default``) with ``target``, ``task``, evaluation settings and data/budget flags set. An override
    that no pass of the recipe reads is an InputError (it would silently do nothing)."""

    if recipe is None or isinstance(recipe, (str, Path)):
        base = recipes.load(str(recipe or "default"))
    elif isinstance(recipe, dict):
        base = recipes.validate(recipe, "<recipe dict>")
    elif isinstance(recipe, recipes.Recipe):
        base = recipe
    else:
        raise InputError(f"recipe must be a name, a YAML path, a dict or a Recipe (got {type(recipe).__name__})")
    evaluation_fields = set(recipes.EvaluationSettings.model_fields)
    known = {"task", *recipes.override_flags(), *evaluation_fields, *_EVALUATION_ALIASES}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise InputError(f"optimize() got unknown setting(s) {', '.join(unknown)}; choose from {', '.join(sorted(known))}")
    given = {_EVALUATION_ALIASES.get(k, k): v for k, v in overrides.items() if v is not None}
    updates = {k: v for k, v in {"target": target, "task": given.pop("task", None)}.items() if v is not None}
    evaluation = {k: given.pop(k) for k in list(given) if k in evaluation_fields}
    if data is not None:
        evaluation["data"] = str(data)
    evaluation = {k: str(v) if isinstance(v, Path) else v for k, v in evaluation.items()}
    r = recipes.validate({**base.to_dict(), **updates, "evaluation": {**base.evaluation.model_dump(), **evaluation}}, origin)
    return recipes.apply_overrides(r, {k: str(v) if isinstance(v, Path) else v for k, v in given.items()}, origin)


@_forwarding_log
def optimize(model: str | Path, *, recipe: RecipeLike = None, target: str | None = None, data: str | Path | None = None,
             output: str | Path | None = None, force: bool = False, use_cache: bool = True,
             trust_remote_code: bool = False, wait: bool = False, check: bool = True, log: Log | None = None,
             progress: Callable[[str, int, int], None] | None = None, **overrides) -> Result:
    """Run a recipe on ``model`` and write the artifact: ``xformopt optimize`` as a function.

    Args:
        model: a local Hugging Face folder, a hub id (cached or downloadable), or an alias (``minilm``).
        recipe: a shipped recipe name, a YAML path, a dict or a ``xformopt.recipe.Recipe`` [default: ``default``,
            export -> fuse -> dynamic INT8].
        target: hardware profile (``auto``, ``avx2``, ``avx512``, ``avx512_vnni``, ``avx_vnni``, ``arm64``)
            [default: the recipe's, which is ``auto`` unless it names one].
        data: held-out file (CSV/TSV/JSONL/datasets dir) the report scores on [default: the vendored VADER test split].
        output: the artifact directory [default: ``xformopt-out/<model name>``].
        force: replace an existing ``output``. use_cache: reuse and store finished passes.
        trust_remote_code: allow the model's own code (off unless asked). wait: wait for another run
            writing the same ``output`` instead of refusing.
        check: raise ``BudgetMissed`` when a pass misses its accuracy budget (default); False returns the
            Result with ``verdict == "budget-missed"`` instead.
        log: called with each progress line (e.g. ``print``); progress: ``(what, done, total)`` callback.
        **overrides: recipe settings, as the CLI flags of the same name: ``task``; evaluation settings
            (``text_column``, ``text_pair_column``, ``label_column``, ``limit``, ``threads``, ``seed``,
            ``latency_modes`` (or ``modes``), ``batch``, ``seq``, ``latency_rounds``, ``warmup``, ``repeats``,
            ``fixed_rounds``, ``num_beams``); and what feeds the passes (``train_data``, ``validation_data``,
            ``calibration_data``, ``max_accuracy_drop``, ``per_channel``, ``min_agreement``).

    Returns:
        A :class:`Result`: artifact path, manifest, report, verdict and headline figures.

    Raises:
        InputError: bad input (model, recipe, data, output path, an override no pass reads); nothing written.
        BudgetMissed: with ``check=True``, a pass missed its accuracy budget; ``exc.result`` is the Result.
        PassFailed: a pass could not produce a verified stage.
    """

    r = resolve_recipe(recipe, target=target, data=data, **overrides)
    out = Path(output) if output is not None else default_output(str(model))
    extra = None
    if shapes.wanted(r, overrides.get("max_accuracy_drop")):  # the prune shape chosen for this task
        ready = pipeline.prepare(str(model), [(s.name, s.options) for s in r.passes], out, force=force,
                                 target=r.target, task=r.task, data=r.evaluation.data,
                                 trust_remote_code=trust_remote_code)  # every input check before the search
        r, searched = shapes.choose(ready, str(model), r, overrides["max_accuracy_drop"], out,
                                    trust_remote_code=trust_remote_code)
        extra = {"shape_search": searched}
    elif r.shape_search is not None:
        r = r.without_shape_search()  # no budget: the recipe's own shape
    try:
        run = pipeline.run(str(model), r, out, force=force, use_cache=use_cache, trust_remote_code=trust_remote_code,
                           progress=progress, wait=wait, extra_report=extra)
        return Result(run.out, run.manifest, run.report)
    except BudgetMissed as exc:
        run = exc.result
        result = Result(run.out, run.manifest, run.report, verdict="budget-missed", failure=exc.message)
        if check:
            raise BudgetMissed(exc.message, result, exc.accept) from None
        return result


# --------------------------------------------------------------------------- one pass


@dataclass
class PassResult(_Verdict):
    """What ``run_pass`` made: ``path`` (the stage folder, with manifest.json), ``entry`` (the pass's
    manifest entry: pass, options, seconds, record), ``summary`` (the pass's one line on what it changed
    and how it verified it), ``verdict`` (``"pass"`` or, with ``check=False``, ``"budget-missed"``)."""

    path: Path
    entry: dict

    @property
    def record(self) -> dict:
        return self.entry.get("record") or {}

    @property
    def summary(self) -> str:

        return PassRecord.from_dict(self.entry).summary()


@_forwarding_log
def run_pass(name: str, src: str | Path, dst: str | Path, *, target: str = "auto", task: str | None = None,
             data: str | Path | None = None, force: bool = False, trust_remote_code: bool = False,
             wait: bool = False, check: bool = True, log: Log | None = None, **options) -> PassResult:
    """Run one pass (``export``, ``fuse``, ``quantize``, ``int4``, ``prune``, ``distill``) from ``src`` into ``dst``:
    the single-pass commands as a function. The stage's manifest extends ``src``'s pass history.

    Args:
        name: the pass. src: a model (folder, hub id, alias) for export/prune/distill, or a stage folder.
        dst: the new stage folder. target: hardware profile [default: auto].
        task: the model's task [default: the model's, or the one ``src``'s chain started with].
        data: rows the pass verifies on [default: the vendored test split]; a pass with a ``data`` option
            of its own (prune: importance and accuracy rows) gets the same file, as ``--data`` does on the CLI.
        force, trust_remote_code, wait, check, log: as in :func:`optimize`.
        **options: the pass's options (``xformopt passes show NAME``), e.g. ``mode="static"``.

    Raises:
        InputError: bad input; BudgetMissed: ``check=True`` and the accuracy budget was missed
        (``exc.result`` is the PassResult); PassFailed: the pass broke.
    """

    if name not in REGISTRY:
        raise InputError(f"no pass named {name!r}; choose {', '.join(REGISTRY)} (`xformopt passes list`)")
    pass_cls = get_pass(name)
    data = str(data) if data is not None else None
    if data is not None and "data" in pass_cls.Options.model_fields:
        options.setdefault("data", data)
    options = {k: str(v) if isinstance(v, Path) else v for k, v in options.items()}
    try:
        entry = pipeline.run_single(name, str(src), Path(dst), options, target=target, task=task, data=data,
                                    force=force, trust_remote_code=trust_remote_code, wait=wait)
        return PassResult(Path(dst), entry)
    except BudgetMissed as exc:
        result = PassResult(Path(dst), exc.result, verdict="budget-missed", failure=exc.message)
        if check:
            raise BudgetMissed(exc.message, result, exc.accept) from None
        return result


# --------------------------------------------------------------------------- load


def load(artifact: str | Path, **options):
    """Open an artifact for inference, batched, with the task's own calls.

    Encoders (classification, embeddings, token classification, question answering, ...): a predictor
    from :mod:`xformopt.runtime.predictor` with ``.task``, ``.embed(texts)`` and ``.predict(inputs)``.
    Decoders (text-generation): a :class:`xformopt.decoder.generator.TextGenerator` with
    ``.generate(prompt, max_new_tokens=32, ...)``. ``options`` go to that object (e.g. ``threads=2``).

    Raises:
        InputError: not an artifact directory (no model.onnx, tokenizer or config).
    """

    path = Path(artifact)
    task = artifact_task(path)
    # Not an artifact xformopt can read: the predictor's own checks say what is missing.
    return (_LOADERS[task.graph] if task is not None else load_predictor)(path, **options)


# Task.graph -> what serves it (encoder-decoders: ``.generate(sources, settings)``, ``.options(num_beams=...)``)
_LOADERS = {"encoder": load_predictor, "decoder": TextGenerator, "seq2seq": Text2TextModel}


# --------------------------------------------------------------------------- bench


@dataclass
class BenchResult:
    """What ``bench`` measured. ``doc``: the bench document (``xformopt.bench/1`` for encoders, the
    generation bench ``xformopt.generation-bench/1`` for decoders; encoder-decoders take the first), as ``--json`` prints it.
    ``comparison``: ``doc["comparison"]`` (encoders and encoder-decoders; None for decoders). ``verdict``: ``"pass"`` (gated,
    every check passed), ``"regression"`` (gated, a check failed: ``failure`` says which), or
    ``"informative"`` (nothing gated: no baseline, or a decoder)."""

    doc: dict
    kind: str  # "encoder" | "seq2seq" | "generation"

    @property
    def comparison(self) -> dict | None:
        return self.doc.get("comparison") if self.kind != "generation" else None

    @property
    def gated(self) -> bool:
        return bool(self.comparison and self.comparison["gated"])

    @property
    def verdict(self) -> str:
        if not self.gated:
            return "informative"
        return "pass" if self.comparison["passed"] else "regression"

    @property
    def failure(self) -> str | None:

        return failure_message(self.comparison) if self.verdict == "regression" else None


@_forwarding_log
def bench(artifact: str | Path, *, baseline: str | Path | None = None, data: str | Path | None = None,
          text_column: str | None = None, text_pair_column: str | None = None, label_column: str | None = None,
          limit: int | None = None, seed: int | None = None, threads: int | None = None, rounds: int | None = None,
          warmup: int | None = None, repeats: int | None = None, max_latency_regression: str | float = "5%",
          max_accuracy_drop: str | float = "0.5", allow_host_mismatch: bool = False,
          output: str | Path | None = None, junit: str | Path | None = None, check: bool = False,
          log: Log | None = None, **generation) -> BenchResult:
    """Re-measure an artifact as ``optimize`` measured it and, with ``baseline``, gate on it: ``xformopt bench``.

    A text-generation artifact is measured by :func:`bench_generation`: ``seed``, ``threads``, ``rounds`` and
    ``output`` carry over, and ``**generation`` takes its own settings (``prompt_tokens``, ``new_tokens``,
    ``compare``, ``cache_only``, ``pytorch``), refused for any other artifact.

    Args:
        artifact: the output folder of ``optimize`` or of a single pass.
        baseline: a report.json or an earlier bench JSON; without it the artifact's own report is the
            informative comparison and nothing is gated.
        data, text_column, text_pair_column, label_column, limit, seed, threads, rounds, warmup, repeats:
            measurement settings [default: as the artifact's report used them].
        max_latency_regression: allowed slow-down beyond noise (``"5%"`` or ``0.05``).
        max_accuracy_drop: allowed drop of the headline metric in points (``0.5``) or relative (``"1%"``).
        allow_host_mismatch: compare with a baseline from another host (settings must still match).
        output: also write the bench document (JSON) here; junit: also write the checks as JUnit XML.
        check: raise ``GateFailed`` on a regression (default False: read ``verdict``).
        log: progress lines.

    Returns:
        A :class:`BenchResult`.

    Raises:
        InputError: bad input, or a baseline that is not comparable (other settings, another host).
        GateFailed: with ``check=True``, a gated check regressed.
    """

    artifact = Path(artifact)
    task = artifact_task(artifact)
    graph = task.graph if task is not None else "encoder"  # not an artifact: the encoder bench says why
    _check_generation_settings(generation, graph)
    if graph == "decoder":
        if baseline is not None or junit is not None:  # nothing gates generation
            task.refuse("gate", ", ".join(f for f, v in {"--baseline": baseline, "--junit": junit}.items() if v))
        return bench_generation(artifact, **generation, rounds=rounds, threads=threads, seed=seed, output=output)
    if graph not in bench_run.MEASURES:
        task.refuse("bench", f"{artifact} is a {task.name} artifact")
    paths = {k: Path(v) if v is not None else None for k, v in (("baseline", baseline), ("data", data),
                                                                  ("output", output), ("junit", junit))}
    bench_run.check_apart(artifact, (paths["data"], paths["baseline"]), **{"-o": paths["output"], "--junit": paths["junit"]})
    if task is not None and (used := [f for f, v in {"--baseline": baseline, "--junit": junit}.items() if v]):
        task.refuse("gate", ", ".join(used))  # what gates (a baseline, JUnit checks) for the artifact's task
    doc = bench_run.bench_encoder(artifact, baseline=paths["baseline"], data=paths["data"], out=paths["output"],
                                  junit=paths["junit"], text_column=text_column, text_pair_column=text_pair_column,
                                  label_column=label_column, limit=limit, seed=seed, threads=threads, rounds=rounds,
                                  warmup=warmup, repeats=repeats, max_latency_regression=max_latency_regression,
                                  max_accuracy_drop=max_accuracy_drop, allow_host_mismatch=allow_host_mismatch)
    result = BenchResult(doc, graph)
    if check and result.verdict == "regression":
        raise GateFailed(result.failure)
    return result


_GENERATION_SETTINGS = {"prompt_tokens": "--prompt-tokens", "new_tokens": "--new-tokens", "compare": "--compare",
                        "cache_only": "--cache-only", "pytorch": "--no-pytorch"}


def _check_generation_settings(given: dict, graph: str) -> None:
    """The generation bench's own settings: known names, and for a text-generation artifact only."""
    unknown = [k for k in given if k not in _GENERATION_SETTINGS]
    if unknown:
        raise TypeError(f"bench() got unexpected keyword argument(s) {', '.join(unknown)}")
    used = [_GENERATION_SETTINGS[k] for k, v in given.items() if (not v if k == "pytorch" else v)]
    if used and graph != "decoder":
        raise InputError(f"{', '.join(used)} apply to text-generation artifacts only")


@_forwarding_log
def bench_generation(artifact: str | Path, *, prompt_tokens: Sequence[int] | None = None,
                     new_tokens: Sequence[int] | None = None, compare: Sequence[str | Path] = (),
                     cache_only: bool = False, pytorch: bool = True, rounds: int | None = None,
                     threads: int | None = None, seed: int | None = None, output: str | Path | None = None,
                     log: Log | None = None) -> BenchResult:
    """A text-generation artifact's benchmark: TTFT, per-token latency and tokens/s (``xformopt bench`` of a
    decoder); nothing is gated.

    Args:
        artifact: a decoder artifact (``optimize`` or the ``int4`` pass's output).
        prompt_tokens, new_tokens: prompt lengths and tokens generated per run [default: 16,64 and 32,128].
        compare: more ONNX stage folders timed beside it. cache_only: skip the runs without the KV cache.
        pytorch: time the PyTorch model too. rounds, threads, seed: timing settings.
        output: also write the document (JSON) here. log: progress lines.
    """
    artifact = Path(artifact)
    task = artifact_task(artifact)
    if task is None or task.graph != "decoder":
        raise InputError(f"{artifact} is not a text-generation artifact; xformopt.bench measures it")
    out = Path(output) if output is not None else None
    bench_run.check_apart(artifact, (), **{"-o": out})
    doc = bench_run.bench_generation(artifact, compare=[Path(c) for c in compare], pytorch=pytorch,
                                     prompt_tokens=prompt_tokens, new_tokens=new_tokens, cache_only=cache_only,
                                     rounds=rounds, threads=threads, seed=seed, out=out)
    return BenchResult(doc, "generation")




# --------------------------------------------------------------------------- search


@dataclass
class SearchResult:
    """What ``search`` found. ``doc``: search.json (also written to ``output``). ``front``: the Pareto
    front's trials (accuracy against the re-measured latency). ``best``: the trial picked as best (None
    when none met the budget) and ``best_recipe``: its recipe YAML, runnable with ``optimize(recipe=...)``."""

    output: Path
    doc: dict

    @property
    def front(self) -> list[dict]:
        return list(self.doc.get("front") or [])

    @property
    def best(self) -> dict | None:
        return self.doc.get("best")

    @property
    def best_recipe(self) -> Path | None:
        best = self.best
        return self.output / best["recipe_file"] if best and best.get("recipe_file") else None


@_forwarding_log
def search(model: str | Path, *, output: str | Path, space: str | Path | None = None, preset: str | None = None,
           trials: int = 8, objective: str | Sequence[str] = ("accuracy", "latency"),
           max_accuracy_drop: str | float | None = None, sampler: str = "tpe", seed: int = 0, ray: str | None = None,
           workers: int | None = None, cpus_per_trial: int = 1, remeasure_rounds: int = 200, expand: bool = True,
           resume: bool = False, force: bool = False, trust_remote_code: bool = False, log: Log | None = None) -> SearchResult:
    """Search recipes for ``model``: trials proposed by Optuna, scored on the validation split, and a
    Pareto front re-measured serially on this host: ``xformopt search``. Needs ``xformopt[search]``.

    Args:
        model: as in :func:`optimize` (an encoder). output: the search directory (trials/NNN/, search.json,
            search.md, pareto.png, best-recipe.yaml).
        space: a search space YAML (``PASS.OPTION: [choices]``); preset: a shipped space (encoder,
            encoder-int8, encoder-prune) [default: encoder]; give one of them at most.
        trials: trials in all (with ``resume``, counting those already run). objective: ``accuracy``,
            ``latency`` or both (a comma-separated string or a sequence).
        max_accuracy_drop: the budget a trial must keep to count as best [default: 1 point].
        sampler: ``tpe`` or ``nsga2``; seed: its seed. ray: a Ray cluster address (``auto``) to run trials
            on (``xformopt[ray]``). workers: trials at once. cpus_per_trial: threads each trial uses.
        remeasure_rounds: interleaved rounds when re-measuring the front. expand: after a trial with new
            prune/distill choices, run its fuse/quantize variants next. resume: continue the search in
            ``output``. force: replace an existing search directory. trust_remote_code, log: as in optimize.

    Raises:
        InputError: bad input, a missing extra, a decoder model, or no trial completed.
    """

    objectives = samplers.parse_objectives(objective if isinstance(objective, str) else ",".join(objective))
    if sampler not in samplers.SAMPLERS:
        raise InputError(f"--sampler {sampler!r}: choose {', '.join(samplers.SAMPLERS)}")
    if ray:
        from xformopt.recipe_search.executors.ray import require_ray

        require_ray()
    samplers.require_optuna()
    settings = runner.Settings(
        model=str(model), out=Path(output), space=spaces.load(str(space) if space else None, preset), trials=trials,
        objectives=objectives, max_accuracy_drop=1.0 if max_accuracy_drop is None else max_accuracy_drop,
        sampler=sampler, seed=seed, ray=ray, workers=workers, cpus_per_trial=cpus_per_trial, resume=resume,
        force=force, remeasure_rounds=remeasure_rounds, trust_remote_code=trust_remote_code, expand=expand,
    )
    return SearchResult(Path(output), runner.search(settings))
