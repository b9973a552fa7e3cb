"""What every pass is: a typed options model, a declared stage, and a run that verifies itself.

Passes work directory to directory: a torch stage is a Hugging Face model directory, an ONNX stage
is a directory holding ``model.onnx`` plus the tokenizer and config files. That makes each pass a
shell command of its own, a cache entry of its own, and a stage the report can evaluate.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from xformopt.data import TextDataset
from xformopt.errors import InputError
from xformopt.models import ModelSpec
from xformopt.resources.defaults import VADER_LABELS, labels_cover_vendored
from xformopt.targets import Target, host_supports

Kind = Literal["hf", "onnx"]

_log = logging.getLogger("xformopt.passes")


class PassOptions(BaseModel):
    """Base of every pass's options: unknown keys are errors, never silently ignored."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class PassContext:
    spec: ModelSpec  # the model of the stage the pass reads (``src``): a pruned stage's own shape (stage_spec)
    target: Target
    sample_texts: Sequence[str]  # real held-out texts for parity checks and timing (a fixed sample)
    threads: int
    host_flags: set[str] = field(default_factory=set)
    reported_texts: Sequence[str] | None = None  # every row the report scores (distill keeps out of training)
    sample: TextDataset | None = None  # the sample as the task reads it (pairs, words, answers); None: texts only
    quiet: bool = False  # a pass run inside another (candidate graphs) keeps its lines to itself

    def log(self, message: str) -> None:
        """A pass's progress line, to the ``xformopt.passes`` logger (xformopt/logs.py)."""
        if not self.quiet:
            _log.info(message)

    @property
    def sample_data(self) -> TextDataset:
        """The verification sample as a TextDataset: what a pass runs ``predict_data`` on."""
        if self.sample is not None:
            return self.sample

        texts = list(self.sample_texts)
        return TextDataset(texts=texts, text_pairs=None, labels=None, label_names=None,
                           source="verification texts", row_ids=list(range(len(texts))))

    @property
    def heldout_texts(self) -> Sequence[str]:
        return self.sample_texts if self.reported_texts is None else self.reported_texts

    @property
    def host_runs_target(self) -> bool:
        return host_supports(self.target, self.host_flags)


