"""Who teaches and who learns.

Teacher, in order of precedence:

1. the ``teacher`` option (``--teacher DIR``);
2. in a recipe, when an earlier pass produced the input (``src`` is not the model the run started
   from): the run's input model, i.e. the original, unpruned checkpoint;
3. a single command on an earlier command's output: the model named in that folder's
   ``manifest.json`` (``input.path``), checked against the content hash recorded there;
4. otherwise the input itself: distill is the first torch pass, and the student is cut from the
   teacher by dropping layers (``student_layers``, evenly spaced from the first to the last layer,
   or ``keep_layers``).

Layer origins (which teacher layer each student layer came from) decide the default layer map of the
hidden-state and attention losses: for a layer-dropped copy they are the kept layers; for a pruned
student they are read from the prune record next to it (``.entry.json`` in the pass cache, or the
``manifest.json`` of ``xformopt prune``); otherwise student layer i of n is matched to teacher
layer round((i + 1) * N / n) (1-based hidden-state indices, 0 = embeddings).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from xformopt.artifact import hash_dir
from xformopt.cache import read_entry
from xformopt.errors import InputError
from xformopt.families import FAMILIES
from xformopt.models import pruned_heads


@dataclass
class TeacherChoice:
    path: Path
    how: str
    student_from_teacher: bool  # the input is the teacher: the student is a layer-dropped copy


def _is_model_dir(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def _same(a: Path, b: Path) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def read_history(src: Path) -> tuple[dict, list[dict]]:
    """(input entry, pass entries) of the manifest beside a stage, or ({}, [])."""
    manifest = Path(src) / "manifest.json"
    if not manifest.is_file():
        return {}, []
    try:
        data = json.loads(manifest.read_text())
    except (OSError, json.JSONDecodeError):
        return {}, []
    return (data.get("input") or {}), list(data.get("passes") or [])


def resolve_teacher(src: Path, run_input: Path, teacher_option: str | None, check_hash: bool = True) -> TeacherChoice:
    if teacher_option:
        path = Path(teacher_option).expanduser()
        if not path.exists():
            raise InputError(f"teacher not found: {teacher_option}; pass --teacher with a Hugging Face model directory")
        if not _is_model_dir(path):
            raise InputError(f"teacher {teacher_option} is not a Hugging Face model directory (no config.json); "
                             "pass the directory the teacher was saved to with save_pretrained()")
        return TeacherChoice(path.resolve(), "teacher option", _same(path, src))
    if not _same(src, run_input):
        return TeacherChoice(Path(run_input).resolve(), "the run's input model (recipe chain)", False)
    entry, passes = read_history(src)
    if passes:
        named = entry.get("path")
        if not named or not _is_model_dir(Path(named)):
            raise InputError(f"teacher not found: {src}/manifest.json names {named!r} as the original model, which is "
                             "not a model directory here; pass --teacher DIR")
        if check_hash and entry.get("sha256"):
            if hash_dir(Path(named)) != entry["sha256"]:
                raise InputError(f"teacher {named} (named in {src}/manifest.json) has changed since {src} was made "
                                 "(content hash differs); pass --teacher DIR to use it anyway")
        return TeacherChoice(Path(named).resolve(), f"named in {Path(src) / 'manifest.json'}", False)
    return TeacherChoice(Path(src).resolve(), "the input model (student cut from it by dropping layers)", True)


def evenly_spaced(n: int, k: int) -> list[int]:
    """k of n layer indices, evenly spaced from the first to the last (0-based)."""
    if not 1 <= k <= n:
        raise InputError(f"student_layers {k} must be between 1 and the model's {n} layers")
    if k == 1:
        return [n - 1]
    import numpy as np

    return sorted({int(v) for v in np.rint(np.linspace(0, n - 1, k))})


def choose_layers(n: int, student_layers: int | None, keep_layers: list[int] | None, default_half: bool) -> list[int] | None:
    """The layers to keep (0-based), or None to keep all."""
    if keep_layers is not None:
        bad = [i for i in keep_layers if not 0 <= i < n]
        if bad or len(set(keep_layers)) != len(keep_layers):
            raise InputError(f"keep_layers {keep_layers}: give distinct layer indices from 0 to {n - 1}")
        return sorted(keep_layers)
    if student_layers is not None:
        if student_layers > n:
            raise InputError(f"student_layers {student_layers} is more than the model's {n} layers")
        return None if student_layers == n else evenly_spaced(n, student_layers)
    return evenly_spaced(n, max(1, (n + 1) // 2)) if default_half and n > 1 else None


def drop_layers(model, arch, keep: list[int]) -> None:
    """Keep only the encoder layers ``keep`` (in order), re-keying config.pruned_heads to the new numbering."""
    layers = list(arch.layers(model))
    old = pruned_heads.recorded(model.config)
    arch.set_layers(model, [layers[i] for i in keep])
    pruned_heads.store(model.config, {new: old.get(i) for new, i in enumerate(keep)})


def prune_origins(src: Path) -> list[int] | None:
    """Original layer indices a pruned stage kept, from the prune record beside it."""
    candidates = []
    entry = read_entry(Path(src))  # a pass-cache entry: its .entry.json holds the pass record
    if entry is not None and isinstance(entry.get("record"), dict):
        candidates.append(entry["record"])
    _, passes = read_history(src)
    candidates += [p.get("record") or {} for p in reversed(passes)]
    for rec in candidates:
        if "kept_layers" in rec:
            return [int(i) for i in rec["kept_layers"]]
        if "student" in rec and "origins" in (rec["student"] or {}):  # an earlier distill
            return [int(i) for i in rec["student"]["origins"]]
    return None


def default_layer_map(origins: list[int] | None, student_layers: int, teacher_layers: int) -> list[int]:
    """Teacher hidden-state index (1-based: output of that layer) for each student layer."""
    if origins is not None and len(origins) == student_layers and all(0 <= o < teacher_layers for o in origins):
        return [o + 1 for o in origins]
    return [max(1, round((i + 1) * teacher_layers / student_layers)) for i in range(student_layers)]


def check_teacher_head(objective: str, teacher_cfg: dict, teacher: Path) -> None:
    """A classifier student learns from a classifier teacher's logits."""
    archs = teacher_cfg.get("architectures") or []
    if objective == "logits" and not any(a.endswith("ForSequenceClassification") for a in archs):
        raise InputError(f"teacher {teacher} has no sequence-classification head (architectures {archs}); "
                         "a classifier student needs a classifier teacher")


