"""What every pass is: a typed options model, a declared stage, and a run that verifies itself.

Passes work directory to directory: a torch stage is a Hugging Face model directory, an ONNX stage
is a directory holding ``model.onnx`` plus the tokenizer and config files. That makes each pass a
shell command of its own, a cache entry of its own, and a stage the report can evaluate.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from xformopt.data import TextDataset
from xformopt.models import ModelSpec
from xformopt.targets import Target, host_supports

Kind = Literal["hf", "onnx"]


class PassOptions(BaseModel):
    """Base of every pass's options: unknown keys are errors, never silently ignored."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class PassContext:
    spec: ModelSpec
    target: Target
    sample_texts: Sequence[str]  # real held-out texts for parity checks and timing (a fixed sample)
    threads: int
    host_flags: set[str] = field(default_factory=set)
    log: Callable[[str], None] = lambda message: None
    reported_texts: Sequence[str] | None = None  # every row the report scores (distill keeps out of training)
    sample: TextDataset | None = None  # the sample as the task reads it (pairs, words, answers); None: texts only

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
    """A pass declares its name, its stage, what it consumes and produces, and what it needs."""

    name: ClassVar[str]
    stage: ClassVar[Literal["torch", "onnx"]]
    consumes: ClassVar[Kind]
    produces: ClassVar[Kind]
    needs: ClassVar[tuple[str, ...]] = ()  # the data it reads, in words (shown by `xformopt passes list`)
    must_not_follow: ClassVar[dict[str, str]] = {}  # earlier pass -> why this one cannot come after it
    Options: ClassVar[type[PassOptions]] = PassOptions
    summary: ClassVar[str] = ""
    # What besides its input and options decides the output, for the cache key: "texts" (the sample
    # it verifies on), "reported" (the rows the report scores), "timing" (threads and CPU: it keeps
    # the faster of measured candidates). A pass that times nothing must not be re-run on a new host.
    depends_on: ClassVar[tuple[str, ...]] = ("texts", "timing")

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
