"""prune's two timings, both through :class:`~xformopt.passes.candidates.CandidateGraphs` (export, fuse
select=all, time interleaved at batch 1): every candidate plan against the unpruned model, to choose
(``time_plans``), and the saved checkpoint against the unpruned one, for the record (``measure_onnx_latency``).
The method is explained in ``xformopt.passes.prune.run``'s docstring."""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path

from xformopt import progress
from xformopt.measure.host import host_info
from xformopt.passes.base import PassContext
from xformopt.passes.candidates import CandidateGraphs
from xformopt.passes.fuse.run import reached
from xformopt.passes.prune.plans import Plan
from xformopt.passes.surgery import Arch, apply_plan
from xformopt.passes.timing import TIMED_TEXTS


def measure_onnx_latency(ctx: PassContext, original: Path, pruned: Path, rounds: int) -> dict:
    """Export and fully fuse both models with xformopt's own passes, then time them interleaved at
    batch 1 over real held-out texts (tokenization included)."""
    out = {}
    with CandidateGraphs(ctx, "xformopt-prune-") as graphs:
        for name, src in (("unpruned", original), ("pruned", pruned)):
            ctx.log(f"exporting and fusing the {name} model for timing")
            record = graphs.add_checkpoint(name, src)
            out[f"{name}_fused"] = {k: v for k, v in record["fused_kept"].items() if v}
            out[f"{name}_expected"] = record["expected"]
        texts, pairs = ctx.spec.task_def.timing_inputs(ctx.sample_data)  # text pairs timed as pairs
        ctx.log(f"timing pruned vs unpruned ONNX interleaved ({rounds} rounds, batch 1)")
        stats = graphs.time_real(texts[:200], rounds, pairs[:200] if pairs else None)
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


def time_plans(ctx: PassContext, model, arch: Arch, plans: list[Plan], tokenizer_dir: Path, rounds: int) -> dict:
    """Export (in memory, no parity check) and fully fuse the unpruned model and every candidate
    (masks are numerically the same, but only a really smaller model is faster), then time them interleaved
    at batch 1 on up to 64 real held-out texts (``passes.timing.time_stage_dirs``: the same ORT session
    settings as every other timing). Sets each plan's ``median_ms``, ``p90_ms`` and ``fused_attention``;
    returns the unpruned model's figures and how they were measured."""
    started = time.perf_counter()
    fused: dict[str, int] = {}
    with CandidateGraphs(ctx, "xformopt-prune-candidates-") as graphs:
        for n, (key, plan) in enumerate([("unpruned", None), *((f"candidate{i}", p) for i, p in enumerate(plans))]):
            progress.report("prune: exporting candidates", n, len(plans) + 1)
            candidate = copy.deepcopy(model)
            if plan is not None:
                apply_plan(candidate, arch, plan)
            candidate.eval()
            fused[key] = reached(graphs.add_model(key, candidate, pruned=plan is not None), "Attention")
            layers = len(plan.keep_layers) if plan else len(arch.layers(model))
            if fused[key] < layers:  # timed as it is, but say so: an unfused graph is slower for another reason
                ctx.log(f"{plan.note if plan else 'unpruned'}: only {fused[key]}/{layers} attention layers fused")
            del candidate
        progress.report("prune: exporting candidates", len(plans) + 1, len(plans) + 1)
        ctx.log(f"timing the unpruned model and {len(plans)} candidates interleaved ({rounds} rounds, batch 1)")
        stats = graphs.time_encoded(rounds, tokenizer_dir=tokenizer_dir)
    for i, plan in enumerate(plans):
        s = stats[f"candidate{i}"]
        plan.median_ms, plan.p90_ms = round(s["median_ms"], 4), round(s["p90_ms"], 4)
        plan.fused_attention = fused[f"candidate{i}"]
    host = host_info()
    return {
        "what": "ONNX fp32 (export in memory, no parity check; ORT fusions select=all), batch 1, "
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
