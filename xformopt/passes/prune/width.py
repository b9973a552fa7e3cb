"""Width pruning of the hidden size (the residual stream), as NVIDIA's Minitron does: one channel mask,
chosen by activation on training rows, applied to every tensor that reads or writes the stream.

Importance: a channel's score is the mean |activation| over real tokens (padding masked out) of every
LayerNorm output on the stream (the embeddings' norm and each layer's two), summed over those norms
(Minitron's embedding-channel importance). The LayerNorms are found by width: every ``LayerNorm`` of
the base model whose size is the hidden size.

Surgery: the model is rebuilt from its config with the smaller hidden size, and each tensor of the old
model is sliced where the new model's shape is smaller: a dimension that shrinks from the hidden size
takes the kept channels, one that shrinks from the head count (MPNet's shared relative-position bias)
takes the kept heads. Nothing is matched by name, so the embeddings (word, position, token type), every
LayerNorm, every q/k/v/o and FFN projection, the pooler and the classifier head are cut alike; a
dimension that shrinks any other way fails loudly.

Why heads follow the width: BERT, RoBERTa, XLM-R, ELECTRA, CamemBERT, DistilBERT and MPNet in
transformers 5 compute the head size as ``hidden_size / num_attention_heads`` (there is no
``head_dim`` key, and their attention reshapes to ``(-1, hidden / heads)``). So a stock checkpoint of a
narrower stream keeps ``hidden / head_size`` heads of the teacher's head size: 768 -> 512 on BERT-base
(64-wide heads) keeps 8 of 12 heads per layer, chosen by importance before the cut. The hidden width is
therefore a multiple of the head size, and heads are not pruned apart from it (``heads_per_layer``
given with ``hidden_size`` must equal ``hidden_size / head_size``). The result has no
``config.pruned_heads``: ``AutoModel`` loads it as it loads the teacher.
"""

from __future__ import annotations

import copy

import numpy as np

from xformopt.errors import InputError, PassFailed
from xformopt.families import FAMILIES
from xformopt.models import pruned_heads
from xformopt.passes.prune.importance import Batches
from xformopt.passes.surgery import Arch


def head_count_key(model_type: str) -> str:
    """The config key holding the head count (``num_attention_heads``, DistilBERT's ``n_heads``)."""
    family = FAMILIES.get(model_type)
    return family.heads_keys[0] if family else "num_attention_heads"


def residual_norms(model, hidden: int) -> list:
    """Every LayerNorm of the base model whose width is the hidden size: the norms on the residual stream."""
    import torch

    return [m for m in model.base_model.modules()
            if isinstance(m, torch.nn.LayerNorm) and tuple(m.normalized_shape) == (hidden,)]


def channel_importance(model, arch: Arch, batches: Batches) -> np.ndarray:
    """Per hidden channel: mean |LayerNorm output| over real tokens, summed over the residual norms."""
    import torch

    hidden = arch.hidden(model.config)
    norms = residual_norms(model, hidden)
    if not norms:
        raise PassFailed(f"{model.config.model_type}: no LayerNorm of width {hidden} found on the residual stream")
    total = torch.zeros(hidden, dtype=torch.float64)
    state = {"mask": None, "tokens": 0}

    def hook(module, args, out):
        mask = state["mask"].unsqueeze(-1).to(out.dtype)
        total.add_((out.detach().abs() * mask).sum(dim=(0, 1)).double())

    handles = [m.register_forward_hook(hook) for m in norms]
    try:
        with torch.no_grad():
            for enc in batches.encoded:
                state["mask"] = enc.get("attention_mask", torch.ones_like(enc["input_ids"]))
                state["tokens"] += int(state["mask"].sum())
                model(**enc)
    finally:
        for h in handles:
            h.remove()
    return (total / max(state["tokens"], 1)).numpy()


def magnitude_channels(model, arch: Arch) -> np.ndarray:
    """Data-free: per hidden channel, the sum of |LayerNorm weight| over the residual norms."""
    import torch

    hidden = arch.hidden(model.config)
    with torch.no_grad():
        return sum(m.weight.detach().abs().double() for m in residual_norms(model, hidden)).numpy()


def kept_channels(scores: np.ndarray, width: int) -> list[int]:
    """The ``width`` highest-scoring channels (ties by index), in their original order."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return sorted(order[:width])


def check_heads(model, arch: Arch) -> int:
    """The one head count every layer must have before the cut (hidden / head size is the config's rule)."""
    counts = {arch.heads(layer) for layer in arch.layers(model)}
    if len(counts) != 1:
        raise PassFailed(f"width pruning needs the same head count in every layer; the plan left {sorted(counts)}")
    return counts.pop()


def shrink_hidden(model, arch: Arch, channels: list[int]):
    """A new model of the same class with ``len(channels)`` hidden channels: every tensor of ``model``
    sliced where the narrower config's model is smaller (module docstring). ``model``'s layers must all
    keep ``len(channels) / head_size`` heads already (the plan asked for that count)."""
    import torch

    hidden0, width = arch.hidden(model.config), len(channels)
    head_dim = arch.head_dim(arch.layers(model)[0])
    heads = check_heads(model, arch)
    if width % head_dim or width // head_dim != heads:
        raise PassFailed(f"hidden {width} needs {width / head_dim:g} heads of {head_dim}; the layers keep {heads}")
    config = copy.deepcopy(model.config)
    setattr(config, arch.layout.hidden_key, width)
    setattr(config, head_count_key(config.model_type), heads)
    pruned_heads.store(config, {})  # the heads left are the config's own count now: nothing to re-apply on load
    # (MPNet's relative-position bias, one column per head shared by every layer, was cut to the kept heads
    # by pruned_heads.prune_heads, which keeps the same heads in every layer: it has the new count already.)
    new = type(model)(config)
    index = torch.tensor(channels, dtype=torch.long)
    old_state = model.state_dict()
    lost = sorted(set(old_state) - set(new.state_dict()))
    if lost:  # e.g. ELECTRA drops embeddings_project when the new hidden size equals its embedding size
        raise PassFailed(f"width pruning to {width}: the narrower {config.model_type} would lose {', '.join(lost[:4])}"
                         f"{' ...' if len(lost) > 4 else ''}; choose another hidden size")
    state = {}
    for name, want in new.state_dict().items():
        tensor = old_state[name]
        for dim, (have, need) in enumerate(zip(tensor.shape, want.shape)):
            if have == need:
                continue
            if have != hidden0 or need != width:
                raise PassFailed(f"width pruning: {name} {list(tensor.shape)} -> {list(want.shape)}: dimension {dim} "
                                 f"shrinks {have} -> {need}, not the hidden size {hidden0} -> {width}")
            tensor = tensor.index_select(dim, index)
        state[name] = tensor.clone()
    new.load_state_dict(state, strict=True)
    return new.eval()


def check_width_target(hidden: int | None, heads: int | None, head_dim: int) -> None:
    """``heads_per_layer`` beside ``hidden_size`` must be hidden / head size (module docstring)."""
    if hidden is not None and heads is not None and heads * head_dim != hidden:
        raise InputError(f"hidden_size {hidden} keeps {hidden // head_dim} heads of {head_dim} (this family's head size "
                         f"is hidden_size / heads); heads_per_layer {heads} does not fit: drop it or give "
                         f"{hidden // head_dim}")
