"""prune: structured pruning (attention heads, FFN neurons, whole layers) that becomes real CPU speed.

Why structured: ``torch.nn.utils.prune`` zeroes individual weights (unstructured sparsity) behind a
mask; the dense GEMMs ONNX Runtime runs on CPU do exactly the same work on a matrix full of zeros,
so it buys no latency. This pass removes whole rows and columns instead: the saved checkpoint has
smaller matrices (and fewer layers), so every later stage -- export, fuse, INT8 -- is smaller too.

What is removed, and how it stays a stock checkpoint:

- attention heads: transformers' own ``prune_heads``; the removed heads are recorded in
  ``config.pruned_heads``, which ``from_pretrained`` re-applies before loading the weights (stock
  transformers, no custom code; checked in tests in a fresh process). Heads may differ per layer.
- FFN neurons: the same count in every layer (``intermediate_size`` is one number in the config),
  the neurons chosen per layer by importance.
- layers: whole encoder layers removed, ``num_hidden_layers`` lowered.

Importance (``importance: taylor``, the default) comes from data, on a seeded sample of the vendored
train split or ``data``: one 0/1-valued mask per head (applied to the context vector before the
attention output projection -- the same gradient as transformers' ``head_mask``, Michel et al. 2019)
and per FFN neuron (applied to the activation before the output projection, so its gradient is
activation x gradient, Molchanov et al. 2019). A unit's score is the accumulated |dL/dmask|. Layer
importance is measured, not estimated: the loss increase when the layer is skipped.

- classification: L = cross-entropy on the labels.
- feature extraction (no labels): the proxy is the MSE between the masked model's pooled embedding
  and the unpruned one's. Its gradient is exactly zero at the unpruned point (the loss is at its
  minimum there), so the score is its second-order term instead: E||d emb / d mask||^2, estimated
  with Gaussian probes z (grad of z . emb, squared; Hutchinson). That is the Gauss-Newton estimate
  of the MSE a removal causes.

``importance: magnitude`` is the data-free fallback (weight norms); its record says so.

FLOPs (what ``sparsity`` counts): encoder layers only (embeddings, pooler and classifier are not
counted), a multiply-add = 2 FLOPs, one sequence of length L, per layer with a = heads x head_dim
attention width, d = hidden size, f = FFN width::

    attention projections  8 L d a      (Q, K, V: 3 x 2 L d a; output: 2 L a d)
    scores and context     4 L^2 a      (Q K^T: 2 L^2 a; probs x V: 2 L^2 a)
    FFN                    4 L d f      (two GEMMs of 2 L d f)

``sparsity: 0.5`` removes half of that sum at the reference length (``reference_length``, 128).

Candidates (``strategy: auto``). For every number of dropped layers the budget allows (least
sensitive layers first) and for heads kept at 100%, 75% and 50% (global ranking), the FFN width
(uniform, a SIMD multiple) that completes the FLOPs budget. All remove the same FLOPs, but equal
FLOPs are not equal latency: at batch 1 on short real texts CPU time follows the operators run (a
dropped layer removes ~20 of them, each with a fixed cost) and the shape of each GEMM as much as the
multiply-adds. So every candidate is scored twice:

- loss: on the importance sample, with masks on the unpruned model (one forward pass each);
- latency, measured (``time_plans``): each candidate is pruned for real on a copy, exported in
  memory (optimum, no parity check) and fully fused, and all of them and the unpruned model are
  timed interleaved at batch 1 on up to 64 real held-out texts (``passes.timing.time_stage_dirs``,
  the ORT session settings of ``xformopt.runtime.session``). About 3 s per candidate on MiniLM-L6.

Choice (``prefer``), every candidate's loss and median and the reason are in the record's
``candidates`` and ``selection``:

- ``balanced`` (default): a candidate qualifies when its loss increase over the unpruned model is
  at most ``1 + loss_tolerance`` (1.15) times the smallest increase; the fastest qualifying one wins,
  medians within ``speed_tolerance`` (3%) of it being ties that the lower loss breaks. 15% is about
  two standard errors of the paired loss difference on the default 256-row sample (SE ~0.01 against
  a smallest increase of 0.14 below; recorded per candidate as ``loss_se_vs_best``): the candidates
  the sample cannot tell from the best, then speed.
- ``speed``: the fastest of all candidates (same tie rule). ``accuracy``: the lowest loss, within 2%
  of it fewer layers then more heads (the rule before timing existed); not timed.

Untimed (``time_candidates: false``; by default it follows ``measure_latency``, so ``--no-latency``
is untimed and deterministic), fewer layers count as faster. The choice depends on timings on this
host, so two timed runs can pick different near-equal plans; ``prefer: accuracy`` never does. The
winner's selection median is the best of several noisy numbers (biased low), so the ``latency``
record re-measures the saved checkpoint through the export and fuse passes, independently.

Measured on the 2-core development host (Xeon, load ~3 from other jobs), the MiniLM-L6 sentiment
classifier at ``sparsity: 0.5``: sample loss (unpruned 0.330), accuracy before recovery on the whole
vendored test split (2014 rows; unpruned 0.856) and the selection timing (64 texts, 128 rounds,
tokenization excluded, 11 models interleaved):

    candidate (all remove 50% of FLOPs at 128 tokens)   loss    accuracy   speedup
    0 layers dropped, 72/72 heads, FFN 320               0.492   0.803      1.72x
    0 layers dropped, 54/72 heads, FFN 544               0.479   0.819      1.71x
    0 layers dropped, 36/72 heads, FFN 768               0.473   0.793      1.75x
    1 layer dropped, 60/60 heads, FFN 560 (balanced)     0.490   0.817      1.88x
    1 layer dropped, 45/60 heads, FFN 784                0.509   0.792      1.83x
    2 layers dropped, 48/48 heads, FFN 928               0.496   0.781      1.96x
    2 layers dropped, 24/48 heads, FFN 1376              0.528   0.745      1.90x
    3 layers dropped, 36/36 heads, FFN 1536 (depth)      0.557   0.762      2.00x

Each dropped layer bought 4-9% at equal FLOPs (two runs); how heads and FFN share the rest matters less than
run-to-run noise. The old lowest-loss rule took a 6-layer plan (1.57-1.77x in separate runs);
``balanced`` takes the 5-layer one: the pass's own re-measurement, tokenization included, 300
rounds, was 1.75x (accuracy 0.870 -> 0.802 on its 500 held-out rows). ``strategy: depth`` asks for
the deepest cut directly (``width``: no layer dropped).
"""

