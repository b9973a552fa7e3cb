"""Attention-head pruning and loading a head-pruned checkpoint.

transformers 5 removed head pruning (``PreTrainedModel.prune_heads``, the attention modules'
``pruned_heads`` sets, and ``from_pretrained`` re-applying ``config.pruned_heads``), so xformopt owns
it here, on the family's module paths (``xformopt.families.Layout``). The checkpoint format is the one
transformers 4 wrote and xformopt 0.1 saved: ``config.pruned_heads`` maps a layer index to the
*original* ids of its removed heads, and the tensors keep their names with fewer rows (q/k/v) and
columns (attention output). A checkpoint pruned on transformers 4.57 therefore loads the same way.

A head is ``head_dim`` consecutive rows of the query, key and value projections and the same columns
of the attention output projection; removing it removes exactly its contribution to the layer's
output (the attention forward reshapes with ``-1`` heads, so it reads no head count).
"""

from __future__ import annotations

import re
from pathlib import Path

from xformopt.errors import InputError
from xformopt.families import FAMILIES, Layout, layout_of
from xformopt.models import weight_coverage
from xformopt.models.quiet import load_quietly

# Attention-module attributes that cache the attention width (heads x head_dim): kept in step with the
# head count, as transformers 4's prune_heads did, for any code that reads them.
_WIDTH_ATTRS = ("all_head_size",)


def recorded(config) -> dict[int, list[int]]:
    """``config.pruned_heads`` as {layer: sorted original head ids} (JSON gives string keys; transformers 5
    configs lack the attribute when nothing was pruned)."""
    heads = getattr(config, "pruned_heads", None) or {}
    return {int(k): sorted(int(h) for h in v) for k, v in heads.items() if v}


def store(config, heads: dict[int, list[int]]) -> None:
    """Set ``config.pruned_heads`` (sorted original ids per layer); none pruned: no key at all, so a
    config.json without pruned heads reads as it did under transformers 4 (which left the empty default out)."""
    heads = {int(k): sorted(int(h) for h in v) for k, v in heads.items() if v}
    if heads:
        config.pruned_heads = heads
    elif hasattr(config, "pruned_heads"):
        delattr(config, "pruned_heads")


def _layout(model) -> Layout:
    layout = layout_of(model.config.model_type, "prune")
    if not layout.head_pruning:
        raise InputError(f"{model.config.model_type} attention heads cannot be pruned (its heads share one position "
                         "bias); prune FFN width or layers instead")
    return layout


def _attention(layer, layout: Layout):
    """The module holding the head count (the Layout's ``heads`` path without its last name)."""
    parent, _, _ = layout.heads.rpartition(".")
    return Layout.get(layer, parent) if parent else layer


def current_head_ids(model, layer_index: int) -> list[int]:
    """The original ids of the heads layer ``layer_index`` still has, in their current order."""
    layout = _layout(model)
    layer = Layout.get(model.base_model, layout.layers)[layer_index]
    gone = set(recorded(model.config).get(layer_index, []))
    count = Layout.get(layer, layout.heads)
    return [h for h in range(count + len(gone)) if h not in gone]


def prune_heads(model, heads: dict[int, list[int]]) -> None:
    """Remove ``heads`` ({layer index: original head ids}, as transformers 4's ``prune_heads`` took) and
    add them to ``config.pruned_heads``. Ids already removed are ignored; a layer keeps at least one head."""
    import torch
    from transformers.pytorch_utils import prune_linear_layer

    layout = _layout(model)
    layers = Layout.get(model.base_model, layout.layers)
    plan = {}  # checked for every layer before any is cut: nothing half-pruned on a refusal
    for index, ids in sorted((int(k), v) for k, v in heads.items()):
        present = current_head_ids(model, index)
        drop = set(int(h) for h in ids) & set(present)
        if len(drop) == len(present):
            raise InputError(f"layer {index}: pruning heads {sorted(drop)} would leave no attention head; keep at least one")
        if drop:
            plan[index] = (present, drop)
    done = recorded(model.config)
    if layout.shared_head_bias and plan:
        _cut_shared_bias(model, layout, layers, plan)
    for index, (present, drop) in plan.items():
        layer = layers[index]
        size = Layout.get(layer, layout.head_dim)
        weight = Layout.get(layer, layout.attn_out).weight
        keep = torch.tensor([p * size + d for p, h in enumerate(present) if h not in drop for d in range(size)],
                            dtype=torch.long, device=weight.device)
        for path, dim in ((layout.attn_query, 0), (layout.attn_key, 0), (layout.attn_value, 0), (layout.attn_out, 1)):
            old = Layout.get(layer, path)
            Layout.set(layer, path, prune_linear_layer(old, keep, dim=dim).to(dtype=old.weight.dtype))
        count = len(present) - len(drop)
        Layout.set(layer, layout.heads, count)
        attention = _attention(layer, layout)
        for attr in _WIDTH_ATTRS:
            if hasattr(attention, attr):
                setattr(attention, attr, count * size)
        done[index] = sorted(set(done.get(index, [])) | drop)
    store(model.config, done)


