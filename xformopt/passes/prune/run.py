"""prune: structured pruning (attention heads, FFN neurons, whole layers) that becomes real CPU speed.

Why structured: ``torch.nn.utils.prune`` zeroes individual weights (unstructured sparsity) behind a
mask; the dense GEMMs ONNX Runtime runs on CPU do exactly the same work on a matrix full of zeros,
so it buys no latency. This pass removes whole rows and columns instead: the saved checkpoint has
smaller matrices (and fewer layers), so every later stage -- export, fuse, INT8 -- is smaller too.

What is removed, and how it stays a stock checkpoint:

- attention heads: rows of the q/k/v projections and columns of the output projection
  (``xformopt.models.pruned_heads``, since transformers 5 dropped its ``prune_heads``); the removed heads are
  recorded in ``config.pruned_heads`` as transformers 4 wrote them, and xformopt's loader re-applies
  them before loading the weights (checked in tests in a fresh process). Heads may differ per layer.
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
  memory (no parity check) and fully fused, and all of them and the unpruned model are
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

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from xformopt.artifact import copy_side_files, hash_dir
from xformopt.data import load_text_dataset
from xformopt.errors import InputError, PassFailed
from xformopt.models import ModelSpec, load_tokenizer, load_torch_model, pruned_heads
from xformopt.passes.base import Pass, PassContext, PassOptions
from xformopt.passes.prune import importance_cache
from xformopt.passes.prune import width as width_prune
from xformopt.passes.prune.flops import Shape, encoder_flops
from xformopt.passes.prune.importance import (
    Batches,
    layer_sensitivity,
    magnitude_importance,
    make_batches,
    quality,
    reference_embeddings,
    score_plans,
    taylor_importance,
)
from xformopt.passes.prune.plans import (
    EXPLICIT_KEYS,
    HEAD_FRACTIONS,
    Plan,
    candidate_plans,
    candidate_record,
    check_explicit_prunes,
    distinct,
    explicit_plan,
    removes_nothing,
    select_plan,
    shape_text,
    shared_head_scores,
    uniform_heads,
)
from xformopt.passes.prune.relative import FRACTIONS, fraction_text
from xformopt.passes.prune.relative import resolve as resolve_fractions
from xformopt.passes.prune.timing import measure_onnx_latency, time_plans
from xformopt.passes.records import PruneRecord
from xformopt.passes.surgery import (
    Arch,
    apply_plan,
    arch_for,
    current_shape,
    weights_sha256,
)
from xformopt.resources import vader_split_path


class PruneOptions(PassOptions):
    sparsity: float | None = Field(
        None, gt=0.0, le=0.9, description="fraction of encoder FLOPs (at reference_length) to remove (> 0)"
    )
    heads_per_layer: int | None = Field(None, ge=1, description="explicit: attention heads kept in every layer")
    ffn_dim: int | None = Field(None, ge=1, description="explicit: FFN width kept in every layer")
    layers: int | None = Field(None, ge=1, description="explicit: number of encoder layers kept")
    hidden_size: int | None = Field(
        None, ge=1, description="explicit: hidden size (residual stream) kept, a multiple of the head size; the heads "
                                "kept per layer are hidden_size / head size (xformopt/passes/prune/width.py)")
    layers_fraction: float | None = Field(None, gt=0, le=1, description="relative: fraction of the layers kept")
    heads_fraction: float | None = Field(None, gt=0, le=1, description="relative: fraction of the heads kept per layer")
    ffn_fraction: float | None = Field(None, gt=0, le=1, description="relative: fraction of the FFN width kept")
    hidden_fraction: float | None = Field(None, gt=0, le=1, description="relative: fraction of the hidden size kept")
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
    batch_size: int = Field(16, ge=1, description="rows per importance and evaluation batch")
    max_length: int = Field(128, ge=8, description="truncate importance and evaluation inputs to this many tokens")
    reference_length: int = Field(128, ge=1, description="sequence length the FLOPs target is counted at")
    seed: int = Field(0, description="seed for the samples and probes")
    measure_latency: bool = Field(True, description="export + fuse both models and time them interleaved")
    latency_rounds: int = Field(300, ge=3, description="interleaved rounds timing pruned vs unpruned ONNX")

    @model_validator(mode="after")
    def _one_target(self):
        explicit = [getattr(self, k) for k in (*EXPLICIT_KEYS, *FRACTIONS)]
        if self.sparsity is None and all(v is None for v in explicit):
            raise ValueError("give a target: sparsity (e.g. 0.5), or heads_per_layer / ffn_dim / layers / hidden_size "
                             "(or their *_fraction)")
        if self.sparsity is not None and any(v is not None for v in explicit):
            raise ValueError("sparsity and explicit heads_per_layer/ffn_dim/layers/hidden_size (or fractions) are "
                             "exclusive; give one kind")
        return self


def load_sets(ctx: PassContext, options: PruneOptions, labelled: bool):
    """(importance sample, held-out sample). Default: the vendored train split for importance and the
    vendored test split held out; with ``data``: two disjoint seeded parts of that file."""
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


# --------------------------------------------------------------------------- the pass


def shape_record(shape: Shape, ref_len: int, mean_len: float) -> dict:
    return {
        "hidden_size": shape.hidden,
        "layers": shape.num_layers,
        "heads_per_layer": shape.heads,
        "ffn_per_layer": shape.ffn,
        "flops_at_reference": encoder_flops(shape, ref_len),
        "flops_at_sample_mean_length": encoder_flops(shape, mean_len),
    }


# --------------------------------------------------------------------------- the pass's steps


@dataclass
class PruneInputs:
    """What the pass's steps share: the unpruned model (pruned in place at the end), the importance and
    held-out samples batched with their reference outputs, and the shape and size the model started with."""

    arch: Arch
    model: Any
    objective: str
    labelled: bool
    imp_set: Any
    held_set: Any
    imp_b: Batches
    held_b: Batches
    imp_ref: Any
    held_ref: Any
    mean_len: float
    shape0: Shape
    params0: int
    multiple: int
    options: PruneOptions  # as given, fractions turned into the absolute targets they mean for this model
    model_hash: str = ""   # content hash of the model folder (Taylor only: the importance cache's key)


@dataclass
class Importance:
    """Per-head, per-neuron and per-layer scores, and how they were obtained (the record's ``importance``)."""

    head_scores: list
    ffn_scores: list
    layer_scores: list
    method: dict
    channel_scores: Any = None  # per hidden channel (width pruning only)


def load_inputs(ctx: PassContext, src: Path, options: PruneOptions) -> PruneInputs:
    """Refuse what cannot be pruned, then load the model, the tokenizer and both samples."""
    import torch

    arch = arch_for(ctx.spec.model_type)
    if options.heads_per_layer is not None and not arch.layout.head_pruning:
        raise InputError(f"{ctx.spec.model_type} attention heads cannot be pruned (its heads share one "
                         "position bias); drop heads_per_layer and prune ffn_dim or layers")
    objective = ctx.spec.task_def.torch_objective
    torch.manual_seed(options.seed)
    model = load_torch_model(ctx.spec, src)
    model.requires_grad_(False)
    if options.sparsity is None:
        shape = current_shape(model, arch)
        options = resolve_fractions(options, shape)
        width_prune.check_width_target(options.hidden_size, options.heads_per_layer, shape.head_dim)
        if options.hidden_size is not None and objective != "logits":
            raise InputError("hidden_size/hidden_fraction: width pruning narrows the embedding itself (its dimension "
                             "is the hidden size), so an index built with the teacher's vectors no longer fits; it is "
                             "offered for classifiers. Prune layers, heads or FFN width of an embedding model")
        check_explicit_prunes(shape, options, ctx.target.simd_multiple)
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
    return PruneInputs(arch, model, objective, labelled, imp_set, held_set, imp_b, held_b, imp_ref, held_ref,
                       mean_len, current_shape(model, arch), sum(p.numel() for p in model.parameters()),
                       ctx.target.simd_multiple, options, hash_dir(src) if options.importance == "taylor" else "")


def taylor_scores(ctx: PassContext, inputs: PruneInputs, options: PruneOptions) -> tuple[list, list, list, bool]:
    """Head, FFN and layer-drop scores from the disk cache when this model and sample were scored before
    (a shape search's later trials), else measured and kept there; the flag says which."""
    entry = importance_cache.key(inputs.model_hash, inputs.objective, inputs.imp_b, options.seed)
    cached = importance_cache.load(entry)
    if cached is not None:
        ctx.log(f"head, FFN and layer-drop scores reused from {importance_cache.folder() / entry}.npz "
                "(same model, sample and seed)")
        return (*cached, True)
    ctx.log("scoring heads and FFN neurons (Taylor: |d loss / d mask|)")
    heads, ffn = taylor_importance(inputs.model, inputs.arch, inputs.imp_b, inputs.objective, options.seed)
    ctx.log("measuring layer-drop sensitivity")
    layers = layer_sensitivity(inputs.model, inputs.arch, inputs.imp_b, inputs.objective, inputs.imp_ref)
    try:
        importance_cache.save(entry, heads, ffn, layers)
    except OSError as exc:  # a read-only cache only costs the next trial the scoring
        ctx.log(f"importance scores not kept on disk ({exc})")
    return heads, ffn, layers, False


def score_importance(ctx: PassContext, inputs: PruneInputs, options: PruneOptions) -> Importance:
    """Taylor (data) or magnitude (data-free) scores for every head, FFN neuron and layer."""
    model, arch, labelled = inputs.model, inputs.arch, inputs.labelled
    if options.importance == "taylor":
        head_scores, ffn_scores, layer_scores, reused = taylor_scores(ctx, inputs, options)
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
        method.update({"samples": len(inputs.imp_set), "source": inputs.imp_set.source, "seed": options.seed,
                       "reused_from_disk": reused})
    else:
        head_scores, ffn_scores, layer_scores = magnitude_importance(model, arch)
        method = {
            "method": "magnitude",
            "note": "data-free fallback: weight norms, no data used for importance "
                    "(heads |W_v|x|W_o|, neurons |W_in|x|W_out|, layers |output projections|)",
        }
        method.update({"samples": 0, "candidate_choice": "rule (no data): fewest layers dropped, most heads kept"})
    if arch.layout.shared_head_bias:  # one per-head bias shared by every layer: the same heads everywhere
        head_scores = shared_head_scores(head_scores)
        method["heads_shared"] = "one ranking for every layer (sum of per-layer-normalised scores): the layers share " \
                                 "one per-head position bias"
    channels = None
    if options.hidden_size is not None:
        if options.importance == "taylor":
            channels = width_prune.channel_importance(model, arch, inputs.imp_b)
            method["hidden"] = "mean |LayerNorm output| per channel over real tokens, summed over the residual norms (Minitron)"
        else:
            channels = width_prune.magnitude_channels(model, arch)
            method["hidden"] = "sum of |LayerNorm weight| per channel over the residual norms (data-free)"
    return Importance(head_scores, ffn_scores, layer_scores, method, channels)


def make_plans(inputs: PruneInputs, importance: Importance, options: PruneOptions) -> list[Plan]:
    """The candidate plans for a sparsity target, or the one plan the explicit targets describe."""
    shape0, multiple = inputs.shape0, inputs.multiple
    scores = (importance.head_scores, importance.ffn_scores, importance.layer_scores)
    if options.sparsity is not None:
        plans = candidate_plans(*scores, shape0, options.sparsity, options.strategy, multiple,
                                options.reference_length,
                                HEAD_FRACTIONS if inputs.arch.layout.head_pruning else (1.0,))
        # A small sparsity can round back to the full shape (the FFN width is a SIMD multiple, and
        # 5% of the target is tolerated): such a candidate removes nothing and is not a prune.
        if inputs.arch.layout.shared_head_bias:
            plans = [uniform_heads(p, importance.head_scores[0]) for p in plans]
        plans = distinct([p for p in plans if not removes_nothing(p, shape0)])
        if not plans:
            raise InputError(f"nothing to prune: sparsity {options.sparsity} rounds back to the model's whole shape "
                             f"({shape_text(shape0)}; FFN widths are multiples of {multiple}); ask for fewer "
                             f"heads/FFN/layers or a larger sparsity")
        return plans
    plans = [explicit_plan(*scores, shape0, options, multiple, importance.channel_scores)]
    if removes_nothing(plans[0], shape0):  # check_explicit_prunes already refused this; kept as a guard
        raise InputError(f"nothing to prune: the explicit targets keep the model's whole shape "
                         f"({shape_text(shape0)}); ask for fewer heads/FFN/layers or sparsity > 0")
    return plans


def most_structure(plans: list[Plan]) -> tuple[Plan, dict]:
    """Data-free: no sample loss to weigh speed against; the allocation that keeps the most structure."""
    plan = min(plans, key=lambda p: (-len(p.keep_layers), -p.kept_heads))
    return plan, {"prefer": None, "timed": False,
                  "reason": "magnitude importance (no data): no layer dropped if possible, the most heads kept"}


def prune_model(inputs: PruneInputs, plan: Plan) -> tuple[tuple[dict, dict], Shape]:
    """Apply ``plan`` (in place; a narrower hidden size makes a new model, ``inputs.model``); the held-out quality
    (unpruned, pruned) and the new shape."""
    model = inputs.model
    before_quality = quality(model, inputs.held_b, inputs.objective, inputs.held_ref)
    apply_plan(model, inputs.arch, plan)
    if plan.hidden is not None and len(plan.hidden) < inputs.shape0.hidden:
        model = inputs.model = width_prune.shrink_hidden(model, inputs.arch, plan.hidden)
    model.eval()
    after_quality = quality(model, inputs.held_b, inputs.objective, inputs.held_ref)
    shape1 = current_shape(model, inputs.arch)
    if shape1.num_layers == 0 or min(shape1.heads) == 0:
        raise PassFailed("pruning would leave a layer without attention heads")
    return (before_quality, after_quality), shape1


def prune_record(inputs: PruneInputs, options: PruneOptions, importance: Importance, plan: Plan, selection: dict,
                 qualities: tuple[dict, dict], shape1: Shape) -> dict:
    """The pass's record (docs/report-schema.md), from the pruned model still in memory."""
    model, shape0, mean_len, ref_len = inputs.model, inputs.shape0, inputs.mean_len, options.reference_length
    removed_layers = [i for i in range(shape0.num_layers) if i not in plan.keep_layers]
    f_ref0 = encoder_flops(shape0, ref_len)["total"]
    f_ref1 = encoder_flops(shape1, ref_len)["total"]
    f_mean0 = encoder_flops(shape0, mean_len)["total"]
    f_mean1 = encoder_flops(shape1, mean_len)["total"]
    return {
        "flops_formula": "per layer, a = heads x head_dim: 8*L*d*a (Q,K,V,out projections) + 4*L^2*a "
                         "(scores, context) + 4*L*d*f (FFN); multiply-add = 2 FLOPs; encoder layers only",
        "reference_length": ref_len,
        "sample_mean_length": round(mean_len, 2),
        "target": {"sparsity": options.sparsity} if options.sparsity is not None else {
            k: getattr(inputs.options, k) for k in EXPLICIT_KEYS if getattr(inputs.options, k) is not None}
        | fraction_text(options),
        "strategy": options.strategy if options.sparsity else "explicit",
        "simd_multiple": inputs.multiple,
        "sparsity_achieved": {"at_reference": round(1 - f_ref1 / f_ref0, 4),
                              "at_sample_mean_length": round(1 - f_mean1 / f_mean0, 4)},
        "before": shape_record(shape0, ref_len, mean_len),
        "after": shape_record(shape1, ref_len, mean_len),
        "params": {"before": int(inputs.params0), "after": int(sum(p.numel() for p in model.parameters()))},
        "removed_layers": removed_layers,
        "kept_layers": plan.keep_layers,
        "pruned_heads": {str(k): v for k, v in pruned_heads.recorded(model.config).items()},
        "importance": importance.method,
        "candidates": selection.pop("candidates", []),
        "chosen": plan.note,
        "selection": selection,
        "quality_before_recovery": {"unpruned": qualities[0], "pruned": qualities[1],
                                    "heldout": inputs.held_set.source},
        "weights_sha256": weights_sha256(model),
    }


class PrunePass(Pass):
    name = "prune"
    stage = "torch"
    consumes = "hf"
    produces = "hf"
    Options = PruneOptions
    Record = PruneRecord
    summary = ("structured pruning (heads, FFN neurons, layers) from data-driven importance; an HF checkpoint "
               "(pruned heads in config.pruned_heads)")
    needs = ("importance data (default: vendored train split)", "held-out texts (timing)")
    flags = {"train_data": "data"}
    data_options = ("data",)
    shape_options = ("layers", "heads_per_layer", "ffn_dim", "hidden_size", *FRACTIONS)
    shape_replaces = ("sparsity",)
    labelled_fallbacks = {"data": ("train/test", "prune's importance and held-out rows")}

    @classmethod
    def check_own(cls, spec: ModelSpec, options: dict) -> None:
        arch_for(spec.model_type)  # a family whose modules prune does not know: refused before any work

    @staticmethod
    def summarize(rec: dict) -> str:
        """One line: what the pass changed and how it was verified."""
        s, q = rec["sparsity_achieved"], rec["quality_before_recovery"]
        metric = "accuracy" if "accuracy" in q["pruned"] else "cosine_to_unpruned"
        before = q["unpruned"].get(metric, 1.0)
        line = (f"{rec['before']['layers']}->{rec['after']['layers']} layers, heads {rec['after']['heads_per_layer']}, "
                f"FFN {rec['after']['ffn_per_layer'][0]}"
                + (f", hidden {rec['before']['hidden_size']}->{rec['after']['hidden_size']}"
                   if rec["before"].get("hidden_size") != rec["after"].get("hidden_size") else "")
                + f"; FLOPs -{s['at_reference']:.0%} at {rec['reference_length']} tokens, "
                f"params {rec['params']['before']:,}->{rec['params']['after']:,}; {metric} {before:.4f}->{q['pruned'][metric]:.4f} "
                f"(before recovery, {rec['importance']['method']} importance)")
        if "latency" in rec:
            lat = rec["latency"]
            line += (f"; ONNX fused batch 1: {lat['unpruned_ms']['median_ms']:.2f} -> {lat['pruned_ms']['median_ms']:.2f} ms "
                     f"({lat['speedup_median']:.2f}x, {lat['measured_on']})")
        return line

    def run(self, ctx: PassContext, src: Path, dst: Path, options: PruneOptions) -> PruneRecord:
        given = options
        inputs = load_inputs(ctx, src, options)
        options = inputs.options
        importance = score_importance(ctx, inputs, options)
        plans = make_plans(inputs, importance, options)
        if options.importance == "taylor":
            plan, selection = self.choose(inputs.model, inputs.arch, plans, inputs.imp_b, inputs.objective,
                                          inputs.imp_ref, ctx, options, src)
        else:
            plan, selection = most_structure(plans)
        qualities, shape1 = prune_model(inputs, plan)
        inputs.model.save_pretrained(dst)
        copy_side_files(src, dst)  # tokenizer and any other non-weight files
        record = prune_record(inputs, given, importance, plan, selection, qualities, shape1)
        inputs.model = None  # the only reference: freed before the latency check exports two more models
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
                # time_plans by this module's name (imported from prune.timing): tests replace it here
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