from __future__ import annotations

import hashlib
import inspect
import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from xformopt import progress
from xformopt.artifact import copy_side_files
from xformopt.errors import InputError, PassFailed
from xformopt.evaluate.pooling import mean_pool
from xformopt.families import Layout, layout_of
from xformopt.passes.base import Pass, PassContext, PassOptions

AUTO_TIE = 0.02  # candidates within 2% of the best sample loss prefer fewer layers


class PruneOptions(PassOptions):
    sparsity: float | None = Field(
        None, gt=0.0, le=0.9, description="fraction of encoder FLOPs (at reference_length) to remove (> 0)"
    )
    heads_per_layer: int | None = Field(None, ge=1, description="explicit: attention heads kept in every layer")
    ffn_dim: int | None = Field(None, ge=1, description="explicit: FFN width kept in every layer")
    layers: int | None = Field(None, ge=1, description="explicit: number of encoder layers kept")
    strategy: Literal["auto", "width", "depth"] = Field(
        "auto", description="sparsity allocation: auto (candidates over layer counts, chosen by `prefer`), width only, "
                            "depth first"
    )
    prefer: Literal["balanced", "speed", "accuracy"] = Field(
        "balanced", description="how the candidate plans are chosen: balanced (the fastest measured among those whose "
                                "sample-loss increase is within loss_tolerance of the smallest), speed (the fastest "
                                "measured), accuracy (the lowest sample loss; not timed)"
    )
    loss_tolerance: float = Field(
        0.15, ge=0, description="balanced: a candidate qualifies when its sample-loss increase over the unpruned model "
                                "is at most (1 + loss_tolerance) x the smallest increase among the candidates"
    )
    speed_tolerance: float = Field(
        0.03, ge=0, description="medians within this fraction of the fastest are ties, won by the lower sample loss"
    )
    time_candidates: bool | None = Field(
        None, description="export, fuse and time every candidate plan interleaved to choose [default: measure_latency]; "
                          "untimed, fewer layers count as faster"
    )
    candidate_rounds: int = Field(128, ge=3, description="interleaved batch-1 rounds when timing the candidates")
    importance: Literal["taylor", "magnitude"] = Field("taylor", description="taylor (data) or magnitude (data-free)")
    data: str | None = Field(None, description="texts (and labels) for importance; default: vendored train split")
    samples: int = Field(256, ge=8, description="importance sample size (seeded)")
    eval_samples: int = Field(500, ge=8, description="held-out rows for accuracy before/after")
    batch_size: int = Field(16, ge=1)
    max_length: int = Field(128, ge=8, description="truncate importance and evaluation inputs to this many tokens")
    reference_length: int = Field(128, ge=1, description="sequence length the FLOPs target is counted at")
    seed: int = 0
    measure_latency: bool = Field(True, description="export + fuse both models and time them interleaved")
    latency_rounds: int = Field(300, ge=3)

    @model_validator(mode="after")
    def _one_target(self):
        explicit = [self.heads_per_layer, self.ffn_dim, self.layers]
        if self.sparsity is None and all(v is None for v in explicit):
            raise ValueError("give a target: sparsity (e.g. 0.5), or heads_per_layer / ffn_dim / layers")
        if self.sparsity is not None and any(v is not None for v in explicit):
            raise ValueError("sparsity and explicit heads_per_layer/ffn_dim/layers are exclusive; give one kind")
        return self


# --------------------------------------------------------------------------- architecture access


@dataclass
class Arch:
    """Where the prunable pieces of one family live: its row's module paths (xformopt.families.Layout)."""

    layout: Layout

    def layers(self, model):
        return Layout.get(model.base_model, self.layout.layers)

    def set_layers(self, model, modules) -> None:
        import torch

        Layout.set(model.base_model, self.layout.layers, torch.nn.ModuleList(modules))
        setattr(model.config, self.layout.layers_key, len(modules))
        if self.layout.layer_count_attr:
            Layout.set(model.base_model, self.layout.layer_count_attr, len(modules))

    def attention(self, layer):
        return layer.attention

    def heads(self, layer) -> int:
        return Layout.get(layer, self.layout.heads)

    def head_dim(self, layer) -> int:
        return Layout.get(layer, self.layout.head_dim)

    def attn_out(self, layer):
        return Layout.get(layer, self.layout.attn_out)

    def attn_value(self, layer):
        return Layout.get(layer, self.layout.attn_value)

    def ffn_in(self, layer):
        return Layout.get(layer, self.layout.ffn_in)

    def ffn_out(self, layer):
        return Layout.get(layer, self.layout.ffn_out)

    def set_ffn(self, layer, lin_in, lin_out) -> None:
        Layout.set(layer, self.layout.ffn_in, lin_in)
        Layout.set(layer, self.layout.ffn_out, lin_out)

    def set_ffn_config(self, config, width: int) -> None:
        setattr(config, self.layout.ffn_key, width)

    def hidden(self, config) -> int:
        return getattr(config, self.layout.hidden_key)


def arch_for(model_type: str, pass_name: str = "prune") -> Arch:
    """Where ``model_type``'s prunable pieces live; an InputError naming the supported families otherwise."""
    return Arch(layout_of(model_type, pass_name))


# --------------------------------------------------------------------------- FLOPs


@dataclass
class Shape:
    """Per-layer kept dimensions of an encoder."""

    hidden: int
    head_dim: int
    heads: list[int]  # per layer
    ffn: list[int]  # per layer

    @property
    def num_layers(self) -> int:
        return len(self.heads)


def layer_flops(hidden: int, attn_width: int, ffn: int, length: float) -> dict[str, float]:
    return {
        "attention_projections": 8 * length * hidden * attn_width,
        "attention_scores": 4 * length * length * attn_width,
        "ffn": 4 * length * hidden * ffn,
    }


