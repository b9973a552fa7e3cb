"""Pretrained students in a shape search (``- student: minilm`` beside the pruned shapes): each is located
(``xformopt.sources``), sized against the model by its encoder FLOPs, and skipped, with the reason logged and
recorded, when it cannot be found or is not smaller than the model (it would not be faster: the teacher is
already that size). The rest are ordered and tried like any shape; their trial drops the prune step and distills
the student from the model (distill's ``student`` option, xformopt/passes/distill/pretrained.py)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from xformopt.errors import InputError
from xformopt.passes.distill import pretrained as P
from xformopt.passes.prune.flops import Shape, config_shape, encoder_flops

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PretrainedChoice:
    source: str  # what the recipe named
    path: Path
    config: dict

    @property
    def shape(self) -> Shape:
        return config_shape(self.config)


def flops(shape: Shape) -> float:
    return encoder_flops(shape, P.FLOPS_LENGTH)["total"]


def skipped_because(choice: PretrainedChoice, config: dict, embedding: bool) -> str | None:
    """Why a located student is not worth trying on the model of ``config`` (None: it is)."""
    share = flops(choice.shape) / flops(config_shape(config))
    width = config_shape(config).hidden
    if embedding and choice.shape.hidden != width:
        return f"embeds in {choice.shape.hidden} dimensions, the model in {width}: embedding distillation compares the two"
    if share >= 1:
        return f"not smaller than the model ({share:.0%} of its encoder FLOPs at 32 tokens): it would not be faster"
    return None


def locate_students(tries: list, config: dict, embedding: bool = False) -> tuple[list, list[dict]]:
    """``tries`` (shape_search candidates) with each pretrained student located (``candidate.student``), less the
    students skipped; and the record's entries for those (status skipped, why). ``embedding``: the model is an
    embedder, whose student must embed in its width (distill compares the two vectors)."""
    kept, skipped = [], []
    for candidate in tries:
        name = candidate.shape.get("student")
        if not name:
            kept.append(candidate)
            continue
        try:
            path = P.locate(name)
            choice = PretrainedChoice(name, path, json.loads((path / "config.json").read_text()))
        except InputError as exc:
            why = f"not available here: {exc.message}"
        else:
            why = skipped_because(choice, config, embedding)
            if why is None:
                candidate.student = choice
                kept.append(candidate)
                continue
        _log.info(f"shape search: pretrained student {name}: skipped ({why})")
        skipped.append({"shape": candidate.shape, "student_kind": "pretrained", "status": "skipped", "why": why})
    return kept, skipped
