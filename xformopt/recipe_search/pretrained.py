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

FLOPS_LENGTH = 32.0


@dataclass(frozen=True)
class PretrainedChoice:
    source: str  # what the recipe named
    path: Path
    config: dict

    @property
    def shape(self) -> Shape:
        return config_shape(self.config)


def flops(shape: Shape) -> float:
    return encoder_flops(shape, FLOPS_LENGTH)["total"]


def locate_students(tries: list, config: dict) -> tuple[list, list[dict]]:
    """``tries`` (shape_search candidates) with each pretrained student located (``candidate.student``), less the
    students skipped; and the record's entries for those (status skipped, why)."""
    kept, skipped = [], []
    teacher = flops(config_shape(config))
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
            share = flops(choice.shape) / teacher
            if share < 1:
                candidate.student = choice
                kept.append(candidate)
                continue
            why = (f"not smaller than the model ({share:.0%} of its encoder FLOPs at 32 tokens): it would not be "
                   "faster")
        _log.info(f"shape search: pretrained student {name}: skipped ({why})")
        skipped.append({"shape": candidate.shape, "student_kind": "pretrained", "status": "skipped", "why": why})
    return kept, skipped