def encoder_flops(shape: Shape, length: float) -> dict[str, float]:
    total = {"attention_projections": 0.0, "attention_scores": 0.0, "ffn": 0.0}
    for heads, ffn in zip(shape.heads, shape.ffn):
        for k, v in layer_flops(shape.hidden, heads * shape.head_dim, ffn, length).items():
            total[k] += v
    total["total"] = sum(total.values())
    return total


def round_multiple(value: float, multiple: int, low: int, high: int) -> int:
    """``value`` rounded to the nearest multiple (at least one multiple), clipped to [low, high]."""
    rounded = max(multiple, round(value / multiple) * multiple)
    return int(min(max(rounded, low), high))


def head_step(head_dim: int, multiple: int) -> int:
    """Smallest head count whose width (heads x head_dim) is a multiple of the SIMD multiple."""
    return multiple // math.gcd(head_dim, multiple)


# --------------------------------------------------------------------------- masks and importance


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


# --------------------------------------------------------------------------- plans


@dataclass
class Plan:
    keep_layers: list[int]  # indices into the current layers
    heads: dict[int, list[int]]  # current layer index -> kept head positions (current numbering)
    ffn: dict[int, list[int]]  # current layer index -> kept neuron positions
    ffn_width: int
    note: str = ""
    sample_loss: float | None = None
    median_ms: float | None = None  # measured: ONNX fp32 fully fused, batch 1, interleaved with the other candidates
    p90_ms: float | None = None
    fused_attention: int | None = None  # Attention nodes the candidate's ONNX graph fused (one per layer expected)
    qualified: bool | None = None  # set by select_plan: passed the rule's loss filter
    loss_se: float | None = None  # standard error of the paired per-row loss difference to the best candidate

    @property
    def kept_heads(self) -> int:
        return sum(len(h) for h in self.heads.values())


def top(scores: np.ndarray, k: int) -> list[int]:
    """Indices of the k highest scores (ties broken by index: deterministic), in ascending order."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return sorted(order[:k])


def global_heads(head_scores: list[np.ndarray], layers: list[int], total: int, step: int) -> dict[int, int]:
    """Heads kept per layer: a global ranking of per-layer-normalised scores (Michel et al.), at least
    ``step`` heads in every layer, and each layer's count a multiple of ``step`` where it can be."""
    normalised = {i: head_scores[i] / (np.linalg.norm(head_scores[i]) + 1e-12) for i in layers}
    counts = {i: min(step, len(head_scores[i])) for i in layers}
    # Add heads in chunks of `step`: a chunk's value is the sum of the next `step` best heads of a layer.
    while sum(counts.values()) + step <= total:
        best, value = None, -1.0
        for i in layers:
            ranked = np.sort(normalised[i])[::-1]
            if counts[i] + step > len(ranked):
                continue
            v = float(ranked[counts[i]:counts[i] + step].sum())
            if v > value:
                best, value = i, v
        if best is None:
            break
        counts[best] += step
    return counts


def width_plan(head_scores, ffn_scores, keep_layers: list[int], head_fraction: float, shape0: Shape,
               multiple: int, target_flops: float, length: float) -> Plan | None:
    """Globally ranked heads keeping ``head_fraction`` of those in ``keep_layers``, then the one FFN
    width (uniform across layers, a SIMD multiple) that lands closest to ``target_flops``.
    None when no FFN width in [multiple, original] gets within 5% of the target."""
    f0 = max(shape0.ffn[i] for i in keep_layers)
    step = head_step(shape0.head_dim, multiple)
    available = sum(shape0.heads[i] for i in keep_layers)
    counts = global_heads(head_scores, keep_layers, round(head_fraction * available), step)
    attention = sum(sum(layer_flops(shape0.hidden, counts[i] * shape0.head_dim, 0, length).values()) for i in keep_layers)
    per_neuron = len(keep_layers) * layer_flops(shape0.hidden, 0, 1, length)["ffn"]
    width = round_multiple((target_flops - attention) / per_neuron, multiple, multiple, f0)
    achieved = attention + width * per_neuron
    if abs(achieved - target_flops) > 0.05 * target_flops:
        return None
    kept = sum(counts.values())
    return Plan(
        keep_layers=list(keep_layers),
        heads={i: top(head_scores[i], counts[i]) for i in keep_layers},
        ffn={i: top(ffn_scores[i], width) for i in keep_layers},
        ffn_width=width,
        note=f"{shape0.num_layers - len(keep_layers)} layer(s) dropped, {kept}/{available} heads, FFN {width}/{f0}",
    )


def removes_nothing(plan: Plan, shape0: Shape) -> bool:
    """True when ``plan`` keeps every layer, head and FFN neuron of ``shape0``: a prune that is a copy."""
    return len(plan.keep_layers) == shape0.num_layers and all(
        len(plan.heads[i]) == shape0.heads[i] and len(plan.ffn[i]) == shape0.ffn[i] for i in plan.keep_layers)


def distinct(plans: list[Plan]) -> list[Plan]:
    """``plans`` without repeats (two head fractions can round to the same counts): each is scored and timed once."""
    seen, out = set(), []
    for plan in plans:
        key = (tuple(plan.keep_layers), tuple(tuple(plan.heads[i]) for i in plan.keep_layers), plan.ffn_width)
        if key not in seen:
            seen.add(key)
            out.append(plan)
    return out


def shape_text(shape: Shape) -> str:
    heads = shape.heads[0] if len(set(shape.heads)) == 1 else "/".join(map(str, shape.heads))
    ffn = shape.ffn[0] if len(set(shape.ffn)) == 1 else "/".join(map(str, shape.ffn))
    return f"{shape.num_layers} layers, {heads} heads per layer, FFN {ffn}"


def check_explicit_prunes(shape0: Shape, options: PruneOptions, multiple: int) -> None:
    """Fail before any importance work when explicit targets, clipped to the model and rounded to the
    SIMD multiple, keep the model's shape (e.g. ``layers: 99, ffn_dim: 99999``). The kept counts do
    not depend on the importance scores, so neutral scores decide it."""
    neutral = explicit_plan([np.zeros(h) for h in shape0.heads], [np.zeros(f) for f in shape0.ffn],
                            [0.0] * shape0.num_layers, shape0, options, multiple)
    if removes_nothing(neutral, shape0):
        asked = ", ".join(f"{k}={getattr(options, k)}" for k in ("layers", "heads_per_layer", "ffn_dim")
                          if getattr(options, k) is not None)
        raise InputError(f"nothing to prune: {asked} keeps the model's whole shape ({shape_text(shape0)}; targets "
                         f"above it are clipped to it); ask for fewer heads/FFN/layers or sparsity > 0")


