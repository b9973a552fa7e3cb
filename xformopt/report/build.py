"""The report document: one row per stage, the PyTorch fp32 baseline first, deltas against it.

``REPORT_SCHEMA`` is versioned: a field is never renamed or removed within a version, so CI jobs
that read report.json with jq keep working. The document's type is ``report/types.py``'s ``Report``
(the pipeline holds every report it writes to it).
"""

from __future__ import annotations

from datetime import datetime, timezone

from xformopt.measure.host import host_fingerprint
from xformopt.measure.memory import process_peak_mb
from xformopt.report.schema import REPORT_SCHEMA
from xformopt.report.types import MemorySummary, Report, StageRow
from xformopt.runtime.session import thread_pool_setting


def build_report(spec, target, stages, evaluation: dict, host: dict, recipe, target_on_host: bool, threads: int, heldout) -> Report:
    per_stage = evaluation["stages"]
    base = per_stage[stages[0].name]["metrics"]
    metric = spec.task_def.report_headline(base)
    rows: list[StageRow] = []
    facts: dict = {}
    for stage in stages:
        ev = per_stage[stage.name]
        facts.update(stage.record.report_facts() if stage.record else {})  # a stage inherits what earlier passes did
        deltas = {
            name: m["value"] - base[name]["value"] for name, m in ev["metrics"].items() if name in base
        }
        rows.append({
            "name": stage.name,
            "kind": "pytorch" if stage.kind == "hf" else "onnx",
            "size_bytes": ev["size_bytes"],
            "metrics": ev["metrics"],
            "delta_to_baseline": deltas,
            "latency": ev["latency"],
            "speedup": ev["speedup"],
            **({"graph": dict(facts)} if stage.kind == "onnx" else {}),
            "memory": {**({"pass": stage.record.memory} if stage.record and stage.record.memory else {}),
                       **ev.get("memory", {})},
            **({"outputs_read_from_disk": True} if ev.get("outputs_read_from_disk") else {}),
        })
    return {
        "schema": REPORT_SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": {"source": spec.source, "model_type": spec.model_type, "task": spec.task},
        "target": target.name,
        "target_on_host": target_on_host,
        "headline_metric": metric,
        "settings": {
            "mode": "real",
            "batch": 1,
            "threads": threads,
            "heldout": {"path": heldout.path, "source": heldout.source, "rows": len(heldout)},
            "rounds": recipe.evaluation.latency_rounds,
            "warmup": recipe.evaluation.warmup,
            "repeats": recipe.evaluation.repeats,
            "seed": recipe.evaluation.seed,
            "thread_pools": thread_pool_setting(),
        },
        "host": host,
        "host_fingerprint": host_fingerprint(host),
        "stages": rows,
        "artifact": evaluation["artifact"],
        "memory": memory_summary(stages, evaluation),
        **{k: evaluation[k] for k in ("fixed", "throughput", "model_call", "generation") if k in evaluation},
    }


def memory_summary(stages, evaluation: dict) -> MemorySummary:
    """The run's peak resident memory and where it was reached (xformopt/measure/memory.py): each pass,
    the evaluation of all stages together (``evaluation["memory"]``, set by the pipeline)."""

    blocks = {stage.name: stage.record.memory for stage in stages if stage.record and stage.record.memory}
    if evaluation.get("memory"):
        blocks["evaluation"] = evaluation["memory"]
    peak_in = max(blocks, key=lambda name: blocks[name]["peak_rss_mb"]) if blocks else None
    return {
        # The process's lifetime peak: what `/usr/bin/time -v` reports (the kernel's counters are per-CPU
        # approximations, so a sampled block may exceed it by a page or two).
        "peak_rss_mb": max([process_peak_mb(), *(m["peak_rss_mb"] for m in blocks.values())]),
        "peak_in": peak_in,
        "passes": {name: m["peak_rss_mb"] for name, m in blocks.items() if name != "evaluation"},
        "evaluation": evaluation.get("memory"),
    }
