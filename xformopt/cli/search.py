"""`xformopt search`: trials of recipes proposed by Optuna, a Pareto front re-measured on this host."""

from __future__ import annotations

from pathlib import Path

import typer

from xformopt import api
from xformopt.cli import options as opt
from xformopt.cli import output
from xformopt.recipe_search.outputs import markdown

EXAMPLES = """
Examples:

    xformopt search minilm -o search/ --preset encoder-int8 --trials 6
    xformopt search ./my-bert -o search/ --space space.yaml --trials 24 --max-accuracy-drop 0.5
    xformopt search ./my-bert -o search/ --preset encoder --trials 40 --ray auto --cpus-per-trial 4
    xformopt search ./my-bert -o search/ --preset encoder --trials 60 --resume     # continue, 60 in all
    xformopt optimize ./my-bert --recipe search/best-recipe.yaml -o out/
"""


def search(
    model: opt.Model,
    out: Path = typer.Option(..., "--out", "-o", metavar="DIR", help="Search directory: trials/NNN/, search.json, search.md, pareto.png, best-recipe.yaml."),
    space: Path = typer.Option(None, "--space", metavar="FILE", help="Search space YAML (PASS.OPTION: [choices])."),
    preset: str = typer.Option(None, "--preset", help="Shipped space: encoder, encoder-int8, encoder-prune [default: encoder]."),
    trials: int = typer.Option(8, "--trials", min=1, help="Trials in all (with --resume: including those already run)."),
    objective: str = typer.Option("accuracy,latency", "--objective", help="What the sampler optimizes: accuracy, latency or both."),
    max_accuracy_drop: opt.MaxAccuracyDrop = None,
    sampler: str = typer.Option("tpe", "--sampler", help="Optuna sampler: tpe or nsga2."),
    seed: int = typer.Option(0, "--seed", help="Sampler seed."),
    ray: str = typer.Option(None, "--ray", metavar="ADDRESS", help="Run trials as Ray tasks on this cluster (host:port or auto); needs xformopt[ray]."),
    workers: int = typer.Option(None, "--workers", min=1, help="Trials at once [default: CPUs / --cpus-per-trial; 1 runs them in this process]."),
    cpus_per_trial: int = typer.Option(1, "--cpus-per-trial", min=1, help="CPUs (threads) each trial declares and uses."),
    remeasure_rounds: int = typer.Option(200, "--remeasure-rounds", min=3, help="Interleaved batch-1 rounds when re-measuring the front."),
    expand: bool = typer.Option(True, "--expand/--no-expand", help="After a trial with new prune/distill choices, run "
                                "its other fuse/quantize variants next (cheap: the pass cache has the trained model)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the search in DIR (its Optuna journal)."),
    force: opt.Force = False,
    trust_remote_code: opt.TrustRemoteCode = False,
    as_json: opt.Json = False,
    quiet: opt.Quiet = False,
) -> None:
    """Search recipes for MODEL: a Pareto front of accuracy (validation split) against latency.

    Each trial is a recipe run into DIR/trials/NNN/ (the pass cache runs shared prefixes once),
    scored on the validation split, never the report's test rows. Trials run side by side, so the
    front candidates are then re-measured serially, interleaved with the PyTorch baseline, the
    default INT8 artifact and optimum's own dynamic INT8, and the front is recomputed from those
    latencies.
    """

    result = api.search(
        model, output=out, space=space, preset=preset, trials=trials, objective=objective,
        max_accuracy_drop=max_accuracy_drop, sampler=sampler, seed=seed, ray=ray, workers=workers,
        cpus_per_trial=cpus_per_trial, remeasure_rounds=remeasure_rounds, expand=expand, resume=resume, force=force,
        trust_remote_code=trust_remote_code,
    )
    if as_json:
        output.emit_json(result.doc)
        return
    output.stdout.print(runner_summary(result.doc), highlight=False)


def runner_summary(doc: dict) -> str:

    front = markdown(doc).split("\nAll trials:")[0].rstrip()
    best = doc["best"]
    tail = f"best: trial {best['trial']:03d} -> {best['recipe_file']}" if best else "best: none (no trial completed)"
    return f"{front}\n\n{tail}"


def register(app: typer.Typer) -> None:
    app.command("search", help=(search.__doc__ or "") + EXAMPLES)(search)