HEAD_FRACTIONS = (1.0, 0.75, 0.5)  # heads kept (global ranking); the FFN width is solved for the rest


def explicit_plan(head_scores, ffn_scores, layer_scores, shape0: Shape, options: PruneOptions, multiple: int) -> Plan:
    n = shape0.num_layers
    keep_n = min(options.layers or n, n)
    keep_layers = sorted(sorted(range(n), key=lambda i: (-layer_scores[i], i))[:keep_n])
    f0 = max(shape0.ffn)
    width = f0 if options.ffn_dim is None else round_multiple(options.ffn_dim, multiple, 1, f0)
    heads = {}
    for i in keep_layers:
        h = shape0.heads[i] if options.heads_per_layer is None else min(options.heads_per_layer, shape0.heads[i])
        if options.heads_per_layer is not None:
            step = head_step(shape0.head_dim, multiple)
            if h >= step and shape0.heads[i] >= step:
                h = max(step, (h // step) * step)  # round down to a SIMD-friendly width where possible
        heads[i] = top(head_scores[i], h)
    return Plan(keep_layers, heads, {i: top(ffn_scores[i], width) for i in keep_layers}, width, note="explicit")


def candidate_plans(head_scores, ffn_scores, layer_scores, shape0: Shape, sparsity: float, strategy: str,
                    multiple: int, length: float, head_fractions: tuple[float, ...] = HEAD_FRACTIONS) -> list[Plan]:
    """Plans that each remove ``sparsity`` of the FLOPs: for every number of dropped layers (least
    sensitive first) the budget allows, and every head fraction, the FFN width that completes it."""
    n = shape0.num_layers
    target = (1 - sparsity) * encoder_flops(shape0, length)["total"]
    per_layer = [encoder_flops(Shape(shape0.hidden, shape0.head_dim, [shape0.heads[i]], [shape0.ffn[i]]), length)["total"]
                 for i in range(n)]
    order = sorted(range(n), key=lambda i: (layer_scores[i], i))  # least important first
    by_depth: dict[int, list[Plan]] = {}
    for dropped in range(n):
        keep = sorted(set(range(n)) - set(order[:dropped]))
        if sum(per_layer[i] for i in keep) < target * (1 - 0.05):
            break  # dropping this many layers already removes more than the budget
        plans = [p for f in head_fractions
                 if (p := width_plan(head_scores, ffn_scores, keep, f, shape0, multiple, target, length)) is not None]
        if plans:
            by_depth[dropped] = plans
    if strategy == "width":
        by_depth = {0: by_depth[0]} if 0 in by_depth else {}
    elif strategy == "depth" and by_depth:
        deepest = max(by_depth)
        by_depth = {deepest: by_depth[deepest][:1]}  # most layers dropped, as many heads kept as reach the target
    if not by_depth:
        raise InputError(f"sparsity {sparsity} cannot be reached with strategy {strategy!r} while keeping at least "
                         f"one layer, one head per layer and {multiple} FFN neurons; use a smaller sparsity")
    return [p for plans in by_depth.values() for p in plans]


# --------------------------------------------------------------------------- applying a plan


def apply_plan(model, arch: Arch, plan: Plan) -> None:
    """Drop layers, prune heads with transformers' prune_heads (recorded in config.pruned_heads, which
    from_pretrained re-applies), and cut FFN rows/columns with transformers' prune_linear_layer."""
    import torch
    from transformers.pytorch_utils import prune_linear_layer

    layers = list(arch.layers(model))
    old_pruned = {int(k): list(v) for k, v in (model.config.pruned_heads or {}).items()}
    heads_to_prune: dict[int, list[int]] = {}
    for new, old in enumerate(plan.keep_layers):
        layer = layers[old]
        already = set(arch.attention(layer).pruned_heads)
        original_ids = [h for h in range(arch.heads(layer) + len(already)) if h not in already]  # current -> original
        drop = [original_ids[p] for p in range(arch.heads(layer)) if p not in set(plan.heads[old])]
        if drop:
            heads_to_prune[new] = drop
        keep = torch.tensor(plan.ffn[old], dtype=torch.long)
        arch.set_ffn(layer, prune_linear_layer(arch.ffn_in(layer), keep, dim=0),
                     prune_linear_layer(arch.ffn_out(layer), keep, dim=1))
    arch.set_layers(model, [layers[i] for i in plan.keep_layers])
    model.config.pruned_heads = {new: old_pruned[old] for new, old in enumerate(plan.keep_layers) if old_pruned.get(old)}
    arch.set_ffn_config(model.config, plan.ffn_width)
    if heads_to_prune:
        model.prune_heads(heads_to_prune)
    model.config.pruned_heads = {int(k): sorted(int(h) for h in v) for k, v in model.config.pruned_heads.items()}


def current_shape(model, arch: Arch) -> Shape:
    layers = list(arch.layers(model))
    return Shape(arch.hidden(model.config), arch.head_dim(layers[0]), [arch.heads(l) for l in layers],
                 [arch.ffn_in(l).out_features for l in layers])


def weights_sha256(model) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


# --------------------------------------------------------------------------- data and evaluation


def load_sets(ctx: PassContext, options: PruneOptions, labelled: bool):
    """(importance sample, held-out sample). Default: the vendored train split for importance and the
    vendored test split held out; with ``data``: two disjoint seeded parts of that file."""
    from xformopt.data import load_text_dataset
    from xformopt.resources import vader_split_path

    label2id = ctx.spec.label2id or None
    kwargs = dict(label2id=label2id, require_labels=labelled, label_column=None if labelled else "")
    if options.data:
        full = load_text_dataset(Path(options.data), **kwargs, seed=options.seed)
        if len(full) < 16:
            raise InputError(f"{options.data} has {len(full)} rows; pruning needs at least 16 (importance + held-out)")
        held, imp = full.split(min(0.5, options.eval_samples / len(full)), options.seed)
        imp = imp.subset(np.random.default_rng(options.seed).permutation(len(imp))[: options.samples].tolist())
        return imp, held
    imp = load_text_dataset(vader_split_path("train"), **kwargs, limit=options.samples, seed=options.seed)
    held = load_text_dataset(vader_split_path("test"), **kwargs, limit=options.eval_samples, seed=options.seed)
    return imp, held


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


def measure_onnx_latency(ctx: PassContext, original: Path, pruned: Path, rounds: int) -> dict:
    """Export and fully fuse both models with xformopt's own passes, then time them interleaved at
    batch 1 over real held-out texts (tokenization included)."""
    import dataclasses

    from xformopt import models
    from xformopt.bench.host import host_info
    from xformopt.bench.modes import real
    from xformopt.exporting import quiet_loggers
    from xformopt.passes.export import ExportOptions, ExportPass
    from xformopt.passes.fuse import FuseOptions, FusePass
    from xformopt.runtime.encoder import OrtPredictor

    out = {}
    with tempfile.TemporaryDirectory(prefix="xformopt-prune-") as work:
        dirs = {}
        for name, src in (("unpruned", original), ("pruned", pruned)):
            sub = dataclasses.replace(ctx, spec=models.stage_spec(ctx.spec, src), log=lambda m: None)
            exported, fused = Path(work) / f"{name}-export", Path(work) / f"{name}-fused"
            exported.mkdir()
            fused.mkdir()
            ctx.log(f"exporting and fusing the {name} model for timing")
            # ORT warns that a pruned layer's Q width differs from the input width; that is the point here.
            with quiet_loggers("onnxruntime.transformers", "fusion_attention"):
                ExportPass().run(sub, src, exported, ExportOptions())
                record = FusePass().run(sub, exported, fused, FuseOptions(select="all"))
            out[f"{name}_fused"] = {k: v for k, v in record["fused_kept"].items() if v}
            out[f"{name}_expected"] = record["expected"]
            dirs[name] = fused
        predictors = {name: OrtPredictor(ctx.spec, d, threads=ctx.threads) for name, d in dirs.items()}
        texts, pairs = ctx.spec.task_def.timing_inputs(ctx.sample_data)  # text pairs timed as pairs
        ctx.log(f"timing pruned vs unpruned ONNX interleaved ({rounds} rounds, batch 1)")
        stats = real(predictors, texts[:200], pairs[:200] if pairs else None, rounds=rounds, warmup=10, seed=0)
    host = host_info()
    out.update({
        "measured_on": f"measured on {host.get('cpu_model', 'this host')} ({ctx.threads} threads)",
        "what": "ONNX fp32, fully fused (xformopt export + fuse select=all), batch 1, real held-out texts, "
                "tokenization included, interleaved rounds",
        "texts": len(texts),
        "rounds": rounds,
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "unpruned_ms": {k: round(getattr(stats["unpruned"], k), 4) for k in ("median_ms", "p90_ms")},
        "pruned_ms": {k: round(getattr(stats["pruned"], k), 4) for k in ("median_ms", "p90_ms")},
        "speedup_median": round(stats["unpruned"].median_ms / stats["pruned"].median_ms, 3),
    })
    return out


# --------------------------------------------------------------------------- choosing among candidates

PREFER_RULES = {
    "balanced": "candidates whose sample-loss increase over the unpruned model is at most (1 + loss_tolerance) x the "
                "smallest increase (or within 2% of the best loss) qualify; the fastest of them wins, medians within "
                "speed_tolerance of it counting as ties, which the lowest sample loss breaks",
    "speed": "the fastest of all candidates (they all remove the same FLOPs); medians within speed_tolerance of it "
             "count as ties, which the lowest sample loss breaks",
    "accuracy": "the lowest sample loss; within 2% of it, the fewest layers, then the most heads (not timed)",
}
UNTIMED_SPEED = ("not timed: fewer layers kept counts as faster (each dropped layer also removes its ~20 operators; "
                 "measured faster than any re-split of the same FLOPs between heads and FFN), equal layer counts tie")


def loss_limit(base_loss: float, best_loss: float, tolerance: float) -> float:
    """The largest sample loss ``balanced`` accepts: the best candidate's loss increase over the unpruned model,
    times (1 + tolerance), and never less than AUTO_TIE above the best (so a near-lossless best keeps its ties)."""
    return max(base_loss + (1 + tolerance) * (best_loss - base_loss), best_loss + AUTO_TIE * max(abs(best_loss), 1e-9))


def select_plan(plans: list[Plan], prefer: str, base_loss: float, loss_tolerance: float,
                speed_tolerance: float) -> tuple[Plan, dict]:
    """Choose among ``plans`` (each with ``sample_loss``; ``median_ms`` when timed) by the ``prefer`` rule.

    Returns the winner and what decided it: the rule, the loss limit, which candidates qualified, and a one-line
    reason. Pure: no model, no clock (tests inject losses and latencies)."""
    best = min(plans, key=lambda p: p.sample_loss)
    info: dict = {"prefer": prefer, "rule": PREFER_RULES[prefer], "unpruned_sample_loss": round(base_loss, 6),
                  "best_sample_loss": best.sample_loss}
    if prefer == "accuracy":
        near = [p for p in plans if p.sample_loss - best.sample_loss <= AUTO_TIE * max(abs(best.sample_loss), 1e-9)]
        # Same FLOPs, near-equal loss: fewer layers first (fewer operators), then more heads kept.
        chosen = min(near, key=lambda p: (len(p.keep_layers), -p.kept_heads, p.sample_loss))
        for p in plans:
            p.qualified = any(p is q for q in near)
        info["qualified"] = [p.note for p in near]
        info["reason"] = (f"lowest sample loss {best.sample_loss:.4f}" if chosen is best else
                          f"within {AUTO_TIE:.0%} of the lowest sample loss ({best.sample_loss:.4f}: {best.note}) "
                          f"with fewer layers or more heads")
        return chosen, info

    timed = all(p.median_ms is not None for p in plans)
    if prefer == "balanced":
        limit = loss_limit(base_loss, best.sample_loss, loss_tolerance)
        qualified = [p for p in plans if p.sample_loss <= limit + 1e-12]
        info.update(loss_tolerance=loss_tolerance, loss_limit=round(limit, 6))
    else:
        qualified = list(plans)
    for p in plans:
        p.qualified = any(p is q for q in qualified)
    info["qualified"] = [p.note for p in qualified]
    info["speed_tolerance"] = speed_tolerance if timed else None
    if timed:
        fastest = min(qualified, key=lambda p: (p.median_ms, p.sample_loss))
        ties = [p for p in qualified if p.median_ms <= fastest.median_ms * (1 + speed_tolerance)]
    else:
        fastest = min(qualified, key=lambda p: (len(p.keep_layers), p.sample_loss))
        ties = [p for p in qualified if len(p.keep_layers) == len(fastest.keep_layers)]
        info["speed_order"] = UNTIMED_SPEED
    chosen = min(ties, key=lambda p: (p.sample_loss, len(p.keep_layers), -p.kept_heads))

    def speed(p: Plan) -> str:
        return f"{p.median_ms:.3f} ms" if timed else f"{len(p.keep_layers)} layers"

    pool = (f"{len(qualified)} of {len(plans)} candidates within the loss limit {info['loss_limit']:.4f} "
            f"(unpruned {base_loss:.4f}, best {best.sample_loss:.4f}, increase x{1 + loss_tolerance:g})"
            if prefer == "balanced" else f"all {len(plans)} candidates")
    if chosen is fastest:
        why = f"fastest ({speed(chosen)})"
    else:
        why = (f"lowest sample loss ({chosen.sample_loss:.4f}) among those within {speed_tolerance:.0%} of the fastest "
               f"({fastest.note}: {speed(fastest)}; this one {speed(chosen)})" if timed else
               f"lowest sample loss ({chosen.sample_loss:.4f}) among the {len(fastest.keep_layers)}-layer plans")
    info["reason"] = f"{prefer}: {pool}; {why}, sample loss {chosen.sample_loss:.4f}"
    return chosen, info


def time_plans(ctx: PassContext, model, arch: Arch, plans: list[Plan], tokenizer_dir: Path, rounds: int) -> dict:
    """Export (optimum, in memory, no parity check) and fully fuse the unpruned model and every candidate
    (masks are numerically the same, but only a really smaller model is faster), then time them interleaved
    at batch 1 on up to 64 real held-out texts (``passes.timing.time_stage_dirs``: the same ORT session
    settings as every other timing). Sets each plan's ``median_ms``, ``p90_ms`` and ``fused_attention``;
    returns the unpruned model's figures and how they were measured."""
    import copy
    import dataclasses
    import time
    import warnings

    from optimum.exporters.onnx import onnx_export_from_model

    from xformopt.bench.host import host_info
    from xformopt.exporting import quiet_loggers
    from xformopt.passes.fuse import build_fused
    from xformopt.passes.timing import TIMED_TEXTS, time_stage_dirs

    started = time.perf_counter()
    fused: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="xformopt-prune-candidates-") as work:
        dirs: dict[str, Path] = {}
        for n, (key, plan) in enumerate([("unpruned", None), *((f"candidate{i}", p) for i, p in enumerate(plans))]):
            progress.report("prune: exporting candidates", n, len(plans) + 1)
            candidate = copy.deepcopy(model)
            if plan is not None:
                apply_plan(candidate, arch, plan)
            candidate.eval()
            stage, raw = Path(work) / key, Path(work) / f"{key}-export"
            stage.mkdir()
            # A pruned graph's attention widths differ per layer: ORT reads them from the graph (see fuse).
            sub = dataclasses.replace(ctx, spec=dataclasses.replace(ctx.spec, pruned=True)) if plan else ctx
            with warnings.catch_warnings(), quiet_loggers("optimum", "transformers", "torch.onnx",
                                                           "onnxruntime.transformers", "fusion_attention"):
                warnings.simplefilter("ignore")
                onnx_export_from_model(candidate, raw, opset=17, do_validation=False, no_post_process=True,
                                       objective=ctx.spec.task_def.torch_objective)
                counts = build_fused(raw / "model.onnx", stage / "model.onnx", sub, ())
            fused[key] = counts.get("Attention", 0)
            layers = len(plan.keep_layers) if plan else len(arch.layers(model))
            if fused[key] < layers:  # timed as it is, but say so: an unfused graph is slower for another reason
                ctx.log(f"{plan.note if plan else 'unpruned'}: only {fused[key]}/{layers} Attention nodes fused")
            shutil.rmtree(raw)
            del candidate
            dirs[key] = stage
        progress.report("prune: exporting candidates", len(plans) + 1, len(plans) + 1)
        ctx.log(f"timing the unpruned model and {len(plans)} candidates interleaved ({rounds} rounds, batch 1)")
        stats = time_stage_dirs(ctx, dirs, rounds, tokenizer_dir=tokenizer_dir)
    for i, plan in enumerate(plans):
        s = stats[f"candidate{i}"]
        plan.median_ms, plan.p90_ms = round(s["median_ms"], 4), round(s["p90_ms"], 4)
        plan.fused_attention = fused[f"candidate{i}"]
    host = host_info()
    return {
        "what": "ONNX fp32 (optimum export in memory, no parity check; ORT fusions select=all), batch 1, "
                f"up to {TIMED_TEXTS} real held-out texts pre-tokenized, all candidates and the unpruned model "
                "interleaved in shuffled order every round",
        "measured_on": f"measured on {host.get('cpu_model', 'this host')} ({ctx.threads} threads)",
        "texts": min(TIMED_TEXTS, len(ctx.sample_texts)),
        "rounds": rounds,
        "unpruned_ms": {"median_ms": round(stats["unpruned"]["median_ms"], 4),
                        "p90_ms": round(stats["unpruned"]["p90_ms"], 4)},
        "unpruned_fused_attention": fused["unpruned"],
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "seconds": round(time.perf_counter() - started, 1),
    }


def candidate_record(plan: Plan, base_loss: float, unpruned_ms: float | None) -> dict:
    out = {
        "plan": plan.note,
        "layers": len(plan.keep_layers),
        "heads": plan.kept_heads,
        "ffn": plan.ffn_width,
        "sample_loss": plan.sample_loss,
        "loss_increase": round(plan.sample_loss - base_loss, 6),
        "loss_se_vs_best": plan.loss_se,
        "qualified": plan.qualified,
    }
    if plan.median_ms is not None:
        out.update(median_ms=plan.median_ms, p90_ms=plan.p90_ms, fused_attention=plan.fused_attention)
        if unpruned_ms:
            out["speedup_vs_unpruned"] = round(unpruned_ms / plan.median_ms, 3)
    return out


# --------------------------------------------------------------------------- the pass


def shape_record(shape: Shape, ref_len: int, mean_len: float) -> dict:
    return {
        "layers": shape.num_layers,
        "heads_per_layer": shape.heads,
        "ffn_per_layer": shape.ffn,
        "flops_at_reference": encoder_flops(shape, ref_len),
        "flops_at_sample_mean_length": encoder_flops(shape, mean_len),
    }


class PrunePass(Pass):
    name = "prune"
    stage = "torch"
    consumes = "hf"
    produces = "hf"
    Options = PruneOptions
    summary = "structured pruning (heads, FFN neurons, layers) from data-driven importance; a stock HF checkpoint"
    needs = ("importance data (default: vendored train split)", "held-out texts (timing)")

    @staticmethod
    def summarize(rec: dict) -> str:
        """One line: what the pass changed and how it was verified."""
        s, q = rec["sparsity_achieved"], rec["quality_before_recovery"]
        metric = "accuracy" if "accuracy" in q["pruned"] else "cosine_to_unpruned"
        before = q["unpruned"].get(metric, 1.0)
        line = (f"{rec['before']['layers']}->{rec['after']['layers']} layers, heads {rec['after']['heads_per_layer']}, "
                f"FFN {rec['after']['ffn_per_layer'][0]}; FLOPs -{s['at_reference']:.0%} at {rec['reference_length']} tokens, "
                f"params {rec['params']['before']:,}->{rec['params']['after']:,}; {metric} {before:.4f}->{q['pruned'][metric]:.4f} "
                f"(before recovery, {rec['importance']['method']} importance)")
        if "latency" in rec:
            lat = rec["latency"]
            line += (f"; ONNX fused batch 1: {lat['unpruned_ms']['median_ms']:.2f} -> {lat['pruned_ms']['median_ms']:.2f} ms "
                     f"({lat['speedup_median']:.2f}x, {lat['measured_on']})")
        return line

    def run(self, ctx: PassContext, src: Path, dst: Path, options: PruneOptions) -> dict:
        import torch

        from xformopt.models import load_tokenizer, load_torch_model

        arch = arch_for(ctx.spec.model_type)
        if options.heads_per_layer is not None and not arch.layout.head_pruning:
            raise InputError(f"{ctx.spec.model_type} attention heads cannot be pruned (its heads share one "
                             "position bias); drop heads_per_layer and prune ffn_dim or layers")
        objective = ctx.spec.task_def.torch_objective
        torch.manual_seed(options.seed)
        model = load_torch_model(ctx.spec, src)
        model.requires_grad_(False)
        if options.sparsity is None:
            check_explicit_prunes(current_shape(model, arch), options, ctx.target.simd_multiple)
        tokenizer = load_tokenizer(src, ctx.spec.trust_remote_code)
        accepts = set(inspect.signature(model.forward).parameters)
        labelled = objective == "logits"
        imp_set, held_set = load_sets(ctx, options, labelled)
        ctx.log(f"importance sample {len(imp_set)} rows ({imp_set.source}); held-out {len(held_set)} rows")

        def batches_of(ds):
            return make_batches(tokenizer, ds.texts, ds.text_pairs, ds.labels if labelled else None,
                                options.batch_size, options.max_length, accepts)

        imp_b, held_b = batches_of(imp_set), batches_of(held_set)
        imp_ref = reference_embeddings(model, imp_b, objective)
        held_ref = reference_embeddings(model, held_b, objective)
        mean_len = float(np.mean([len(ids) for ids in tokenizer(list(held_set.texts), truncation=True,
                                                                  max_length=options.max_length)["input_ids"]]))
        shape0 = current_shape(model, arch)
        params0 = sum(p.numel() for p in model.parameters())
        multiple = ctx.target.simd_multiple

        if options.importance == "taylor":
            ctx.log("scoring heads and FFN neurons (Taylor: |d loss / d mask|)")
            head_scores, ffn_scores = taylor_importance(model, arch, imp_b, objective, options.seed)
            ctx.log("measuring layer-drop sensitivity")
            layer_scores = layer_sensitivity(model, arch, imp_b, objective, imp_ref)
            method = {
                "method": "taylor",
                "heads": "accumulated |dL/d head_mask| (Michel et al. 2019), normalised per layer for global ranking"
                if labelled else "E[(z . d emb / d head_mask)^2], Gaussian probes z (2nd-order term of the embedding-MSE proxy)",
                "ffn": "accumulated |activation x gradient| per neuron (Taylor, Molchanov et al. 2019)"
                if labelled else "E[(z . d emb / d neuron_mask)^2], Gaussian probes z",
                "layers": "loss increase on the sample when the layer is skipped"
                + ("" if labelled else " (MSE to the unpruned embeddings)"),
                "loss": "cross-entropy on the labels" if labelled
                else "MSE between pooled embeddings and the unpruned model's (self-supervised proxy)",
            }
        else:
            head_scores, ffn_scores, layer_scores = magnitude_importance(model, arch)
            method = {
                "method": "magnitude",
                "note": "data-free fallback: weight norms, no data used for importance "
                        "(heads |W_v|x|W_o|, neurons |W_in|x|W_out|, layers |output projections|)",
            }
        if options.importance == "taylor":
            method.update({"samples": len(imp_set), "source": imp_set.source, "seed": options.seed})
        else:
            method.update({"samples": 0, "candidate_choice": "rule (no data): fewest layers dropped, most heads kept"})

        if options.sparsity is not None:
            plans = candidate_plans(head_scores, ffn_scores, layer_scores, shape0, options.sparsity,
                                    options.strategy, multiple, options.reference_length,
                                    HEAD_FRACTIONS if arch.layout.head_pruning else (1.0,))
            # A small sparsity can round back to the full shape (the FFN width is a SIMD multiple, and
            # 5% of the target is tolerated): such a candidate removes nothing and is not a prune.
            plans = distinct([p for p in plans if not removes_nothing(p, shape0)])
            if not plans:
                raise InputError(f"nothing to prune: sparsity {options.sparsity} rounds back to the model's whole shape "
                                 f"({shape_text(shape0)}; FFN widths are multiples of {multiple}); ask for fewer "
                                 f"heads/FFN/layers or a larger sparsity")
        else:
            plans = [explicit_plan(head_scores, ffn_scores, layer_scores, shape0, options, multiple)]
            if removes_nothing(plans[0], shape0):  # check_explicit_prunes already refused this; kept as a guard
                raise InputError(f"nothing to prune: the explicit targets keep the model's whole shape "
                                 f"({shape_text(shape0)}); ask for fewer heads/FFN/layers or sparsity > 0")
        if options.importance == "taylor":
            plan, selection = self.choose(model, arch, plans, imp_b, objective, imp_ref, ctx, options, src)
        else:  # data-free: no sample loss to weigh speed against; the allocation that keeps the most structure
            plan = min(plans, key=lambda p: (-len(p.keep_layers), -p.kept_heads))
            selection = {"prefer": None, "timed": False,
                         "reason": "magnitude importance (no data): no layer dropped if possible, the most heads kept"}

        before_quality = quality(model, held_b, objective, held_ref)
        apply_plan(model, arch, plan)
        model.eval()
        after_quality = quality(model, held_b, objective, held_ref)
        shape1 = current_shape(model, arch)
        if shape1.num_layers == 0 or min(shape1.heads) == 0:
            raise PassFailed("pruning would leave a layer without attention heads")

        model.save_pretrained(dst)
        copy_side_files(src, dst)  # tokenizer and any other non-weight files
        removed_layers = [i for i in range(shape0.num_layers) if i not in plan.keep_layers]
        f_ref0 = encoder_flops(shape0, options.reference_length)["total"]
        f_ref1 = encoder_flops(shape1, options.reference_length)["total"]
        f_mean0 = encoder_flops(shape0, mean_len)["total"]
        f_mean1 = encoder_flops(shape1, mean_len)["total"]
        record = {
            "flops_formula": "per layer, a = heads x head_dim: 8*L*d*a (Q,K,V,out projections) + 4*L^2*a "
                             "(scores, context) + 4*L*d*f (FFN); multiply-add = 2 FLOPs; encoder layers only",
            "reference_length": options.reference_length,
            "sample_mean_length": round(mean_len, 2),
            "target": {"sparsity": options.sparsity} if options.sparsity is not None else {
                k: getattr(options, k) for k in ("heads_per_layer", "ffn_dim", "layers")},
            "strategy": options.strategy if options.sparsity else "explicit",
            "simd_multiple": multiple,
            "sparsity_achieved": {"at_reference": round(1 - f_ref1 / f_ref0, 4),
                                  "at_sample_mean_length": round(1 - f_mean1 / f_mean0, 4)},
            "before": shape_record(shape0, options.reference_length, mean_len),
            "after": shape_record(shape1, options.reference_length, mean_len),
            "params": {"before": int(params0), "after": int(sum(p.numel() for p in model.parameters()))},
            "removed_layers": removed_layers,
            "kept_layers": plan.keep_layers,
            "pruned_heads": {str(k): v for k, v in model.config.pruned_heads.items()},
            "importance": method,
            "candidates": selection.pop("candidates", []),
            "chosen": plan.note,
            "selection": selection,
            "quality_before_recovery": {"unpruned": before_quality, "pruned": after_quality,
                                        "heldout": held_set.source},
            "weights_sha256": weights_sha256(model),
        }
        del model
        if options.measure_latency:
            record["latency"] = measure_onnx_latency(ctx, src, dst, options.latency_rounds)
        return record

    @staticmethod
    def choose(model, arch: Arch, plans: list[Plan], batches: Batches, objective: str, reference, ctx,
               options: PruneOptions | None = None, tokenizer_dir: Path | None = None) -> tuple[Plan, dict]:
        """Score every candidate's sample loss (masks on the unpruned model, one forward pass each), time
        them when the rule needs it (:func:`time_plans`), and pick by ``options.prefer``
        (:func:`select_plan`). Returns the plan and the selection record."""
        options = options or PruneOptions(sparsity=0.5, prefer="accuracy")
        if len(plans) == 1:
            return plans[0], {"prefer": options.prefer, "reason": "the only candidate", "timed": False}
        base = round(score_plans(model, arch, plans, batches, objective, reference, ctx), 6)
        want_timing = options.measure_latency if options.time_candidates is None else options.time_candidates
        timing: dict | None = None
        if options.prefer != "accuracy" and want_timing:
            ctx.log(f"exporting and fusing the unpruned model and {len(plans)} candidates for timing")
            try:
                timing = time_plans(ctx, model, arch, plans, tokenizer_dir or ctx.spec.path, options.candidate_rounds)
            except Exception as exc:  # noqa: BLE001 -- timing informs the choice; the record says it failed
                for plan in plans:
                    plan.median_ms = plan.p90_ms = plan.fused_attention = None
                timing = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                ctx.log(f"candidate timing failed ({timing['error']}); choosing untimed")
        chosen, info = select_plan(plans, options.prefer, base, options.loss_tolerance, options.speed_tolerance)
        info["timed"] = plans[0].median_ms is not None
        if timing is not None:
            info["timing"] = timing
        unpruned_ms = (timing or {}).get("unpruned_ms", {}).get("median_ms")
        if info["timed"] and unpruned_ms:
            info["speedup_vs_unpruned"] = round(unpruned_ms / chosen.median_ms, 3)
        info["candidates"] = [candidate_record(p, base, unpruned_ms) for p in plans]
        for entry in info["candidates"]:
            speed = ""
            if "median_ms" in entry:
                speed = f", {entry['median_ms']:.3f} ms ({entry.get('speedup_vs_unpruned', 0):.2f}x)"
            ctx.log(f"candidate: {entry['plan']}: sample loss {entry['sample_loss']:.4f}{speed}"
                    + ("" if entry["qualified"] else " (outside the loss limit)"))
        ctx.log(f"chosen: {chosen.note} -- {info['reason']}")
        return chosen, info


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
