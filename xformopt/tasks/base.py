"""What a task is: everything a pass, the evaluator, the bench and the report need to know about it.

A task is one object (one module under ``xformopt/tasks/``); nothing outside this package tests a task's
name. Callers ask the task: which transformers class loads it, what its exported graph's inputs and outputs
are called, how its held-out rows are read,
what the graph's outputs become (pooled embeddings, word-level tags, answer spans), how a stage is scored
against the PyTorch baseline, what one INT8 agreement figure is, which passes apply.

Outputs flow as numpy arrays of one row per held-out example (padded where a task's rows are ragged),
so they can be saved in the artifact as ``reference/baseline_outputs.npy`` without pickle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from xformopt.data import load_text_dataset
from xformopt.errors import InputError
from xformopt.families import DECODERS
from xformopt.resources import vader_split_path
from xformopt.scoring.metrics import row_cosine

if TYPE_CHECKING:  # typing only: a task module imports no pipeline layer
    from xformopt.data import TextDataset

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Metric:
    """How reports, the bench and the gate show one metric a task computes."""

    label: str
    percent: bool = False  # a proportion, shown as a percentage (macro-F1 and F1 scores stay 0-1)
    relative: bool = False  # measured against the baseline's own outputs: 1 on the baseline row by definition
    lower_is_better: bool = False
    bounds: tuple[float, float] = (0.0, 1.0)  # the values it can take: a baseline outside them is refused


class Task:
    """Base class; one subclass instance per task, registered in :mod:`xformopt.tasks`."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    auto_model: ClassVar[str] = "AutoModel"  # transformers class that loads the checkpoint
    # The exported graph's outputs, in the model output's order (the names optimum's exporter used, so
    # artifacts keep the interface clients already read), and the dynamic axes of every text input.
    export_outputs: ClassVar[tuple[str, ...]] = ("last_hidden_state",)
    input_axes: ClassVar[tuple[str, ...]] = ("batch_size", "sequence_length")
    architectures: ClassVar[tuple[str, ...]] = ()  # config.architectures suffixes that detect the task
    headline: ClassVar[str] = "accuracy"  # the metric the report leads with
    # Every metric ``score`` can return, the headline first, then the secondary columns in report order.
    metrics: ClassVar[dict[str, Metric]] = {}
    # What the task's graph is to the code that runs and measures it: "encoder" (one forward per request)
    # or "decoder" (a prompt step, then one cached step per new token: a KV cache). Code that runs a stage
    # differently keys a table by it (export route, candidate timing, INT8 agreement, evaluation, bench,
    # ``xformopt.load``); none tests it in an if.
    graph: ClassVar[str] = "encoder"
    labels_from_config: ClassVar[bool] = False  # label2id comes from the config (classifier heads)
    needs_labels: ClassVar[bool] = False  # held-out rows must be labelled (else the metric is meaningless)
    # The task's head may be absent from the checkpoint and start at random (a classifier on a base model);
    # not a language-model head, which only pretraining trains (xformopt.models.weight_coverage).
    head_may_be_fresh: ClassVar[bool] = True
    passes: ClassVar[tuple[str, ...]] = ("export", "fuse", "quantize")  # prune/distill need a torch_objective
    # The default INT8 agreement floor (mean of ``agreement`` rows) when the recipe sets none.
    agreement_floor: ClassVar[float] = 0.9
    agreement_measure: ClassVar[str] = "cosine"  # what ``agreement`` computes, in words (for records)
    # quantize's helpers that feed the graph rows of model inputs work for this task: static calibration,
    # the accuracy budget and the harm ranking of the float-GEMM ladder. False where the graph also takes
    # a KV cache (decoders): dynamic INT8 only, agreement measured on logits.
    int8_calibration: ClassVar[bool] = True
    # What prune and distill optimise the student towards: "logits" (the head's output, labels where
    # given) or "embedding" (mean-pooled token states); None: those passes do not take this task.
    torch_objective: ClassVar[str | None] = None
    # How ``xformopt.load(ARTIFACT)`` answers and ``xformopt serve`` / ``loadtest`` expose the task
    # (xformopt/tasks/heads.py); None: the predictor does not take this task (decoders and seq2seq models
    # have runners of their own).
    head: ClassVar[Any] = None
    serving: ClassVar[Any] = None

    # Commands that do not take this task's models or artifacts -> why, and what to use instead.
    refuses: ClassVar[dict[str, str]] = {
        "generate": f"generate needs a decoder ({', '.join(DECODERS)}) exported for text-generation"}

    def claims(self, config: dict) -> bool:
        """Whether a checkpoint's config says it was trained for this task (``tasks.detect`` asks each
        task in turn): its config.architectures end with one of ``architectures``."""
        names = config.get("architectures") or []
        return bool(self.architectures) and any(a.endswith(self.architectures) for a in names)

    @property
    def decoder(self) -> bool:
        """Decoder families (KV cache) vs encoders: what ``tasks.detect`` matches against the family."""
        return self.graph == "decoder"

    def refuse(self, command: str, subject: str) -> None:
        """Raise the task's one-line refusal of ``command`` (``refuses``), after ``subject`` (what was
        given, e.g. "out/ is a text-generation artifact"); nothing when the task takes the command."""
        if command in self.refuses:
            raise InputError(f"{subject}; {self.refuses[command]}")

    # ------------------------------------------------------------------ data

    def load(self, path: str | Path, *, label2id: dict[str, int] | None, limit: int | None, seed: int,
             columns: dict[str, str | None] | None = None, require_labels: bool | None = None) -> TextDataset:
        """Held-out (or training) rows from ``path`` in the task's formats. ``columns``: the user's
        column names (text, text_pair, label) where the task reads columns."""
        columns = columns or {}
        return load_text_dataset(
            path, text_column=columns.get("text"), text_pair_column=columns.get("text_pair"),
            label_column=columns.get("label"), label2id=label2id,
            require_labels=self.needs_labels if require_labels is None else require_labels, limit=limit, seed=seed)

    def default_data(self, split: str) -> Path:
        """The vendored rows used when the user names no data (the VADER movie-review split: texts with
        negative/positive labels). A task whose rows need more than a text raises an InputError naming --data."""
        return vader_split_path(split)

    # ------------------------------------------------------------------ running a stage

    def encode(self, tokenizer, texts: Sequence[str], pairs: Sequence[str] | None = None,
               max_length: int = 512) -> dict[str, np.ndarray]:
        """One batch of texts (and pairs) as the graph's numpy inputs, padded to the batch's longest."""
        return dict(tokenizer(list(texts), list(pairs) if pairs is not None else None, padding=True, truncation=True,
                              max_length=max_length, return_tensors="np"))

    def combine(self, outputs: Sequence[np.ndarray]) -> np.ndarray:
        """The graph's (or torch model's) outputs as one array: what export parity compares."""
        return outputs[0]

    def finish(self, raw: np.ndarray, encoded: dict[str, np.ndarray]) -> np.ndarray:
        """One batch's combined output -> the task's per-row output (e.g. pooled embeddings)."""
        return raw

    def predict(self, predictor, data: TextDataset, batch_size: int = 32, progress: Progress | None = None) -> np.ndarray:
        """Outputs for every row of ``data`` (one row each), through ``predictor`` (xformopt.runtime.encoder)."""
        return predictor.predict(data.texts, data.text_pairs, batch_size=batch_size, progress=progress)

    def timing_inputs(self, data: TextDataset) -> tuple[list[str], list[str] | None]:
        """What latency is measured on: the texts (and pairs) a served request carries, one request per
        row, each fed through ``encode`` (a question with its context, a context with its choices)."""
        return list(data.texts), data.text_pairs

    def model_inputs(self, data: TextDataset) -> tuple[list[str], list[str] | None]:
        """Every single request the model receives for ``data``, as (texts, pairs) for ``encode``: what
        export parity checks, so the encoded length of a pair (not its first text) decides which rows
        span the lengths. Default: the timed requests."""
        return self.timing_inputs(data)

    # ------------------------------------------------------------------ scoring

    def score(self, outputs: np.ndarray, baseline: np.ndarray | None, data: TextDataset, seed: int = 0) -> dict:
        """Metrics of one stage's ``outputs`` on ``data``; ``baseline`` is the PyTorch fp32 model's, or
        None when a bench run has none for these rows (then only the metrics against labels).
        Each metric is ``{"value", "n", "ci95", ...}`` (xformopt.scoring.metrics)."""
        raise NotImplementedError

    def row_scores(self, outputs: np.ndarray, data: TextDataset) -> np.ndarray | None:
        """Per-row values whose mean is the headline metric on labelled ``data`` (1.0/0.0 per row for
        accuracy), for paired intervals between two models on the same rows; None where the headline is
        not a mean over rows (macro-F1, entity F1) or ``data`` has no labels."""
        return None

    def report_headline(self, metrics: dict) -> str:
        """The headline a report of these metrics leads with: the task's, else (rows without labels) the
        first of its metrics present."""
        if self.headline in metrics:
            return self.headline
        return next((name for name in self.metrics if name in metrics), self.headline)

    def agreement(self, outputs: np.ndarray, reference: np.ndarray) -> np.ndarray:
        """Per-row agreement in [0, 1] of ``outputs`` with a float ``reference`` (INT8 format ladder)."""
        return row_cosine(outputs, reference)

    def budget_points(self, outputs: np.ndarray, reference: np.ndarray | None, data: TextDataset) -> tuple[str, float]:
        """(metric name, value in points 0-100) that the INT8 accuracy budget holds: the task metric
        where ``data`` is labelled, else agreement with the float graph's ``reference``."""
        if reference is None:
            return "agreement_with_float", 100.0
        return "agreement_with_float", 100.0 * float(np.mean(self.agreement(outputs, reference)))

    def budget_components(self, outputs: np.ndarray, reference: np.ndarray, data: TextDataset) -> dict:
        """The measures behind ``budget_points`` where it combines several (name -> float, value, drop,
        in points), recorded per budget candidate; {} where it is one metric."""
        return {}

    def skipped_without_baseline(self) -> str:
        """The metrics a bench run cannot compute without the artifact's reference outputs."""
        return "agreement_with_baseline"

    def __repr__(self) -> str:
        return f"<task {self.name}>"