class Pass:
    """A pass declares its name, its stage, what it consumes and produces, and what it needs.

    It also owns what the layers above ask about it (hooks, read by the recipe, the pipeline and the
    CLI, which know no pass by name): the command-line flags it reads (``flags``), the options that name
    data files (``data_options``), the vendored splits it would read with labels (``labelled_fallbacks``),
    when it reads an option at all (``reads``), what it refuses for a model before any work (``check``)
    and the defaults a target decides (``resolve``).
    """

    name: ClassVar[str]
    stage: ClassVar[Literal["torch", "onnx"]]
    consumes: ClassVar[Kind]
    produces: ClassVar[Kind]
    needs: ClassVar[tuple[str, ...]] = ()  # the data it reads, in words (shown by `xformopt passes list`)
    must_not_follow: ClassVar[dict[str, str]] = {}  # earlier pass -> why this one cannot come after it
    Options: ClassVar[type[PassOptions]] = PassOptions
    # The record's type (xformopt/passes/records.py): the keys ``run`` returns, held to it by the pipeline.
    Record: ClassVar[type | None] = None
    summary: ClassVar[str] = ""
    # What besides its input and options decides the output, for the cache key: "texts" (the sample
    # it verifies on), "reported" (the rows the report scores), "timing" (threads and CPU: it keeps
    # the faster of measured candidates). A pass that times nothing must not be re-run on a new host.
    depends_on: ClassVar[tuple[str, ...]] = ("texts", "timing")
    # Settings of `xformopt optimize` / ``xformopt.optimize()`` this pass reads -> the option each sets.
    # One flag feeds every pass that declares it: ``--train-data`` reaches prune's ``data`` and distill's
    # ``train_data``, and the manifest's resolved recipe shows where each one went.
    flags: ClassVar[dict[str, str]] = {}
    # Options naming a data file: checked to exist before any work; -o may never overwrite them.
    data_options: ClassVar[tuple[str, ...]] = ()
    # Data options whose default is a vendored split read *with labels* when the model is a classifier:
    # option -> (the split, what reads it). Refused before any work when those labels are not the model's.
    labelled_fallbacks: ClassVar[dict[str, tuple[str, str]]] = {}
    # Options the pass reads only in some configurations: option -> when, in words, for the line that
    # refuses a flag nothing reads (``reads`` decides).
    read_when: ClassVar[dict[str, str]] = {}
    # The options that set a model's shape, for a recipe's ``shape_search`` (xformopt/recipe_search/shapes.py): the
    # search sets these and drops the pass's ``shape_replaces`` (other ways of asking for a shape).
    shape_options: ClassVar[tuple[str, ...]] = ()
    shape_replaces: ClassVar[tuple[str, ...]] = ()
    # The option bounding the pass's own run time in minutes (a shape search gives each shape its own).
    minutes_option: ClassVar[str | None] = None
    # The option naming a pretrained student that replaces the shaped model (a shape search's ``student:`` entries).
    student_option: ClassVar[str | None] = None

    @classmethod
    def reads(cls, option: str, options: dict) -> bool:
        """Whether the pass reads ``option`` (its value, or its default data when unset) with ``options``:
        a flag that no pass of a recipe reads is refused, and so is a labelled fallback nobody reads."""
        return True

    @classmethod
    def check(cls, spec: ModelSpec, options: dict) -> None:
        """Refuse, before any work, what this pass cannot do for ``spec`` with ``options`` (one InputError
        naming the fix). The base checks that the model's task takes the pass and that no default data is
        read with labels that are not the model's, then asks the pass's own rules (``check_own``)."""
        task = spec.task_def
        if cls.name not in task.passes:
            raise InputError(f"unsupported architecture {spec.model_type!r} for pass {cls.name!r}: {task.name} models "
                             f"support {', '.join(task.passes)}")
        cls.check_labelled_fallbacks(spec, options)
        cls.check_own(spec, options)

    @classmethod
    def check_own(cls, spec: ModelSpec, options: dict) -> None:
        """The pass's own refusals for ``spec`` with ``options``, after the base's (``check``); none by default."""

    @classmethod
    def check_labelled_fallbacks(cls, spec: ModelSpec, options: dict) -> None:
        """The vendored movie-review splits can feed any model as plain text, but their labels (negative,
        positive) only score a classifier with exactly those classes: refuse to prune, distill or budget a
        3-class or LABEL_0/LABEL_1 classifier against them (xformopt/resources/defaults.py)."""
        if not spec.task_def.labels_from_config or labels_cover_vendored(spec.label2id):
            return
        for option, (split, what) in cls.labelled_fallbacks.items():
            if not options.get(option) and cls.reads(option, options):
                # No names in config.json: transformers calls the classes LABEL_0, LABEL_1, ...
                labels = ", ".join(sorted(spec.label2id)) or "unnamed: LABEL_0, LABEL_1, ..."
                flag = next((f"--{f.replace('_', '-')} FILE on `xformopt optimize`, " for f, o in cls.flags.items()
                             if o == option), "")
                raise InputError(
                    f"{what} would fall back to the vendored movie-review {split} split, whose labels "
                    f"({', '.join(VADER_LABELS)}) are not this model's ({labels}); give rows labelled for your "
                    f"model: {flag}`{option}` in the recipe's {cls.name} step")

    @classmethod
    def resolve(cls, options: dict, target: Target) -> dict:
        """``options`` with what ``target`` decides filled in where they say null (what a run will use:
        `xformopt recipes show --resolved`). Default: nothing is decided by the target."""
        return dict(options)

    @classmethod
    def cache_facts(cls, spec: ModelSpec, options: dict) -> dict:
        """What the model's family or the installed extras decide about this pass's output beyond its
        options (e.g. which exporter a family's row names when the recipe leaves it unset), for the cache
        key: a new default then re-runs the pass instead of reusing an old stage. Default: nothing."""
        return {}

    @staticmethod
    def summarize(record: dict) -> str:
        """One line saying what the pass changed and how it was verified, from its record."""
        return json.dumps(record)[:200]

    @staticmethod
    def report_facts(record: dict) -> dict:
        """Graph facts of the stage for the report (fused ops, INT8 coverage); none by default."""
        return {}

    @staticmethod
    def budget_failure(record: dict, out: Path) -> str:
        """The one line explaining a missed budget (``record["budget_met"] is False``)."""
        return f"budget not met; the best candidate was written to {out}"

    def run(self, ctx: PassContext, src: Path, dst: Path, options: PassOptions) -> dict:
        """Write the new stage into ``dst`` (an empty directory) and return the pass record:
        what changed and the figures that verify it. Raise PassFailed when verification fails."""
        raise NotImplementedError


def check_steps(spec: ModelSpec, steps: Sequence[tuple[type[Pass], dict]]) -> None:
    """What each step of a run refuses for ``spec`` (``Pass.check``), in the run's order: the input checks make
    one call here instead of going into every pass's module in turn."""
    for pass_cls, options in steps:
        pass_cls.check(spec, options or {})
