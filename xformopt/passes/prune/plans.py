"""Plan search for prune: candidate plans that each remove the FLOPs budget (layers dropped least
sensitive first, heads ranked globally, the FFN width solved for the rest), explicit plans, and the
``prefer`` rule that chooses among scored and timed candidates. Pure: no model, no clock."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xformopt.errors import InputError
from xformopt.passes.prune.flops import (
    Shape,
    encoder_flops,
    head_step,
    layer_flops,
    round_multiple,
)

AUTO_TIE = 0.02  # candidates within 2% of the best sample loss prefer fewer layers



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
    fused_attention: int | None = None  # layers whose attention the candidate's ONNX graph fused (all expected)
    qualified: bool | None = None  # set by select_plan: passed the rule's loss filter
    loss_se: float | None = None  # standard error of the paired per-row loss difference to the best candidate
    hidden: list[int] | None = None  # kept residual-stream channels (width pruning, prune/width.py); None: all

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
    return len(plan.keep_layers) == shape0.num_layers and (plan.hidden is None or len(plan.hidden) == shape0.hidden) \
        and all(len(plan.heads[i]) == shape0.heads[i] and len(plan.ffn[i]) == shape0.ffn[i] for i in plan.keep_layers)



def distinct(plans: list[Plan]) -> list[Plan]:
    """``plans`` without repeats (two head fractions can round to the same counts): each is scored and timed once."""
    seen, out = set(), []
    for plan in plans:
        key = (tuple(plan.keep_layers), tuple(tuple(plan.heads[i]) for i in plan.keep_layers), plan.ffn_width,
               tuple(plan.hidden or ()))
        if key not in seen:
            seen.add(key)
            out.append(plan)
    return out



def shape_text(shape: Shape) -> str:
    heads = shape.heads[0] if len(set(shape.heads)) == 1 else "/".join(map(str, shape.heads))
    ffn = shape.ffn[0] if len(set(shape.ffn)) == 1 else "/".join(map(str, shape.ffn))
    return f"{shape.num_layers} layers, {heads} heads per layer, FFN {ffn}, hidden {shape.hidden}"



def check_explicit_prunes(shape0: Shape, options, multiple: int) -> None:
    """Fail before any importance work when explicit targets, clipped to the model and rounded to the
    SIMD multiple, keep the model's shape (e.g. ``layers: 99, ffn_dim: 99999``). The kept counts do
    not depend on the importance scores, so neutral scores decide it."""
    neutral = explicit_plan([np.zeros(h) for h in shape0.heads], [np.zeros(f) for f in shape0.ffn],
                            [0.0] * shape0.num_layers, shape0, options, multiple, np.zeros(shape0.hidden))
    if removes_nothing(neutral, shape0):
        asked = ", ".join(f"{k}={getattr(options, k)}" for k in EXPLICIT_KEYS
                          if getattr(options, k) is not None)
        raise InputError(f"nothing to prune: {asked} keeps the model's whole shape ({shape_text(shape0)}; targets "
                         f"above it are clipped to it); ask for fewer heads/FFN/layers or sparsity > 0")



HEAD_FRACTIONS = (1.0, 0.75, 0.5)  # heads kept (global ranking); the FFN width is solved for the rest



EXPLICIT_KEYS = ("layers", "heads_per_layer", "ffn_dim", "hidden_size")  # the options an explicit plan reads


def explicit_plan(head_scores, ffn_scores, layer_scores, shape0: Shape, options, multiple: int,
                  channel_scores: np.ndarray | None = None) -> Plan:
    """The one plan explicit targets describe. ``hidden_size`` (rounded to a multiple of the head size) keeps
    ``hidden_size / head_size`` heads per layer (prune/width.py says why) and the best ``channel_scores``."""
    n = shape0.num_layers
    keep_n = min(options.layers or n, n)
    keep_layers = sorted(sorted(range(n), key=lambda i: (-layer_scores[i], i))[:keep_n])
    f0 = max(shape0.ffn)
    width = f0 if options.ffn_dim is None else round_multiple(options.ffn_dim, multiple, 1, f0)
    hidden = None
    if getattr(options, "hidden_size", None) is not None:
        d = min(max(shape0.head_dim, round(options.hidden_size / shape0.head_dim) * shape0.head_dim), shape0.hidden)
        order = sorted(range(shape0.hidden), key=lambda c: (-channel_scores[c], c))
        hidden = sorted(order[:d])
        options = options.model_copy(update={"heads_per_layer": d // shape0.head_dim})
    heads = {}
    for i in keep_layers:
        h = shape0.heads[i] if options.heads_per_layer is None else min(options.heads_per_layer, shape0.heads[i])
        if options.heads_per_layer is not None and hidden is None:
            step = head_step(shape0.head_dim, multiple)
            if h >= step and shape0.heads[i] >= step:
                h = max(step, (h // step) * step)  # round down to a SIMD-friendly width where possible
        heads[i] = top(head_scores[i], h)
    return Plan(keep_layers, heads, {i: top(ffn_scores[i], width) for i in keep_layers}, width, note="explicit",
                hidden=hidden)


def shared_head_scores(head_scores: list[np.ndarray]) -> list[np.ndarray]:
    """For a family whose layers share one per-head bias (MPNet): every layer scored by the sum over layers of
    the per-layer-normalised scores, so every ranking keeps the same heads in every layer."""
    shared = sum(s / (np.linalg.norm(s) + 1e-12) for s in head_scores)
    return [shared.copy() for _ in head_scores]


def uniform_heads(plan: Plan, shared: np.ndarray) -> Plan:
    """``plan`` with the same heads in every kept layer: the mean count (rounded, at least one) of the best
    ``shared`` scores (:func:`shared_head_scores`), for a family whose layers share one per-head bias."""
    k = max(1, round(plan.kept_heads / len(plan.keep_layers)))
    for i in plan.keep_layers:
        plan.heads[i] = top(shared, k)
    return plan



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

