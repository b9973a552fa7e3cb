"""`xformopt optimize`: run a recipe on a model and print the stage-by-stage report."""

from __future__ import annotations

from pathlib import Path

import typer

from xformopt.cli import output
from xformopt.errors import InputError

EXAMPLES = """
Examples:

    xformopt optimize minilm                                   # packaged MiniLM, vendored held-out set
    xformopt optimize minilm --target avx512_vnni -o out/
    xformopt optimize ./my-bert --recipe fp32-fused --data test.csv --label-column y -o out/
    xformopt optimize ./my-bert -o out/ --json | jq '.stages[] | {name, speedup}'
    xformopt optimize minilm --mode real,fixed --batch 1,8 --seq 32,128,512 -o out/
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


def default_output(model: str) -> Path:
    return Path("xformopt-out") / (Path(model).name or "model")


def optimize(
    model: str = typer.Argument("minilm", help="Local HF directory, cached hub id, or alias (minilm, bert-base, distilbert, roberta-base)."),
    out: Path = typer.Option(None, "--out", "-o", help="Artifact directory [default: xformopt-out/MODEL]."),
    target: str = typer.Option(None, "--target", "-t", help="Hardware profile (auto, avx2, avx512, avx512_vnni, avx_vnni, arm64) [default: the recipe's, auto]."),
    recipe_name: str = typer.Option(None, "--recipe", "-r", help="Shipped recipe name or YAML path [default: export -> fuse -> dynamic INT8]."),
    task: str = typer.Option(None, "--task", help="text-classification, feature-extraction or text-generation (decoders) [default: from the config]."),
    data: Path = typer.Option(None, "--data", help="Held-out CSV/TSV/JSONL/datasets dir [default: vendored VADER test split]."),
    text_column: str = typer.Option(None, "--text-column", help="Text column [default: guessed]."),
    text_pair_column: str = typer.Option(None, "--text-pair-column", help="Second-sentence column for pair tasks."),
    label_column: str = typer.Option(None, "--label-column", help="Label column [default: guessed]."),
    limit: int = typer.Option(None, "--limit", min=1, help="Evaluate on at most N held-out rows (seeded sample)."),
    threads: int = typer.Option(None, "--threads", min=1, help="Intra-op threads [default: CPUs this process may use]."),
    seed: int = typer.Option(None, "--seed", help="Seed for held-out sub-sampling and timing order [default: 0]."),
    mode: str = typer.Option(None, "--mode", help="Latency modes, comma-separated: real, fixed, throughput [default: real]."),
    batch: str = typer.Option(None, "--batch", help="Batch sizes for fixed/throughput, e.g. 1,8,32."),
    seq: str = typer.Option(None, "--seq", help="Sequence lengths for fixed mode, e.g. 32,128,512."),
    force: bool = typer.Option(False, "--force", help="Replace an existing output directory."),
    wait: bool = typer.Option(False, "--wait", help="If another run is writing the same -o, wait for it instead of failing."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not reuse or store finished passes."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Allow the model's own Python code (off by default)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON document on stdout."),
) -> None:
    """Export, fuse and quantize MODEL for a target; report accuracy and latency per stage.

    Every stage (PyTorch fp32 baseline, ONNX export, fused, INT8) is scored on the held-out set and
    timed interleaved at batch 1; the artifact (model.onnx, tokenizer, config, manifest.json,
    report.json, report.md) is written atomically to -o.
    """
    from xformopt import pipeline, recipe
    from xformopt.report.console import console_table

    r = recipe.load(recipe_name) if recipe_name else recipe.from_flags(target=target or "auto", task=task)
    updates = {k: v for k, v in {"target": target, "task": task}.items() if v is not None}
    evaluation = {
        k: v for k, v in {
            "data": str(data) if data else None, "text_column": text_column, "text_pair_column": text_pair_column,
            "label_column": label_column, "limit": limit, "threads": threads, "seed": seed,
            "modes": csv_list(mode, "--mode"), "batch": csv_ints(batch, "--batch"), "seq": csv_ints(seq, "--seq"),
        }.items() if v is not None
    }
    r = recipe.validate({**r.to_dict(), **updates, "evaluation": {**r.evaluation.model_dump(), **evaluation}}, "<command line>")
    out = out or default_output(model)
    with output.progress_bars() as progress:
        result = pipeline.run(
            model, r, out, force=force, use_cache=not no_cache, trust_remote_code=trust_remote_code,
            log=output.log, progress=progress, wait=wait,
        )
    if as_json:
        output.emit_json(result.report)
        return
    output.stdout.print(console_table(result.report))
    output.stdout.print(f"artifact: {result.out}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("optimize", help=(optimize.__doc__ or "") + EXAMPLES)(optimize)
