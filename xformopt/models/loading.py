"""How a local model or artifact folder loads: its fast tokenizer (truncating at the model's position
limit) and its PyTorch model for the task."""

from __future__ import annotations

import json
from pathlib import Path

from xformopt.errors import InputError
from xformopt.models import pruned_heads
from xformopt.models.spec import ModelSpec, known_family


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
    """How many tokens the model can embed (its family's position key, less the positions the family
    reserves, e.g. RoBERTa's padding offset), or None when the config does not say."""
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    family = known_family(config)
    return family.positions(config) if family is not None else None


def load_torch_model(spec: ModelSpec, path: Path | None = None, **kwargs):
    """The PyTorch model for the task, in eval mode (offline, safetensors preferred); ``kwargs`` go to
    ``from_pretrained`` (e.g. ``attn_implementation``). A head-pruned checkpoint (config.pruned_heads)
    is built and loaded by xformopt.models.pruned_heads: transformers 5 no longer re-applies the pruning."""
    import transformers

    cls = getattr(transformers, spec.task_def.auto_model)
    model = pruned_heads.from_pretrained(cls, Path(path or spec.path), trust_remote_code=spec.trust_remote_code,
                                         **kwargs)
    return model.eval()
