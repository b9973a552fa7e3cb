"""Options and arguments several commands share, defined once so their names, metavars and help agree.

Argument names: MODEL is anything `sources.resolve` takes (a local Hugging Face folder, a cached hub
id, an alias); DIR is a folder an xformopt command wrote (a stage, or an artifact of optimize).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from xformopt import tasks
from xformopt.accuracy_budget import parse
from xformopt.cli import output


def _quiet(value: bool) -> None:
    if value:
        output.set_quiet(True)


def accuracy_drop(value: str | None) -> float | str | None:
    """`--max-accuracy-drop`: metric points (0.5) or relative to the reference value ('1%')."""
    if value is None:
        return None
    try:
        return parse(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


TARGETS = "auto, avx2, avx512, avx512_vnni, avx_vnni, arm64"

# -q/--quiet after the subcommand too (`xformopt bench DIR -q`); it only sets output's quiet flag.
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No log lines or progress on stderr (errors still print).",
                                     callback=_quiet, expose_value=False, is_eager=True)]
Json = Annotated[bool, typer.Option("--json", help="Print the result as one JSON document on stdout.")]
Force = Annotated[bool, typer.Option("--force", help="Replace an existing output directory.")]
Wait = Annotated[bool, typer.Option("--wait", help="If another run is writing the same -o, wait for it instead of failing.")]
StageOut = Annotated[Path, typer.Option("--out", "-o", metavar="DIR", help="Output stage directory (written atomically).")]
Target = Annotated[str, typer.Option("--target", "-t", help=f"Hardware profile ({TARGETS}).")]
Task = Annotated[str, typer.Option("--task", help=f"One of: {', '.join(tasks.TASKS)} [default: from the config's architectures].")]
PassData = Annotated[Path, typer.Option("--data", metavar="FILE", help="Real texts for parity checks and timing [default: vendored VADER test split].")]
TrustRemoteCode = Annotated[bool, typer.Option("--trust-remote-code", help="Allow the model's own Python code (off by default).")]
Threads = Annotated[int, typer.Option("--threads", min=1, help="Intra-op threads [default: CPUs this process may use].")]
TextColumn = Annotated[str, typer.Option("--text-column", help="Text column [default: guessed].")]
TextPairColumn = Annotated[str, typer.Option("--text-pair-column", help="Second-sentence column for pair tasks.")]
LabelColumn = Annotated[str, typer.Option("--label-column", help="Label column [default: guessed].")]
MaxAccuracyDrop = Annotated[str, typer.Option(
    "--max-accuracy-drop", metavar="POINTS|PCT", callback=accuracy_drop,
    help="Accuracy budget: metric points (0.5 = 0.5 accuracy points, or 0.005 cosine) or relative to the reference ('1%').")]

Model = Annotated[str, typer.Argument(metavar="MODEL", help="Local Hugging Face folder, cached hub id, or alias "
    "(minilm, mpnet, bert-base, distilbert, roberta-base).")]
MinAgreement = Annotated[float, typer.Option(
    "--min-agreement", min=0.0, max=1.0, metavar="FLOOR",
    help="INT8 agreement floor with the float graph (cosine, or the task's measure) [default: 0.99 embeddings, 0.9 otherwise].")]