# The arg-max agreement with the fp32 baseline most tasks report beside their own metric.
AGREEMENT = Metric("Agreement", percent=True, relative=True)


def argmax_budget_points(outputs: np.ndarray, reference: np.ndarray | None, labels) -> tuple[str, float]:
    """Budget points of an arg-max task (one class per row): accuracy where labelled, else agreement
    with the float graph's ``reference``."""
    if labels is not None:
        return "accuracy", 100.0 * float((np.asarray(outputs).argmax(-1) == np.asarray(labels)).mean())
    if reference is None:
        return "agreement_with_float", 100.0
    return "agreement_with_float", 100.0 * float(argmax_agreement(outputs, reference).mean())


def argmax_agreement(outputs: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """1.0 where the arg-max class agrees, per row (and per position for token-level outputs)."""
    return (np.asarray(outputs).argmax(-1) == np.asarray(reference).argmax(-1)).astype(np.float64)


def pad_rows(tokenizer, rows: list[dict]) -> dict[str, np.ndarray]:
    """Pad tokenized rows (dicts of 1-D id lists) to one int64 batch on the tokenizer's side. By hand:
    tokenizer.pad on a fast tokenizer warns that __call__ is faster, but these rows come from __call__ already."""
    width = max(len(r["input_ids"]) for r in rows)
    fill = {"input_ids": tokenizer.pad_token_id or 0, "token_type_ids": tokenizer.pad_token_type_id}
    out = {}
    for key in rows[0]:
        batch = np.full((len(rows), width), fill.get(key, 0), dtype=np.int64)
        for j, r in enumerate(rows):
            values = r[key]
            if tokenizer.padding_side == "right":
                batch[j, :len(values)] = values
            else:
                batch[j, width - len(values):] = values
        out[key] = batch
    return out
