"""The task registry: one module per task, each exporting ``TASK`` (a :class:`~xformopt.tasks.base.Task`).

A new task is one module here plus its tests; passes, evaluation, bench and report ask the task object
and never test a task's name. ``get`` resolves a name (or None: detected from the config).
"""

from __future__ import annotations

from xformopt.errors import InputError
from xformopt.tasks import (
    classification,
    embeddings,
    fill_mask,
    generation,
    multiple_choice,
    question_answering,
    ranking,
    summarization,
    token_classification,
    translation,
)
from xformopt.tasks.base import Metric, Task

_MODULES = (classification, ranking, embeddings, generation, token_classification, question_answering, fill_mask,
            multiple_choice, translation, summarization)  # encoder-decoder tasks last: detect() tries encoder heads first

TASKS: dict[str, Task] = {m.TASK.name: m.TASK for m in _MODULES}


def metric_info() -> dict[str, Metric]:
    """Every metric any task reports, in task order (headline first): labels, scale, direction."""
    merged: dict[str, Metric] = {}
    for task in TASKS.values():
        for name, metric in task.metrics.items():
            merged.setdefault(name, metric)
    return merged


def headlines() -> set[str]:
    return {task.headline for task in TASKS.values()}


def names(decoder: bool | None = None) -> tuple[str, ...]:
    return tuple(n for n, t in TASKS.items() if decoder is None or t.decoder == decoder)


def get(name: str) -> Task:
    task = TASKS.get(name)
    if task is None:
        raise InputError(f"unknown task {name!r}; choose one of: {', '.join(TASKS)}")
    return task


def served() -> tuple[str, ...]:
    """Tasks whose artifacts ``xformopt.load`` answers through a head (and ``xformopt serve`` exposes)."""
    return tuple(name for name, task in TASKS.items() if task.head is not None)


def detect(config: dict, decoder: bool, sentence_transformers: bool = False) -> Task:
    """The task a checkpoint's head was trained for (config.architectures), else its family's default:
    embeddings for encoders, generation for decoders. ``sentence_transformers``: the folder is a
    sentence-transformers model (modules.json), an embedder even where config.architectures still
    names its pretraining head (all-mpnet-base-v2 says MPNetForMaskedLM; its weights have no LM head)."""
    for task in TASKS.values():
        if task.decoder == decoder and task.claims(config):
            if sentence_transformers and task is fill_mask.TASK:
                break
            return task
    return TASKS["text-generation"] if decoder else TASKS["feature-extraction"]
