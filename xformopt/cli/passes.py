"""One command per pass, so shell pipelines can compose them:

    xformopt export minilm -o e/ && xformopt fuse e/ -o f/ && xformopt quantize f/ -o q/
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from xformopt import api
from xformopt.cli import options as opt
from xformopt.cli import output
from xformopt.passes.record import PassRecord


def _run(name: str, src, out: Path, options: dict, as_json: bool, **run) -> None:
    """Run the pass through the API and print its record (--json) or its one-line summary."""

    result = api.run_pass(name, src, out, **run, **options)
    if as_json:
        output.emit_json(result.entry)
        return
    output.stdout.print(f"{name}: {result.summary}", highlight=False)
    output.stdout.print(f"wrote {out}", highlight=False)


def summary(entry: dict) -> str:
    """One line saying what the pass changed and how it was verified (the pass says it)."""
    return PassRecord.from_dict(entry).summary()


def export(
    model: opt.Model,
    out: opt.StageOut,
    opset: int = typer.Option(17, "--opset", help="ONNX opset."),
    exporter: Literal["family", "torchscript", "dynamo"] = typer.Option(
        "family", "--exporter", help="torchscript (optimum), dynamo (torch.onnx dynamo=True; extra `dynamo`), "
        "or the model family's (dynamo for ModernBERT)."),
    task: opt.Task = None,
    target: opt.Target = "auto",
    data: opt.PassData = None,
    force: opt.Force = False,
    wait: opt.Wait = False,
    trust_remote_code: opt.TrustRemoteCode = False,
    as_json: opt.Json = False,
    quiet: opt.Quiet = False,
) -> None:
    """Export MODEL to ONNX (dynamic batch/sequence axes), verified against PyTorch on real texts.

    Example: xformopt export minilm -o e/
    """
    options = {"opset": opset, "exporter": None if exporter == "family" else exporter}
    _run("export", model, out, options, as_json, target=target, task=task, data=data, force=force, wait=wait,
         trust_remote_code=trust_remote_code)


def fuse(
    stage: Annotated[Path, typer.Argument(metavar="DIR", help="An ONNX stage directory (the -o of `xformopt export`).")],
    out: opt.StageOut,
    select: Literal["fastest", "all", "none"] = typer.Option("fastest", "--select", help="fastest (time candidates, keep quickest), all, or none."),
    target: opt.Target = "auto",
    data: opt.PassData = None,
    force: opt.Force = False,
    wait: opt.Wait = False,
    as_json: opt.Json = False,
    quiet: opt.Quiet = False,
) -> None:
    """Apply ONNX Runtime's transformer fusions; report fused-op counts and which fusions were kept.

    Example: xformopt export minilm -o e/ && xformopt fuse e/ -o f/
    """
    _run("fuse", stage, out, {"select": select}, as_json, target=target, data=data, force=force, wait=wait)


def quantize(
    stage: Annotated[Path, typer.Argument(metavar="DIR", help="An ONNX stage directory (the -o of `xformopt export` or `fuse`).")],
    out: opt.StageOut,
    mode: Literal["dynamic", "static"] = typer.Option("dynamic", "--mode", help="dynamic (activations "
        "quantized at run time) or static (calibrated); 4-bit weight-only decoders: `xformopt int4`."),
    calibration_data: Path = typer.Option(
        None, "--calibration-data", metavar="FILE", help="Calibration texts, same formats as --data [default: a sample of the vendored train split]."),
    calibration_method: Literal["minmax", "entropy", "percentile"] = typer.Option("minmax", "--calibration-method", help="Static ranges: "
        "minmax, entropy or percentile."),
    max_accuracy_drop: opt.MaxAccuracyDrop = None,
    min_agreement: opt.MinAgreement = None,
    target: opt.Target = "auto",
    data: opt.PassData = None,
    force: opt.Force = False,
    wait: opt.Wait = False,
    as_json: opt.Json = False,
    quiet: opt.Quiet = False,
) -> None:
    """Quantize an ONNX stage to INT8 with the target's formats; report INT8 and float GEMMs.

    Example: xformopt quantize f/ -o q/ --mode static --calibration-method percentile --max-accuracy-drop 0.5

    Exits 1 when the accuracy budget or the agreement floor cannot be met (the best attempt is still
    written, with a failing verdict, and the command that accepts it is printed).
    """
    options: dict = {"mode": mode, "calibration_method": calibration_method}
    if calibration_data:
        options["calibration_data"] = str(calibration_data)
    if max_accuracy_drop is not None:  # over the budget, the most harmful nodes return to float
        options["max_accuracy_drop"] = max_accuracy_drop
    if min_agreement is not None:
        options["min_agreement"] = min_agreement
    _run("quantize", stage, out, options, as_json, target=target, data=data, force=force, wait=wait)


def int4(
    stage: Annotated[Path, typer.Argument(metavar="DIR", help="An ONNX decoder stage (the -o of `xformopt export` or `fuse`).")],
    out: opt.StageOut,
    algorithm: Literal["rtn", "hqq", "gptq"] = typer.Option("rtn", "--algorithm", help="rtn, hqq (data-free) or gptq (calibrated)."),
    block_size: int = typer.Option(32, "--block-size", help="Weights per scale: 16, 32, 64, 128 or 256."),
    keep_8bit: str = typer.Option(None, "--keep-8bit", help="Roles at 8 bits, comma-separated: lm_head, attention_output, down_proj, qkv, mlp_in."),
    max_perplexity_increase: str = typer.Option(None, "--max-perplexity-increase", help="Perplexity budget vs float, e.g. '3%'."),
    calibration_data: Path = typer.Option(
        None, "--calibration-data", metavar="FILE", help="gptq: calibration texts, same formats as --data [default: the vendored train split]."),
    min_agreement: opt.MinAgreement = None,
    target: opt.Target = "auto",
    data: opt.PassData = None,
    force: opt.Force = False,
    wait: opt.Wait = False,
    as_json: opt.Json = False,
    quiet: opt.Quiet = False,
) -> None:
    """Quantize a decoder's weights to 4 bits (MatMulNBits), optionally within a perplexity budget.

    Example: xformopt int4 e/ -o q4/ --algorithm hqq --keep-8bit lm_head --max-perplexity-increase 3%

    Exits 1 when the perplexity budget cannot be met (the best candidate is still written).
    """
    options: dict = {"algorithm": algorithm, "block_size": block_size}
    if keep_8bit:
        options["keep_8bit"] = [r.strip() for r in keep_8bit.split(",") if r.strip()]
    if max_perplexity_increase is not None:
        options["max_perplexity_increase"] = max_perplexity_increase
    if calibration_data:
        options["calibration_data"] = str(calibration_data)
    if min_agreement is not None:
        options["min_agreement"] = min_agreement
    _run("int4", stage, out, options, as_json, target=target, data=data, force=force, wait=wait)


def prune(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="Local Hugging Face folder, cached hub id, or alias (an encoder).")],
    out: opt.StageOut,
    sparsity: float = typer.Option(None, "--sparsity", help="Fraction of encoder FLOPs to remove (more than 0, at most 0.9), e.g. 0.5."),
    heads_per_layer: int = typer.Option(None, "--heads-per-layer", help="Explicit: attention heads kept per layer."),
    ffn_dim: int = typer.Option(None, "--ffn-dim", help="Explicit: FFN width kept (rounded to the target's SIMD multiple)."),
    layers: int = typer.Option(None, "--layers", help="Explicit: number of encoder layers kept."),
    strategy: Literal["auto", "width", "depth"] = typer.Option("auto", "--strategy", help="How --sparsity is allocated: auto, width, or depth."),
    importance: Literal["taylor", "magnitude"] = typer.Option("taylor", "--importance", help="taylor (gradients on data) or magnitude (data-free)."),
    samples: int = typer.Option(256, "--samples", help="Importance sample size (seeded)."),
    seed: int = typer.Option(0, "--seed", help="Seed for the samples and probes."),
    latency: bool = typer.Option(True, "--latency/--no-latency", help="Export, fuse and time pruned vs unpruned ONNX."),
    task: opt.Task = None,
    target: opt.Target = "auto",
    data: Path = typer.Option(None, "--data", metavar="FILE", help="Texts (and labels) for importance and accuracy [default: vendored train/test splits]."),
    force: opt.Force = False,
    wait: opt.Wait = False,
    as_json: opt.Json = False,
    quiet: opt.Quiet = False,
) -> None:
    """Prune attention heads, FFN neurons and layers (structured: smaller matrices, real CPU speed).

    Example: xformopt prune examples/sentiment/model -o pruned/ --sparsity 0.5
    """
    options = {"sparsity": sparsity, "heads_per_layer": heads_per_layer, "ffn_dim": ffn_dim, "layers": layers,
               "strategy": strategy, "importance": importance, "samples": samples, "seed": seed,
               "measure_latency": latency}  # --data is also prune's own data option (api.run_pass)
    _run("prune", model, out, options, as_json, target=target, task=task, data=data, force=force, wait=wait)


def distill(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="The student: a pruned model folder, or the teacher itself (a layer-dropped copy is trained).")],
    out: opt.StageOut,
    teacher: Path = typer.Option(None, "--teacher", metavar="DIR", help="Teacher model folder [default: the model "
        "named in MODEL's manifest.json, else MODEL itself]."),
    student_layers: int = typer.Option(None, "--student-layers", help="Keep this many student layers (evenly spaced) "
        "[default: half when cut from the teacher]."),
    train_data: Path = typer.Option(None, "--train-data", metavar="FILE", help="Training texts, labels optional "
        "(same formats as --data) [default: vendored train split]."),
    eval_data: Path = typer.Option(None, "--eval-data", metavar="FILE", help="Rows for evaluation and early stopping [default: vendored validation split]."),
    text_column: str = typer.Option(None, "--text-column", help="Text column of --train-data/--eval-data [default: guessed]."),
    label_column: str = typer.Option(None, "--label-column", help="Label column [default: guessed]; '' trains on texts only."),
    temperature: float = typer.Option(2.0, "--temperature", help="Softmax temperature of the soft-target KL."),
    alpha: float = typer.Option(0.5, "--alpha", help="Weight of the soft-target KL; 1 - alpha goes to the hard labels."),
    hidden_weight: float = typer.Option(0.0, "--hidden-weight", help="Weight of the hidden-state MSE (layer map: where each student layer came from)."),
    epochs: float = typer.Option(3.0, "--epochs", help="Passes over the training rows."),
    max_steps: int = typer.Option(None, "--max-steps", help="Stop after this many optimizer steps."),
    max_minutes: float = typer.Option(None, "--max-minutes", help="Time budget for the whole pass; the schedule is fitted into it."),
    lr: float = typer.Option(1e-4, "--lr", help="Peak learning rate (AdamW, warm-up then linear decay)."),
    batch_size: int = typer.Option(32, "--batch-size", help="Rows per training batch."),
    eval_every: int = typer.Option(None, "--eval-every", help="Steps between held-out evaluations [default: twice per epoch]."),
    patience: int = typer.Option(4, "--patience", help="Stop after this many evaluations without improvement (0: never)."),
    select: Literal["auto", "accuracy", "agreement", "cosine", "kl_to_teacher"] = typer.Option(
        "auto", "--select", help="Metric for early stopping and the best checkpoint [auto: accuracy with labels, "
        "agreement without, cosine for embeddings]."),
    keep: Literal["best", "last"] = typer.Option("best", "--keep", help="Student saved: the best evaluation's weights, "
        "or the last step's (the evaluation rows then choose nothing and stay an unbiased estimate)."),
    freeze_embeddings: bool = typer.Option(False, "--freeze-embeddings", help="Keep the word embeddings fixed (about 30% faster steps on MiniLM)."),
    relation_weight: float = typer.Option(0.0, "--relation-weight", help="Weight of the MiniLM self-attention relation "
        "loss (query-query, key-key, value-value), from the family table's last-layer map."),
    unlabeled_data: Path = typer.Option(None, "--unlabeled-data", metavar="FILE", help="More texts, labelled by the "
        "teacher (soft targets only) [default: with --augment, augmented copies of the training texts]."),
    augment: int = typer.Option(0, "--augment", min=0, help="Teacher-labelled augmented copies of each training text "
        "when no --unlabeled-data is given (0: none)."),
    qat: bool = typer.Option(False, "--qat/--no-qat", help="Quantization-aware last epoch(s): the target's dynamic INT8 "
        "simulated on every Linear."),
    qat_epochs: float = typer.Option(1.0, "--qat-epochs", help="Epochs of the quantization-aware phase."),
    seed: int = typer.Option(0, "--seed", help="Seed for data order, dropout and sampling."),
    device: Literal["auto", "cpu", "cuda"] = typer.Option("auto", "--device", help="auto (CUDA when present), cpu or cuda."),
    checkpoint_dir: Path = typer.Option(None, "--checkpoint-dir", metavar="DIR", help="Where resumable checkpoints go [default: under the xformopt cache]."),
    resume: bool = typer.Option(True, "--resume/--no-resume", help="Continue from a checkpoint of the same run when one exists."),
    task: opt.Task = None,
    target: opt.Target = "auto",
    data: Annotated[Path, typer.Option(
        "--data", metavar="FILE", help="The held-out texts your final report will score on: rows found here are dropped from "
        "training and evaluation, so the report stays honest [default: vendored VADER test split].")] = None,
    force: opt.Force = False,
    wait: opt.Wait = False,
    as_json: opt.Json = False,
    quiet: opt.Quiet = False,
) -> None:
    """Distill: train the student (pruned, or layer-dropped) against the teacher; writes an HF folder and distill_curve.png.

    Example: xformopt prune examples/sentiment/model -o p/ --layers 3 && xformopt distill p/ -o d/ --max-minutes 10

    Ctrl-C writes a checkpoint; rerunning the same command resumes from it.
    """
    options = {"teacher": str(teacher) if teacher else None, "student_layers": student_layers,
               "train_data": str(train_data) if train_data else None, "eval_data": str(eval_data) if eval_data else None,
               "text_column": text_column, "label_column": label_column, "temperature": temperature, "alpha": alpha,
               "hidden_weight": hidden_weight, "epochs": epochs, "max_steps": max_steps, "max_minutes": max_minutes,
               "lr": lr, "batch_size": batch_size, "eval_every": eval_every, "patience": patience,
               "select": select, "keep": keep,
               "freeze_embeddings": freeze_embeddings, "seed": seed, "relation_weight": relation_weight,
               "unlabeled_data": str(unlabeled_data) if unlabeled_data else None, "augment": augment,
               "qat": qat, "qat_epochs": qat_epochs,
               "device": device, "checkpoint_dir": str(checkpoint_dir) if checkpoint_dir else None, "resume": resume}
    _run("distill", model, out, options, as_json, target=target, task=task, data=data, force=force, wait=wait)


def register(app: typer.Typer) -> None:
    for command in (prune, distill, export, fuse, quantize, int4):
        app.command(command.__name__)(command)
