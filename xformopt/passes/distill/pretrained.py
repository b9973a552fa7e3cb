"""A pretrained student (distill's ``student:`` option): a smaller model of any encoder family xformopt
distills (a local folder, or a source name such as ``minilm``, located by ``xformopt.sources``), given the
teacher's task head (a fresh one: the teacher's labels, ``from_pretrained(..., num_labels=...)``).

Tokenizers. A student that reads the teacher's token ids (the same vocabulary) learns as a pruned student
does: every loss term works. One that does not learns at the level of whole texts only: each text is
tokenized by each model with its own tokenizer, the teacher's logits (or embedding) of each text are the
target of the student's output on the same text (the teacher cache is keyed by the teacher, its own
tokenization of the texts and the objective, never by the student's ids), and nothing compares token
positions, so hidden-state, attention and relation terms are refused before any work.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from xformopt import models, sources
from xformopt.artifact import SENTENCE_TRANSFORMERS_FILES, WEIGHT_SUFFIXES, copy_side_files, is_run_output
from xformopt.errors import InputError
from xformopt.families import family_of
from xformopt.models import pruned_heads
from xformopt.models.quiet import load_quietly
from xformopt.passes.prune.flops import Shape, config_shape, encoder_flops
from xformopt.passes.surgery import arch_for

# the options of the loss terms that compare token positions (hidden states, attention maps, relations)
LAYER_TERMS = ("hidden_weight", "attention_weight", "relation_weight")
FLOPS_LENGTH = 32.0  # tokens: the length the FLOP shares are quoted at (as the shape search's)


@dataclass(frozen=True)
class PretrainedStudent:
    source: str  # what the option named (a folder or a source name)
    path: Path
    config: dict
    same_tokenizer: bool  # it reads the teacher's token ids

    @property
    def model_type(self) -> str:
        return self.config["model_type"]


def locate(source: str) -> Path:
    """The student's folder (``xformopt.sources.locate``: a folder, a packaged name, a hub id)."""
    try:
        return sources.locate(source)
    except InputError as exc:
        raise InputError(f"distill student {source}: {exc.message}") from None


def same_vocabulary(teacher: Path, student: Path, trust_remote_code: bool) -> bool:
    """Whether the student reads the teacher's token ids: one token -> id table."""
    return (models.load_tokenizer(teacher, trust_remote_code).get_vocab()
            == models.load_tokenizer(student, trust_remote_code).get_vocab())


def resolve(source: str, teacher: Path, task: str, options, trust_remote_code: bool = False) -> PretrainedStudent:
    """The student ``source`` names, checked against ``teacher`` for ``options`` (one line per refusal)."""
    path = locate(source)
    spec = models.describe(path, task, source=source, trust_remote_code=trust_remote_code)
    arch_for(spec.model_type)  # where its layers live (a family row xformopt prunes and distills), else one line
    teacher_cfg = json.loads((Path(teacher) / "config.json").read_text())
    config = json.loads((path / "config.json").read_text())
    same = same_vocabulary(teacher, path, trust_remote_code)
    asked = [k for k in LAYER_TERMS if getattr(options, k) > 0]
    if asked and not same:
        raise InputError(f"distill student {source} has another tokenizer than teacher {teacher}: distillation across "
                         f"tokenizers compares whole texts' outputs only (logits or embeddings); set "
                         f"{', '.join(asked)} to 0 or choose a student with the teacher's vocabulary")
    if options.relation_weight > 0 and spec.model_type != teacher_cfg.get("model_type"):
        raise InputError(f"relation_weight: the relation term reads one family's attention modules, and student {source} "
                         f"is {spec.model_type!r}, teacher {teacher} {teacher_cfg.get('model_type')!r}; set it to 0")
    if spec.task_def.torch_objective == "embedding":
        widths = family_of(teacher_cfg["model_type"]).shape(teacher_cfg)[2], spec.hidden_size
        if widths[0] != widths[1]:
            raise InputError(f"distill student {source} embeds in {widths[1]} dimensions and teacher {teacher} in "
                             f"{widths[0]}: embedding distillation compares the two vectors; choose a student of "
                             f"width {widths[0]}")
    return PretrainedStudent(source, path, config, same)


def load(student: PretrainedStudent, task_def, teacher_config: dict, trust_remote_code: bool, eager: bool):
    """The student with the teacher's head: ``task_def.auto_model`` from its weights, a fresh classifier of the
    teacher's labels (the student's own head, if any, is replaced: ``ignore_mismatched_sizes``)."""
    import transformers

    kwargs = {"attn_implementation": "eager"} if eager else {}
    if task_def.torch_objective == "logits":
        id2label = {int(k): v for k, v in (teacher_config.get("id2label") or {}).items()}
        if not id2label:  # a config.json of transformers' default two labels may leave them out
            id2label = {i: f"LABEL_{i}" for i in range(int(teacher_config.get("num_labels") or 2))}
        kwargs.update(num_labels=len(id2label), id2label=id2label, label2id={v: k for k, v in id2label.items()},
                      ignore_mismatched_sizes=True)
        if teacher_config.get("problem_type"):
            kwargs["problem_type"] = teacher_config["problem_type"]
    cls = getattr(transformers, task_def.auto_model)
    model = load_quietly(pruned_heads.from_pretrained, cls, student.path, trust_remote_code=trust_remote_code,
                         **kwargs)
    return model


def copy_files(student: PretrainedStudent, dst: Path, objective: str) -> None:
    """The student's tokenizer (what its stage is read with) beside its weights; for a classifier, without
    a sentence-transformers model's pooling modules (they describe an embedder, not this head)."""
    if objective == "embedding":
        copy_side_files(student.path, dst)
        return
    for item in student.path.iterdir():
        if item.is_file() and not (dst / item.name).exists() and not item.name.endswith(WEIGHT_SUFFIXES) \
                and not is_run_output(item.name) and item.name not in SENTENCE_TRANSFORMERS_FILES:
            shutil.copy2(item, dst / item.name)


def size_facts(student_shape: Shape, student_params: int, teacher_config: dict, teacher_params: int) -> dict:
    """The student's parameter count and encoder FLOPs (at 32 tokens, xformopt/passes/prune/flops.py) as shares
    of the teacher's; tokenizers that cut a text into more or fewer tokens are not counted in."""
    s_flops = encoder_flops(student_shape, FLOPS_LENGTH)["total"]
    t_flops = encoder_flops(config_shape(teacher_config), FLOPS_LENGTH)["total"]
    return {"params_share_of_teacher": round(student_params / max(teacher_params, 1), 4),
            "flops_at_32_tokens": round(s_flops), "flops_share_of_teacher": round(s_flops / max(t_flops, 1.0), 4)}