def _cut_shared_bias(model, layout: Layout, layers, plan: dict) -> None:
    """A family whose layers share one per-head bias (MPNet): the same heads must go from every layer,
    and the bias keeps the columns of the heads left. Refused (nothing cut) when the layers would differ."""
    import torch

    present = [current_head_ids(model, i) for i in range(len(layers))]
    after = [[h for h in ids if h not in plan.get(i, (None, set()))[1]] for i, ids in enumerate(present)]
    if any(ids != after[0] for ids in after) or any(ids != present[0] for ids in present):
        raise InputError(f"{model.config.model_type} shares one position bias across layers: prune the same heads in "
                         f"every layer (this would leave {sorted(set(map(tuple, after)))})")
    bias = Layout.get(model.base_model, layout.shared_head_bias)
    keep = torch.tensor([p for p, h in enumerate(present[0]) if h in set(after[0])], dtype=torch.long)
    cut = torch.nn.Embedding(bias.num_embeddings, len(keep), dtype=bias.weight.dtype, device=bias.weight.device)
    with torch.no_grad():
        cut.weight.copy_(bias.weight.index_select(1, keep.to(bias.weight.device)))
    Layout.set(model.base_model, layout.shared_head_bias, cut)
    parent = layout.shared_head_bias.rpartition(".")[0]
    owner = Layout.get(model.base_model, parent) if parent else model.base_model
    if hasattr(owner, "n_heads"):  # MPNetEncoder caches the head count it builds the bias with
        owner.n_heads = len(keep)


def from_pretrained(cls, path: Path, *, trust_remote_code: bool = False, **kwargs):
    """``cls.from_pretrained(path, **kwargs)`` (``cls`` a transformers model or auto class), but a
    checkpoint whose config.json records pruned heads is built and loaded by :func:`load_pruned`:
    transformers 5's from_pretrained would refuse its smaller tensors (or re-initialise them at random
    with ``ignore_mismatched_sizes``)."""
    import json

    from transformers import AutoConfig

    path = Path(path)
    try:
        raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raw = {}  # from_pretrained says what is wrong with the folder
    if not (isinstance(raw, dict) and raw.get("pruned_heads")):
        return load_quietly(cls.from_pretrained, path, trust_remote_code=trust_remote_code, **kwargs)
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    return load_pruned(cls, path, config, trust_remote_code=trust_remote_code, **kwargs)


def load_pruned(cls, path: Path, config, **kwargs):
    """A head-pruned checkpoint: the model built from ``config``, its recorded heads pruned, then the
    checkpoint's tensors loaded under from_pretrained's naming rules (xformopt.models.weight_coverage). Strict:
    a tensor the model lacks, or one the model needs that the checkpoint lacks (but tied copies and a
    task head from_pretrained would start afresh), is refused in one line."""
    import torch

    if config.model_type not in FAMILIES or FAMILIES[config.model_type].layout is None:
        raise InputError(f"{path}: config.json records pruned heads for {config.model_type!r}, whose heads xformopt "
                         "cannot prune; re-save the model without pruned_heads")
    heads = recorded(config)
    store(config, {})
    model = cls.from_config(config, **kwargs)
    prune_heads(model, heads)
    state = read_tensors(Path(path))
    names = weight_coverage.name_map(model, state)
    own = {names[k]: v for k, v in state.items() if k in names}
    expected = model.state_dict()
    ignored = getattr(model, "_keys_to_ignore_on_load_unexpected", None) or []  # from_pretrained skips these too
    unexpected = sorted(n for n in set(own) - set(expected) if not any(re.search(p, n) for p in ignored))
    own = {n: t for n, t in own.items() if n in expected}
    wrong = [f"{n} {list(t.shape)} (model {list(expected[n].shape)})" for n, t in own.items()
             if n in expected and t.shape != expected[n].shape]
    if unexpected or wrong:
        what = (f"tensors the pruned model does not have: {weight_coverage.shown(unexpected)}" if unexpected
                else f"tensors whose shape differs from the pruned model's: {weight_coverage.shown(wrong)}")
        raise InputError(f"{path} does not match its config.json (pruned_heads {heads}): {what}; "
                         "use the config saved with these weights")
    lacking = set(weight_coverage.missing(model, list(state)))
    # a task head from_pretrained would start afresh, as it does; whether the task allows one is
    # validate.check_complete's call, before any pass
    lacking -= weight_coverage.fresh_head(model, list(state), head_may_be_fresh=True)
    if lacking:
        raise InputError(f"{path} lacks {len(lacking)} tensor(s) the pruned model needs: "
                         f"{weight_coverage.shown(sorted(lacking))}; re-save the model with save_pretrained()")
    with torch.no_grad():
        model.load_state_dict(own, strict=False)  # strictness checked above, with from_pretrained's exceptions
    model.tie_weights()
    return model.eval()  # as from_pretrained returns it


def read_tensors(path: Path) -> dict:
    """Every tensor of a checkpoint folder: safetensors (single or sharded), else .bin through
    ``torch.load(weights_only=True)`` (single or sharded)."""
    import json

    import torch
    from safetensors.torch import load_file

    for index_name, reader in (("model.safetensors.index.json", load_file),
                               ("pytorch_model.bin.index.json",
                                lambda f: torch.load(f, map_location="cpu", weights_only=True))):
        index = path / index_name
        if index.is_file():
            state: dict = {}
            for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
                state.update(reader(str(path / shard)))
            return state
    if (path / "model.safetensors").is_file():
        return load_file(str(path / "model.safetensors"))
    if (path / "pytorch_model.bin").is_file():
        return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise InputError(f"{path} has no weights (model.safetensors or pytorch_model.bin); save the model with "
                     "save_pretrained()")
