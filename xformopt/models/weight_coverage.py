"""Which tensors a model needs that a checkpoint lacks, decided from the tensor names alone (the
safetensors headers or a shard index) before anything is loaded.

transformers' from_pretrained initialises every missing tensor at random and only warns, so a shard
index that lists some tensors, or a truncated conversion, gives a model that runs and predicts noise.
The rules below are the ones from_pretrained applies to compute its ``missing_keys``
(``output_loading_info=True``; tests/models/test_models.py compares the two): the base-model prefix added or
removed, legacy names renamed, tied weights counted once, and the class's own ignore patterns.
transformers has no public call that answers this without loading the weights, hence written here; for
transformers 5's weight conversions (renamed or fused checkpoint tensors) its own renaming functions are used.
"""

from __future__ import annotations

import re

# A base-model module that belongs with the task head: a token-classification or question-answering
# checkpoint is saved without BERT's pooler, and a classifier built on it starts both afresh; feature
# extraction never reads the pooler's output.
HEAD_PARTS_OF_THE_BASE = ("pooler",)


def _rename(model, name: str) -> str:
    fix = getattr(model, "_fix_state_dict_key_on_load", None)  # LayerNorm.gamma -> .weight, ...
    return fix(name)[0] if fix is not None else name


def name_map(model, checkpoint_names) -> dict[str, str]:
    """Checkpoint tensor name -> the model's own name, as from_pretrained maps them (a task checkpoint's
    head tensors are left out under the base model)."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    names = {n: _rename(model, n) for n in checkpoint_names}
    has_prefix = bool(prefix) and any(n.startswith(prefix) for n in names.values())
    expects_prefix = bool(prefix) and hasattr(model, prefix)
    if expects_prefix and not has_prefix:  # a base checkpoint under a task model
        return {k: f"{prefix}.{n}" for k, n in names.items()}
    if has_prefix and not expects_prefix:  # a task checkpoint under the base model: its head is dropped
        return {k: n[len(prefix) + 1:] for k, n in names.items() if n.startswith(f"{prefix}.")}
    return names


def loaded_names(model, checkpoint_names) -> set[str]:
    """The model's own names of the checkpoint's tensors, as from_pretrained maps them."""
    converted = _converted_names(model, checkpoint_names)
    if converted is not None:
        return converted
    return set(name_map(model, checkpoint_names).values())


def _converted_names(model, checkpoint_names) -> set[str] | None:
    """The names transformers 5's own weight conversions give the checkpoint's tensors (renamed modules,
    a fused ``qkv_proj`` split into q, k and v, the base-model prefix added or dropped), with its own
    functions; None where this transformers has none (4.x) or the model registers no conversion."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, rename_source_key
    except ImportError:
        return None
    transforms = get_model_conversion_mapping(model)
    if not transforms:
        return None
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    renamings = [t for t in transforms if not isinstance(t, WeightConverter)]
    meta = model.state_dict()
    prefix = getattr(model, "base_model_prefix", None) or None
    names = set()
    for name in checkpoint_names:
        key, source = rename_source_key(_rename(model, name), renamings, converters, prefix, meta)
        names.add(key)
        converter = next((c for c in converters if source is not None and source in c.source_patterns), None)
        if converter is not None and converter.target_patterns[0] in key:  # one source fills every target
            names.update(key.replace(converter.target_patterns[0], target) for target in converter.target_patterns)
    return names


def _tied_groups(model) -> list[set[str]]:
    by_tensor: dict[int, set[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_tensor.setdefault(id(param), set()).add(name)
    return [group for group in by_tensor.values() if len(group) > 1]


def missing(model, checkpoint_names) -> list[str]:
    """The tensors MODEL (built from its config, e.g. on the meta device) needs that CHECKPOINT_NAMES
    lack: what from_pretrained would report as missing_keys and initialise at random."""
    present = loaded_names(model, checkpoint_names)
    lacking = set(model.state_dict()) - present
    for group in _tied_groups(model):  # one loaded member of a tied group fills them all
        if group & present:
            lacking -= group
    patterns = getattr(model, "_keys_to_ignore_on_load_missing", None) or []
    if patterns:
        ignored = re.compile("|".join(f"({p})" for p in patterns))
        lacking = {n for n in lacking if not ignored.search(n)}
    return sorted(lacking)


def fresh_head(model, checkpoint_names, *, head_may_be_fresh: bool) -> set[str]:
    """The model's tensors that form a freshly initialised task head, as intended: every tensor of a
    top-level module outside the base model when none of them is in the checkpoint (a classifier on
    a base checkpoint, or in place of another task's head), and a pooler absent altogether
    (HEAD_PARTS_OF_THE_BASE) when the model has no head or its whole head is fresh too.
    HEAD_MAY_BE_FRESH is the task's say (a language-model head only pretraining trains: it is not)."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    present = loaded_names(model, checkpoint_names)
    expected = list(model.state_dict())
    has_base = bool(prefix) and hasattr(model, prefix)
    head_modules = {n.split(".")[0] for n in expected if has_base and not n.startswith(f"{prefix}.")}

    def absent(module: str) -> bool:  # none of the module's own tensors loads (another head's may be there)
        return not any(n in present for n in expected if n.startswith(f"{module}."))

    fresh_modules = {m for m in head_modules if head_may_be_fresh and absent(m)}
    whole_head_fresh = head_modules == fresh_modules  # also true for the base model (no head at all)
    base = f"{prefix}." if has_base else ""
    if whole_head_fresh:
        fresh_modules |= {f"{base}{part}" for part in HEAD_PARTS_OF_THE_BASE if absent(f"{base}{part}")}
    return {n for n in expected if any(n.startswith(f"{m}.") for m in fresh_modules)}


def shown(names: list[str], first: int = 3) -> str:
    """A few names, then how many more: one line however many are missing."""
    more = f", and {len(names) - first} more" if len(names) > first else ""
    return ", ".join(names[:first]) + more
