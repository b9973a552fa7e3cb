"""One command per pass, so shell pipelines can compose them:

    xformopt export minilm -o e/ && xformopt fuse e/ -o f/ && xformopt quantize f/ -o q/

Each command's pass flags come from its pass's options model (xformopt/cli/pass_options.py): the
tables below hold only what is the command line's own, the shared arguments, flags that keep an
established spelling, and the fields left to recipes.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from xformopt import api
from xformopt.cli import options as opt
from xformopt.cli import output
from xformopt.cli.pass_options import Flag, Spelling, build_command, model_flags, options_from
from xformopt.passes import get_pass
from xformopt.passes.record import PassRecord

_KW = inspect.Parameter.KEYWORD_ONLY

# The options every pass command may take, in the order --help shows them: name -> (type, default).
SHARED: dict[str, tuple[Any, Any]] = {
    "task": (opt.Task, None), "target": (opt.Target, "auto"), "data": (opt.PassData, None),
    "force": (opt.Force, False), "wait": (opt.Wait, False), "trust_remote_code": (opt.TrustRemoteCode, False),
    "as_json": (opt.Json, False), "quiet": (opt.Quiet, False),
}


def _stage(help: str):
    return Annotated[Path, typer.Argument(metavar="DIR", help=help)]


def _model(help: str):
    return Annotated[str, typer.Argument(metavar="MODEL", help=help)]


def _data(help: str):
    return Annotated[Path, typer.Option("--data", metavar="FILE", help=help)]


@dataclass(frozen=True)
class PassCommand:
    """A single-pass command: its argument, the shared options it takes, and what its flags keep or leave out."""

    name: str
    doc: str
    source: tuple[str, Any]  # ("model" | "stage", the argument's annotated type)
    shared: tuple[str, ...]
    spellings: dict[str, Spelling] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)  # field -> why no flag sets it (a recipe does)
    data: Any = None  # --data's own type and help, where the pass reads it for more than parity
    data_field: str | None = None  # the field the shared --data also sets (api.run_pass): no flag of its own

    def flags(self) -> list[Flag]:
        cls = get_pass(self.name)
        left_out = {**self.left_out, **({self.data_field: "--data"} if self.data_field else {})}
        return model_flags(cls.Options, spellings=self.spellings, left_out=left_out, data_options=cls.data_options)


# The two budget flags keep the spellings quantize and int4 shared with `optimize` (metavar, range, parsing).
_MIN_AGREEMENT = Spelling(decls=("--min-agreement",), type=float | None,
                          option={"min": 0.0, "max": 1.0, "metavar": "FLOOR"})
_ACCURACY_DROP = Spelling(decls=("--max-accuracy-drop",), type=str | None,
                          option={"metavar": "POINTS|PCT", "callback": opt.accuracy_drop})
_RUN = ("target", "data", "force", "wait", "as_json", "quiet")

COMMANDS = (
    PassCommand(
        "prune",
        """Prune attention heads, FFN neurons and layers (structured: smaller matrices, real CPU speed).

        Example: xformopt prune examples/sentiment/model -o pruned/ --sparsity 0.5
        """,
        ("model", _model("Local Hugging Face folder, cached hub id, or alias (an encoder).")),
        ("task", *_RUN),
        spellings={"measure_latency": Spelling(decls=("--latency/--no-latency",))},
        data_field="data",
        data=_data("Texts (and labels) for importance and accuracy [default: vendored train/test splits]."),
    ),
    PassCommand(
        "distill",
        """Distill: train the student (pruned, or layer-dropped) against the teacher; writes an HF folder and distill_curve.png.

        Example: xformopt prune examples/sentiment/model -o p/ --layers 3 && xformopt distill p/ -o d/ --max-minutes 10

        Ctrl-C writes a checkpoint; rerunning the same command resumes from it.
        """,
        ("model", _model("The student: a pruned model folder, or the teacher itself (a layer-dropped copy is trained).")),
        ("task", *_RUN),
        spellings={"teacher": Spelling(type=Path | None, option={"metavar": "DIR"}),
                   "checkpoint_dir": Spelling(type=Path | None, option={"metavar": "DIR"})},
        data=_data("The held-out texts your final report will score on: rows found here are dropped from training "
                   "and evaluation, so the report stays honest [default: vendored VADER test split]."),
    ),
    PassCommand(
        "export",
        """Export MODEL to ONNX (dynamic batch/sequence axes), verified against PyTorch on real texts.

        Example: xformopt export minilm -o e/
        """,
        ("model", opt.Model),
        ("task", "target", "data", "force", "wait", "trust_remote_code", "as_json", "quiet"),
        # `--exporter family` (the default) is the model family's exporter: the field's None.
        spellings={"exporter": Spelling(type=Literal["family", "torchscript", "dynamo"], default="family",
                                        to_option=lambda value: None if value == "family" else value)},
    ),
    PassCommand(
        "fuse",
        """Apply ONNX Runtime's transformer fusions; report fused-op counts and which fusions were kept.

        Example: xformopt export minilm -o e/ && xformopt fuse e/ -o f/
        """,
        ("stage", _stage("An ONNX stage directory (the -o of `xformopt export`).")),
        _RUN,
        left_out={"expect": "a mapping (op type -> minimum count): set it in a recipe"},
    ),
    PassCommand(
        "quantize",
        """Quantize an ONNX stage to INT8 with the target's formats; report INT8 and float GEMMs.

        Example: xformopt quantize f/ -o q/ --mode static --calibration-method percentile --max-accuracy-drop 0.5

        Exits 1 when the accuracy budget or the agreement floor cannot be met (the best attempt is still
        written, with a failing verdict, and the command that accepts it is printed).
        """,
        ("stage", _stage("An ONNX stage directory (the -o of `xformopt export` or `fuse`).")),
        _RUN,
        spellings={"min_agreement": _MIN_AGREEMENT, "max_accuracy_drop": _ACCURACY_DROP},
    ),
    PassCommand(
        "int4",
        """Quantize a decoder's weights to 4 bits (MatMulNBits), optionally within a perplexity budget.

        Example: xformopt int4 e/ -o q4/ --algorithm hqq --keep-8bit lm_head --max-perplexity-increase 3%

        Exits 1 when the perplexity budget cannot be met (the best candidate is still written).
        """,
        ("stage", _stage("An ONNX decoder stage (the -o of `xformopt export` or `fuse`).")),
        _RUN,
        spellings={"min_agreement": _MIN_AGREEMENT},
    ),
)


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


def _doc(spec: PassCommand) -> str:
    doc = inspect.cleandoc(spec.doc)
    if spec.left_out:
        doc += (f"\n\nSet only in a recipe: {', '.join(spec.left_out)} "
                f"(`xformopt passes show {spec.name}`).")
    return doc


def command_for(spec: PassCommand):
    """The typer command function of SPEC: its argument, -o, the pass's flags, then the shared options."""
    flags = spec.flags()
    source_name, source_type = spec.source
    head = [inspect.Parameter(source_name, _KW, annotation=source_type),
            inspect.Parameter("out", _KW, annotation=opt.StageOut)]
    shared = []
    for name in spec.shared:
        annotation, default = SHARED[name]
        if name == "data" and spec.data is not None:
            annotation = spec.data
        shared.append(inspect.Parameter(name, _KW, default=default, annotation=annotation))

    def body(**values) -> None:
        options = options_from(flags, values)
        src, out, as_json = values.pop(source_name), values.pop("out"), values.pop("as_json")
        values.pop("quiet", None)  # handled by its callback (options.Quiet)
        _run(spec.name, src, out, options, as_json, **values)

    return build_command(spec.name, _doc(spec), [*head, *(f.parameter for f in flags), *shared], body)


def register(app: typer.Typer) -> None:
    for spec in COMMANDS:
        app.command(spec.name)(command_for(spec))
