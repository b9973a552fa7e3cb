"""One command per pass, so shell pipelines can compose them:

    xformopt export minilm -o e/ && xformopt fuse e/ -o f/ && xformopt quantize f/ -o q/
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from xformopt.cli import output

OUT = typer.Option(..., "--out", "-o", help="Output stage directory (written atomically).")
TARGET = typer.Option("auto", "--target", "-t", help="Hardware profile (auto, avx2, avx512, avx512_vnni, avx_vnni, arm64).")
FORCE = typer.Option(False, "--force", help="Replace an existing output directory.")
DATA = typer.Option(None, "--data", help="Real texts for parity checks and timing [default: vendored VADER test split].")
JSON = typer.Option(False, "--json", help="Print the pass record as one JSON document on stdout.")


def _finish(entry: dict, out: Path, as_json: bool) -> None:
    if as_json:
        output.emit_json(entry)
        return
    output.stdout.print(f"{entry['pass']}: {summary(entry)}", highlight=False)
    output.stdout.print(f"wrote {out}", highlight=False)


def summary(entry: dict) -> str:
    """One line saying what the pass changed and how it was verified."""
    rec = entry["record"]
    if entry["pass"] == "export":
        p = rec["parity"]
        return f"opset {rec['opset']}, parity max|diff| {p['max_abs_diff']:.1e}, min cosine {p['min_cosine']:.6f} at lengths {p['sequence_lengths']}"
    if entry["pass"] == "fuse":
        kept = ", ".join(f"{k} {v}" for k, v in rec["fused_kept"].items() if v) or "none"
        return f"kept {rec['kept']} ({kept}); {rec['reason']}"
    if entry["pass"] == "quantize":
        c = rec["coverage"]
        return (f"{c['int8']}/{c['weighted_gemms']} weighted GEMMs in INT8 ({json.dumps(c['int8_ops'])}), "
                f"{len(c['kept_float'])} kept in float; output cosine vs float {rec['agreement']['mean_cosine']:.4f}")
    return json.dumps(rec)[:200]


def export(
    model: str = typer.Argument(..., help="Local HF directory, cached hub id, or alias."),
    out: Path = OUT,
    opset: int = typer.Option(17, "--opset", help="ONNX opset."),
    task: str = typer.Option(None, "--task", help="text-classification or feature-extraction [default: from the config]."),
    target: str = TARGET,
    data: Path = DATA,
    force: bool = FORCE,
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Allow the model's own Python code."),
    as_json: bool = JSON,
) -> None:
    """Export MODEL to ONNX (dynamic batch/sequence axes), verified against PyTorch on real texts.

    Example: xformopt export minilm -o e/
    """
    from xformopt.pipeline import run_single

    entry = run_single("export", model, out, {"opset": opset}, target=target, task=task,
                       data=str(data) if data else None, force=force, trust_remote_code=trust_remote_code, log=output.log)
    _finish(entry, out, as_json)


def fuse(
    stage: Path = typer.Argument(..., help="An ONNX stage directory (output of `xformopt export`)."),
    out: Path = OUT,
    select: str = typer.Option("fastest", "--select", help="fastest (time candidates, keep quickest), all, or none."),
    target: str = TARGET,
    data: Path = DATA,
    force: bool = FORCE,
    as_json: bool = JSON,
) -> None:
    """Apply ONNX Runtime's transformer fusions; report fused-op counts and which fusions were kept.

    Example: xformopt export minilm -o e/ && xformopt fuse e/ -o f/
    """
    from xformopt.pipeline import run_single

    entry = run_single("fuse", str(stage), out, {"select": select}, target=target,
                       data=str(data) if data else None, force=force, log=output.log)
    _finish(entry, out, as_json)


def quantize(
    stage: Path = typer.Argument(..., help="An ONNX stage directory (output of export or fuse)."),
    out: Path = OUT,
    mode: str = typer.Option("dynamic", "--mode", help="dynamic (weights INT8 offline, activations at run time)."),
    target: str = TARGET,
    data: Path = DATA,
    force: bool = FORCE,
    as_json: bool = JSON,
) -> None:
    """Quantize an ONNX stage to INT8 with the target's formats; report INT8 and float GEMMs.

    Example: xformopt quantize f/ -o q/ --target avx512_vnni
    """
    from xformopt.pipeline import run_single

    entry = run_single("quantize", str(stage), out, {"mode": mode}, target=target,
                       data=str(data) if data else None, force=force, log=output.log)
    _finish(entry, out, as_json)


def register(app: typer.Typer) -> None:
    for command in (export, fuse, quantize):
        app.command(command.__name__)(command)
