"""`xformopt optimize`: run a recipe on a model and print the stage-by-stage report."""

from __future__ import annotations

from pathlib import Path

import typer

from xformopt import api
from xformopt.cli import options as opt
from xformopt.cli import output
from xformopt.errors import InputError
from xformopt.report.console import console_table

EXAMPLES = """
Examples:

    xformopt optimize minilm                                   # packaged MiniLM, vendored held-out set
    xformopt optimize minilm --target avx512_vnni -o out/
    xformopt optimize ./my-bert --recipe fp32-fused --data test.csv --label-column y -o out/
    xformopt optimize ./my-bert -o out/ --json | jq '.stages[] | {name, speedup}'
    xformopt optimize minilm --latency-mode real,fixed --batch 1,8 --seq 32,128,512 -o out/
    xformopt optimize ./tweets-model --recipe prune-distill-int8 --data test.csv --train-data train.csv --validation-data dev.csv
"""


def csv_list(value: str | None, flag: str) -> list[str] | None:
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise InputError(f"{flag} is empty; give a comma-separated list")
    return items


def csv_ints(value: str | None, flag: str) -> list[int] | None:
    items = csv_list(value, flag)
    if items is None:
        return None
    try:
        numbers = [int(v) for v in items]
    except ValueError:
        raise InputError(f"{flag} takes whole numbers separated by commas, e.g. 1,8,32 (got {value!r})") from None
    if min(numbers) < 1:
        raise InputError(f"{flag} values must be at least 1 (got {value!r})")
    return numbers


def latency_modes(latency_mode: str | None, mode: str | None) -> str | None:
    """--latency-mode, or the deprecated --mode (renamed: in `quantize`, --mode is dynamic/static)."""
    if mode is None:
        return latency_mode
    if latency_mode is not None:
        raise InputError("--mode is the deprecated name of --latency-mode; give only --latency-mode")
    output.log("warning: `optimize --mode` is deprecated, use --latency-mode (`quantize --mode` is dynamic/static)")
    return mode


def optimize(
    model: opt.Model = "minilm",
    out: Path = typer.Option(None, "--out", "-o", metavar="DIR", help="Artifact directory [default: xformopt-out/MODEL]."),
    target: str = typer.Option(None, "--target", "-t", help="Hardware profile (auto, avx2, avx512, avx512_vnni, "
        "avx_vnni, arm64) [default: the recipe's, auto]."),
    recipe_name: str = typer.Option(None, "--recipe", "-r", help="Shipped recipe name or YAML path [default: export -> fuse -> dynamic INT8]."),
    task: opt.Task = None,
    data: Path = typer.Option(None, "--data", metavar="FILE", help="Held-out CSV/TSV/JSONL/datasets dir [default: vendored VADER test split]."),
    text_column: opt.TextColumn = None,
    text_pair_column: opt.TextPairColumn = None,
    label_column: opt.LabelColumn = None,
    limit: int = typer.Option(None, "--limit", min=1, help="Evaluate on at most N held-out rows (seeded sample)."),
    num_beams: int = typer.Option(None, "--num-beams", min=1, max=64, help="Text-to-text models: the beam width "
                                  "every stage generates with [default: the model's generation config]."),
    threads: opt.Threads = None,
    seed: int = typer.Option(None, "--seed", help="Seed for held-out sub-sampling and timing order [default: 0]."),
    latency_mode: str = typer.Option(None, "--latency-mode", help="Latency modes, comma-separated: real, fixed, "
                                    "throughput, model (the model call alone, texts tokenized beforehand) [default: real]."),
    mode: str = typer.Option(None, "--mode", hidden=True, help="Deprecated alias of --latency-mode."),
    batch: str = typer.Option(None, "--batch", help="Batch sizes for fixed/throughput, e.g. 1,8,32."),
    seq: str = typer.Option(None, "--seq", help="Sequence lengths for fixed mode, e.g. 32,128,512."),
    train_data: Path = typer.Option(None, "--train-data", metavar="FILE", help="Your training rows for prune and distill [default: vendored train split]."),
    validation_data: Path = typer.Option(None, "--validation-data", metavar="FILE", help="Your validation rows for "
        "distill's evaluation and the INT8 accuracy budget [default: vendored validation split]."),
    unlabeled_data: Path = typer.Option(None, "--unlabeled-data", metavar="FILE", help="More texts (no labels) for "
        "distill: the teacher labels them [default: the recipe's, e.g. augmented copies of the training texts]."),
    calibration_data: Path = typer.Option(None, "--calibration-data", metavar="FILE", help="Your texts for static "
        "INT8 calibration [default: vendored train split]."),
    max_accuracy_drop: opt.MaxAccuracyDrop = None,
    per_channel: bool = typer.Option(None, "--per-channel/--no-per-channel", help="Per-channel INT8 weight scales [default: the target's]."),
    min_agreement: opt.MinAgreement = None,
    force: opt.Force = False,
    wait: opt.Wait = False,
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not reuse or store finished passes."),
    trust_remote_code: opt.TrustRemoteCode = False,
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON document on stdout."),
    quiet: opt.Quiet = False,
) -> None:
    """Export, fuse and quantize MODEL for a target; report accuracy and latency per stage.

    Every stage (PyTorch fp32 baseline, ONNX export, fused, INT8) is scored on the held-out set and
    timed interleaved at batch 1; the artifact (model.onnx, tokenizer, config, manifest.json,
    report.json, report.md) is written atomically to -o.
    """

    latency_mode = latency_modes(latency_mode, mode)
    # No --recipe is exactly `--recipe default`: one recipe, so two such runs always compare in `bench`.
    settings = dict(task=task, text_column=text_column, text_pair_column=text_pair_column, label_column=label_column,
                    limit=limit, num_beams=num_beams, threads=threads, seed=seed, latency_modes=csv_list(latency_mode, "--latency-mode"),
                    batch=csv_ints(batch, "--batch"), seq=csv_ints(seq, "--seq"), train_data=train_data,
                    validation_data=validation_data, calibration_data=calibration_data, unlabeled_data=unlabeled_data,
                    max_accuracy_drop=max_accuracy_drop, per_channel=per_channel, min_agreement=min_agreement)
    with output.progress_bars() as progress:
        result = api.optimize(model, recipe=recipe_name, target=target, data=data, output=out, force=force,
                              use_cache=not no_cache, trust_remote_code=trust_remote_code, wait=wait,
                              progress=progress, **settings)
    if as_json:
        output.emit_json(result.report)
        return
    output.stdout.print(console_table(result.report))
    output.stdout.print(f"artifact: {result.artifact}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("optimize", help=(optimize.__doc__ or "") + EXAMPLES)(optimize)
