"""What a model is: its spec (family, task, shape, labels) read from a local folder's config.json,
checked to be a text model xformopt can export. Where the folder comes from is xformopt/sources/."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from xformopt import tasks
from xformopt.errors import InputError
from xformopt.families import Family, custom_code_family, family_of, refuse_unexportable_cache
from xformopt.models.validate import check_config, read_config
from xformopt.tasks.base import Task


@dataclass(frozen=True)
class ModelSpec:
    """A resolved model: where its files are and what the passes need to know about it."""

    source: str  # what the user typed
    path: Path
    model_type: str
    task: str
    num_layers: int
    num_heads: int
    hidden_size: int
    label2id: dict[str, int] = field(default_factory=dict)
    trust_remote_code: bool = False
    pruned: bool = False  # config.pruned_heads is set: attention widths differ from num_heads x head_dim

    @property
    def family(self) -> Family:
        return family_of(self.model_type)

    @property
    def task_def(self) -> Task:
        """The task object (xformopt.tasks): what passes, evaluation and reports ask instead of the name."""
        return tasks.get(self.task)

    @property
    def ort_model_type(self) -> str:
        return self.family.ort_model_type

    @property
    def id2label(self) -> dict[int, str]:
        return {i: name for name, i in self.label2id.items()}


def artifact_task(path: str | Path) -> Task | None:
    """The task of a model or artifact folder, read from its files without loading anything: the task
    its manifest's run started with, else the one its config.json detects. None where the folder names
    no family xformopt knows (the caller's own checks then say what is wrong)."""
    path = Path(path)
    try:
        config = json.loads((path / "config.json").read_text())
        manifest = json.loads((path / "manifest.json").read_text()) if (path / "manifest.json").is_file() else {}
    except (OSError, ValueError):
        return None
    family = known_family(config)
    if family is None:
        return None
    named = ((manifest.get("input") or {}) if isinstance(manifest, dict) else {}).get("task")
    task = tasks.TASKS.get(named) if isinstance(named, str) else None
    if task is None or task.graph != family.graph:
        task = tasks.detect(config, family.decoder, sentence_transformers=(path / "modules.json").is_file())
    return task


def known_family(config) -> Family | None:
    """The family of a config dict, or None where its model type is missing or unknown."""
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(model_type, str):
        return None
    try:
        return family_of(model_type)
    except InputError:
        return None


# Config keys of a model that reads more than text: its encoder for images or sound is no text model.
_NON_TEXT_CONFIGS = ("vision_config", "audio_config", "vision_encoder", "audio_encoder")
_NON_TEXT_INPUTS = ("pixel_values", "input_values", "input_features")


def check_text_model(config: dict, model: str, trust_remote_code: bool) -> None:
    """Refuse, in one line and before any work, what the exporter cannot take: custom modelling code the
    user did not trust, and models whose input is an image or sound (their text model may still go)."""
    model_type = config.get("model_type")
    if "auto_map" in config and not trust_remote_code:
        if not _known_to_transformers(model_type):
            raise InputError(f"{model} runs its own modelling code (auto_map in config.json, model type "
                             f"{model_type!r} unknown to transformers); pass --trust-remote-code if you trust it")
    non_text = [key for key in _NON_TEXT_CONFIGS if isinstance(config.get(key), dict)]
    main_input = _main_input(model_type)
    if non_text or main_input in _NON_TEXT_INPUTS:
        what = ", ".join(non_text) if non_text else f"input {main_input}"
        raise InputError(f"{model} ({model_type}) is not a text-only model ({what}); xformopt exports text models: "
                         "pass its text model (e.g. a checkpoint whose model_type ends in _text)")


def _known_to_transformers(model_type) -> bool:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return model_type in CONFIG_MAPPING_NAMES


def _main_input(model_type) -> str | None:
    """The main input of transformers' base class for ``model_type`` (``input_ids`` for text models)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    name = MODEL_MAPPING_NAMES.get(model_type) if isinstance(model_type, str) else None
    cls = getattr(transformers, name, None) if isinstance(name, str) else None
    return getattr(cls, "main_input_name", None)


def describe(path: Path, task: str | None = None, *, source: str | None = None,
             trust_remote_code: bool = False) -> ModelSpec:
    """The ModelSpec of a local model or artifact folder (config.json; no download, no GGUF, no hub),
    checking the architecture and task are supported. ``source``: what the user typed, for messages."""
    path = Path(path)
    model = source if source is not None else str(path)
    if not (path / "config.json").is_file():
        raise InputError(f"{model} is not a Hugging Face model directory (no config.json); pass a directory saved "
                         "with save_pretrained() or an xformopt artifact")
    config = read_config(path)
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise InputError(f"{path / 'config.json'}: model_type is missing or not a string; "
                         "re-save the config with save_pretrained()")
    check_text_model(config, model, trust_remote_code)
    if trust_remote_code and isinstance(config.get("auto_map"), dict) and not _known_to_transformers(model_type):
        custom_code_family(model_type, config["auto_map"])  # its row, before family_of is asked
    family = family_of(model_type)
    if family.decoder:
        refuse_unexportable_cache(config)  # state beyond a key/value cache: one line, before any work
    check_config(config, path / "config.json", family)  # the keys below, with sane types
    chosen = tasks.get(task) if task is not None else tasks.detect(
        config, family.decoder, sentence_transformers=(path / "modules.json").is_file())
    if chosen.graph != family.graph:
        kind = {"decoder": "a decoder", "seq2seq": "an encoder-decoder"}.get(family.graph, "an encoder")
        fits = [name for name, t in tasks.TASKS.items() if t.graph == family.graph]
        raise InputError(f"{model} is {kind} ({model_type}); task {chosen.name!r} needs another kind of model; "
                         f"tasks for this one: {', '.join(fits)}")
    layers, heads, hidden = family.shape(config)
    label2id = {str(k): int(v) for k, v in (config.get("label2id") or {}).items()}
    if chosen.labels_from_config and not label2id:
        id2label = config.get("id2label") or {}
        label2id = {str(v): int(k) for k, v in id2label.items()}
    return ModelSpec(
        source=model,
        path=path,
        model_type=model_type,
        task=chosen.name,
        num_layers=layers,
        num_heads=heads,
        hidden_size=hidden,
        label2id=label2id,
        trust_remote_code=trust_remote_code,
        pruned=bool(config.get("pruned_heads")),
    )


def stage_spec(spec: ModelSpec, path: Path) -> ModelSpec:
    """``spec`` with the shape of the stage in ``path`` (a pruned or distilled stage has its own layer,
    head and width counts, a pretrained student its own family; an ONNX stage carries its config.json):
    what later passes work on."""
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return spec
    if not isinstance(config, dict):
        return spec
    # a pretrained student of another family (distill's student option): the stage is that family's model,
    # with the run's task and labels
    family = spec.family if config.get("model_type") == spec.model_type else known_family(config)
    if family is None:
        return spec
    layers, heads, hidden = family.shape(config)
    return dataclasses.replace(spec, model_type=config["model_type"], num_layers=layers, num_heads=heads,
                               hidden_size=hidden, pruned=bool(config.get("pruned_heads")))