def check_compatible(objective: str, teacher_cfg: dict, student_cfg: dict, teacher_tok, student_tok,
                     teacher: Path, student: Path, need_same_hidden: bool) -> None:
    """Both models must read the same token ids and produce comparable outputs."""
    tv, sv = teacher_cfg.get("vocab_size"), student_cfg.get("vocab_size")
    if tv != sv or (teacher_tok is not None and teacher_tok.get_vocab() != student_tok.get_vocab()):
        tn = len(teacher_tok.get_vocab()) if teacher_tok is not None else tv
        raise InputError(f"teacher {teacher} and student {student} have different vocabularies ({tn} vs "
                         f"{len(student_tok.get_vocab())} tokens); distillation feeds both the same token ids: use a "
                         "teacher with the student's tokenizer")
    check_teacher_head(objective, teacher_cfg, teacher)
    if objective == "logits":
        tl = {str(k): int(v) for k, v in (teacher_cfg.get("label2id") or {}).items()}
        sl = {str(k): int(v) for k, v in (student_cfg.get("label2id") or {}).items()}
        if len(teacher_cfg.get("id2label") or tl) != len(student_cfg.get("id2label") or sl) or (tl and sl and tl != sl):
            raise InputError(f"teacher {teacher} and student {student} have different labels ({tl} vs {sl}); "
                             "distill between models of the same label set")
    th, sh = (FAMILIES[cfg["model_type"]].shape(cfg)[2] for cfg in (teacher_cfg, student_cfg))
    if (need_same_hidden or objective == "embedding") and th != sh:
        what = "embedding" if objective == "embedding" else "hidden-state/attention transfer"
        raise InputError(f"{what} needs the teacher and the student to have the same hidden size "
                         f"({th} vs {sh}); set hidden_weight and attention_weight to 0 or use a matching teacher")
