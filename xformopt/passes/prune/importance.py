"""What removing a unit costs, measured on the importance sample: 0/1 masks on heads and FFN
neurons, the per-row loss, Taylor / layer-drop / magnitude importance, and each plan's sample loss.
The method is explained in ``xformopt.passes.prune.run``'s docstring."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from xformopt import progress
from xformopt.passes.prune.plans import Plan
from xformopt.passes.surgery import Arch
from xformopt.scoring.pooling import mean_pool


class Masks:
    """0/1 masks on every head and FFN neuron (forward pre-hooks), and optional skipped layers.

    Masking a unit is numerically the same as removing it, so candidate plans are scored on the
    unpruned model, and |d loss / d mask| is the Taylor importance of the unit.
    """

    def __init__(self, model, arch: Arch, requires_grad: bool = False):
        import torch

        self.model, self.arch = model, arch
        self.layers = list(arch.layers(model))
        self.head = [torch.ones(arch.heads(l), requires_grad=requires_grad) for l in self.layers]
        self.ffn = [torch.ones(arch.ffn_in(l).out_features, requires_grad=requires_grad) for l in self.layers]
        self.hooks = []
        for i, layer in enumerate(self.layers):
            dh = arch.head_dim(layer)
            self.hooks.append(arch.attn_out(layer).register_forward_pre_hook(
                lambda mod, args, i=i, dh=dh: (args[0] * self.head[i].repeat_interleave(dh),)))
            self.hooks.append(arch.ffn_out(layer).register_forward_pre_hook(
                lambda mod, args, i=i: (args[0] * self.ffn[i],)))

    def skip(self, dropped: Sequence[int]) -> None:
        self.arch.set_layers(self.model, [l for i, l in enumerate(self.layers) if i not in set(dropped)])

    def close(self) -> None:
        for h in self.hooks:
            h.remove()
        self.arch.set_layers(self.model, self.layers)



@dataclass
class Batches:
    encoded: list[dict]  # torch tensors
    labels: list | None



def make_batches(tokenizer, texts, pairs, labels, batch_size: int, max_length: int, accepts: set[str]) -> Batches:
    import torch

    out, ys = [], []
    for s in range(0, len(texts), batch_size):
        enc = tokenizer(list(texts[s:s + batch_size]), list(pairs[s:s + batch_size]) if pairs else None,
                        padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        out.append({k: v for k, v in enc.items() if k in accepts})
        if labels is not None:
            ys.append(torch.tensor(labels[s:s + batch_size]))
    return Batches(out, ys if labels is not None else None)



def pooled(model, enc, objective: str):
    out = model(**enc)[0]
    return out if objective == "logits" else mean_pool(out, enc["attention_mask"])



def row_losses(model, batches: Batches, objective: str, reference: list | None) -> np.ndarray:
    """Per-row loss: cross-entropy (classification) or MSE to the unpruned embeddings (feature extraction)."""
    import torch

    rows = []
    with torch.no_grad():
        for b, enc in enumerate(batches.encoded):
            progress.report("prune: importance (batches)", b + 1, len(batches.encoded))
            out = pooled(model, enc, objective)
            if objective == "logits":
                loss = torch.nn.functional.cross_entropy(out, batches.labels[b], reduction="none")
            else:
                loss = ((out - reference[b]) ** 2).mean(-1)
            rows.append(loss.double().numpy())
    return np.concatenate(rows) if rows else np.zeros(0)



def sample_loss(model, batches: Batches, objective: str, reference: list | None) -> float:
    """Classification: mean cross-entropy; feature extraction: mean MSE to the unpruned embeddings."""
    rows = row_losses(model, batches, objective, reference)
    return float(rows.mean()) if len(rows) else 0.0



def reference_embeddings(model, batches: Batches, objective: str):
    import torch

    if objective == "logits":
        return None
    with torch.no_grad():
        return [pooled(model, enc, objective) for enc in batches.encoded]



def taylor_importance(model, arch: Arch, batches: Batches, objective: str, seed: int) -> tuple[list, list]:
    """Accumulated |dL/dmask| per head and per FFN neuron (classification), or the probe-squared
    gradient of the embedding (feature extraction); see the module docstring."""
    import torch

    masks = Masks(model, arch, requires_grad=True)
    head = [torch.zeros_like(m) for m in masks.head]
    ffn = [torch.zeros_like(m) for m in masks.ffn]
    gen = torch.Generator().manual_seed(seed)
    try:
        for b, enc in enumerate(batches.encoded):
            out = pooled(model, enc, objective)
            if objective == "logits":
                loss = torch.nn.functional.cross_entropy(out, batches.labels[b], reduction="sum")
            else:
                probe = torch.randn(out.shape, generator=gen)
                loss = (out * probe).sum()
            grads = torch.autograd.grad(loss, masks.head + masks.ffn)
            for i, g in enumerate(grads[: len(head)]):
                head[i] += g.abs() if objective == "logits" else g ** 2
            for i, g in enumerate(grads[len(head):]):
                ffn[i] += g.abs() if objective == "logits" else g ** 2
    finally:
        masks.close()
    return [h.numpy().astype(np.float64) for h in head], [f.numpy().astype(np.float64) for f in ffn]



def layer_sensitivity(model, arch: Arch, batches: Batches, objective: str, reference) -> list[float]:
    """Loss increase on the sample when each layer alone is skipped (measured, not estimated)."""
    masks = Masks(model, arch)
    try:
        base = sample_loss(model, batches, objective, reference)
        out = []
        for i in range(len(masks.layers)):
            masks.skip([i])
            out.append(sample_loss(model, batches, objective, reference) - base)
            masks.skip([])
    finally:
        masks.close()
    return out



def magnitude_importance(model, arch: Arch) -> tuple[list, list, list]:
    """Data-free: weight norms. Head: |W_v rows| x |W_o columns| of the head; neuron: |W_in row| x
    |W_out column|; layer: norm of the output projections that write into the residual stream."""
    import torch

    heads, ffns, layers = [], [], []
    with torch.no_grad():
        for layer in arch.layers(model):
            dh, h = arch.head_dim(layer), arch.heads(layer)
            wv = arch.attn_value(layer).weight.view(h, dh, -1)
            wo = arch.attn_out(layer).weight.view(-1, h, dh)
            heads.append((wv.norm(dim=(1, 2)) * wo.norm(dim=(0, 2))).numpy().astype(np.float64))
            wi, wo2 = arch.ffn_in(layer).weight, arch.ffn_out(layer).weight
            ffns.append((wi.norm(dim=1) * wo2.norm(dim=0)).numpy().astype(np.float64))
            layers.append(float(arch.attn_out(layer).weight.norm() + wo2.norm()))
    return heads, ffns, layers



def quality(model, batches: Batches, objective: str, reference) -> dict:
    """Classification: accuracy; feature extraction: mean cosine to the unpruned embeddings."""
    import torch

    with torch.no_grad():
        outs = [pooled(model, enc, objective) for enc in batches.encoded]
    if objective == "logits":
        pred = torch.cat(outs).argmax(-1)
        gold = torch.cat(batches.labels)
        return {"accuracy": float((pred == gold).float().mean()), "n": len(gold)}
    cos = torch.cat([torch.nn.functional.cosine_similarity(o, r, dim=-1) for o, r in zip(outs, reference)])
    return {"cosine_to_unpruned": float(cos.mean()), "min_cosine": float(cos.min()), "n": len(cos)}



def score_plans(model, arch: Arch, plans: list[Plan], batches: Batches, objective: str, reference, ctx) -> float:
    """Set each plan's ``sample_loss`` (its units masked and its dropped layers skipped on the unpruned
    model: numerically the pruned model); returns the unpruned model's sample loss."""
    import torch

    base = sample_loss(model, batches, objective, reference)
    rows = []
    masks = Masks(model, arch)
    try:
        for plan in plans:
            for i in range(len(masks.layers)):
                masks.head[i] = torch.zeros(len(masks.head[i]))
                masks.ffn[i] = torch.zeros(len(masks.ffn[i]))
                if i in plan.keep_layers:
                    masks.head[i][plan.heads[i]] = 1.0
                    masks.ffn[i][plan.ffn[i]] = 1.0
            masks.skip([i for i in range(len(masks.layers)) if i not in plan.keep_layers])
            rows.append(row_losses(model, batches, objective, reference))
            plan.sample_loss = round(float(rows[-1].mean()), 6)
            ctx.log(f"scored: {plan.note}: sample loss {plan.sample_loss:.4f}")
            masks.skip([])
    finally:
        masks.close()
    # How far each candidate is from the best, in standard errors of the paired per-row difference: whether
    # the sample can tell them apart at all (recorded, not used by the rule).
    best = rows[min(range(len(plans)), key=lambda k: plans[k].sample_loss)]
    for plan, r in zip(plans, rows):
        diff = r - best
        plan.loss_se = round(float(diff.std(ddof=1) / math.sqrt(len(diff))), 6) if len(diff) > 1 else None
    return base

