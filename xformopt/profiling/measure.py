"""Profile one ONNX encoder stage: ORT's profiler over real requests, tokenization timed beside it.

A request is what a served model does: tokenize ``batch`` held-out texts with the fast tokenizer,
then one ``session.run``. Two sessions of the same graph answer the same requests, interleaved in a
shuffled order each round: one with ORT's profiler on (its trace gives the kernel times) and one
without (the profiler's own overhead is then the ratio of their medians). Per request, the
end-to-end time splits exactly into tokenization, the kernels (by op type, category, layer), ORT's
own work between kernels, and the Python call with its feed.
"""

from __future__ import annotations

import logging
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from xformopt import progress
from xformopt.errors import InputError, PassFailed
from xformopt.profiling import layers as layer_map
from xformopt.profiling import ops
from xformopt.profiling.peak import gemm_peak
from xformopt.profiling.trace import load_events
from xformopt.profiling.trace import runs as trace_runs
from xformopt.runtime.encoder import OrtPredictor
from xformopt.runtime.session import ort_feed, ort_session

_log = logging.getLogger(__name__)

SCHEMA = "xformopt.profile/1"
NAMED_SHARES = ("gemm", "attention", "layer norm", "tokenization")
COVERAGE_LIMIT = 0.10  # operators + tokenization must come within 10% of the end-to-end median


@dataclass(frozen=True)
class Settings:
    batch: int = 1
    seq: int | None = None  # None: each text at its own length (padded to the batch's longest)
    runs: int = 100
    warmup: int = 10
    threads: int = 1
    seed: int = 0


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def _requests(count: int, rows: int, batch: int, seed: int) -> list[list[int]]:
    order = list(range(rows))
    random.Random(seed).shuffle(order)
    return [[order[(i * batch + j) % rows] for j in range(batch)] for i in range(count)]


def _node_attrs(graph) -> dict[str, dict]:
    from onnx import helper

    return {n.name: {a.name: helper.get_attribute_value(a) for a in n.attribute} for n in graph.node if n.name}


def _weighted_nodes(graph) -> dict[str, bool]:
    """Node name -> whether one of its inputs is a weight (an initializer or a Constant's output)."""
    weights = {i.name for i in graph.initializer}
    weights |= {out for n in graph.node if n.op_type == "Constant" for out in n.output}
    return {n.name: any(x in weights for x in n.input) for n in graph.node if n.name}


def profile_stage(spec, model_dir: Path, texts: Sequence[str], pairs: Sequence[str] | None, settings: Settings,
                  workdir: Path) -> tuple[dict, Path]:
    """Profile ``model_dir/model.onnx`` on ``texts``; returns (the profile document without host
    and peak, the path of ORT's trace file in ``workdir``)."""
    import onnx


    if not texts:
        raise InputError("no texts to profile on; pass --data FILE with a text column")
    plain = OrtPredictor(spec, model_dir, threads=settings.threads)
    tokenizer = plain.tokenizer
    optimized = workdir / "ort_optimized.onnx"
    profiled = ort_session(model_dir / "model.onnx", settings.threads, profile_prefix=str(workdir / "ort_profile"),
                           optimized_path=str(optimized))
    names = plain.input_names
    if settings.seq is not None:
        rank = len(profiled.get_inputs()[0].shape or [])
        if rank != 2:
            raise InputError(f"--seq needs a graph with [batch, tokens] inputs; this one's first input has rank {rank} "
                             "(multiple choice); profile it at real lengths (drop --seq)")
        plain.max_length = min(plain.max_length, settings.seq)
    requests = _requests(settings.warmup + settings.runs, len(texts), settings.batch, settings.seed)
    fixed_feeds = None
    if settings.seq is not None:
        from xformopt.measure.modes import exact_length_inputs

        fixed_feeds = [ort_feed(exact_length_inputs(tokenizer, [texts[i] for i in idx], len(idx), settings.seq), names)
                       for idx in requests]
    sessions = {"on": profiled, "off": plain.session}
    samples: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}  # (tokenization s, end-to-end s)
    rng = random.Random(settings.seed)
    _log.info(f"profiling {settings.runs} requests (batch {settings.batch}, "
        f"{'exact length ' + str(settings.seq) if settings.seq else 'real lengths'}, {settings.threads} threads; "
        f"{settings.warmup} warm-up), interleaved with the same requests unprofiled")
    step = progress.tracker("profiling (requests)")
    for r, idx in enumerate(requests):
        batch_texts = [texts[i] for i in idx]
        batch_pairs = [pairs[i] for i in idx] if pairs is not None else None
        order = ["on", "off"]
        rng.shuffle(order)
        for which in order:
            t0 = time.perf_counter()
            encoded = plain.tokenize(batch_texts, batch_pairs)
            t1 = time.perf_counter()
            feed = fixed_feeds[r] if fixed_feeds is not None else ort_feed(encoded, names)
            sessions[which].run(None, feed)
            t2 = time.perf_counter()
            if r >= settings.warmup:
                samples[which].append((t1 - t0, t2 - t0))
        step(r + 1, len(requests))
    trace_path = Path(profiled.end_profiling())
    found = trace_runs(load_events(trace_path))
    if len(found) != len(requests):
        raise PassFailed(f"ORT's trace holds {len(found)} runs, {len(requests)} were made; the profile cannot be "
                         "matched to the requests")
    timed = found[settings.warmup:]
    graph = onnx.load(str(optimized), load_external_data=False).graph if optimized.is_file() else None
    doc = summarize(timed, samples, settings, graph, rows=len(texts))
    return doc, trace_path


class _KernelTotals:
    """The trace runs' kernel times summed by operator, layer, node and GEMM kind (microseconds, all runs)."""

    def __init__(self):
        self.by_op: dict[tuple[str, str], dict] = defaultdict(lambda: {"us": 0.0, "calls": 0, "flops": 0.0, "flops_us": 0.0})
        self.by_layer: dict[str, float] = defaultdict(float)
        self.by_node: dict[tuple[str, str], float] = defaultdict(float)
        self.gemm: dict[str, dict] = defaultdict(lambda: {"flops": 0.0, "us": 0.0})
        self.unmapped = 0


def _kernel_totals(timed, graph) -> _KernelTotals:
    """Sum every kernel of every timed run into :class:`_KernelTotals` (with its FLOPs where it is a GEMM)."""
    layers = layer_map.node_layers(graph) if graph is not None else {}
    attrs = _node_attrs(graph) if graph is not None else {}
    weighted = _weighted_nodes(graph) if graph is not None else {}
    totals = _KernelTotals()
    for run in timed:
        for k in run.kernels:
            kind = ops.kernel_category(k.op_type, weighted.get(k.node), k.input_shapes)
            entry = totals.by_op[(k.op_type, kind)]
            entry["us"] += k.dur_us
            entry["calls"] += 1
            label = layers.get(k.node)
            if label is None:
                number = layer_map.layer_number(k.node)
                label = f"layer {number}" if number is not None else "unmapped"
                totals.unmapped += label == "unmapped"
            totals.by_layer[label] += k.dur_us
            totals.by_node[(k.node, k.op_type)] += k.dur_us
            precision = ops.precision(k.op_type, k.input_dtypes)
            work = ops.flops(k.op_type, k.input_shapes, k.output_shapes, attrs.get(k.node)) if precision else None
            if work is not None:
                entry["flops"] += work
                entry["flops_us"] += k.dur_us
                row = "attention" if kind == "attention" else precision
                totals.gemm[row]["flops"] += work
                totals.gemm[row]["us"] += k.dur_us
    return totals


def _breakdown(totals: _KernelTotals, per_request, tok_ms: float, kernels_ms: float, ort_ms: float,
               mean_e2e_ms: float) -> list[dict]:
    """The mean request split into operator categories, tokenization and the runtime between, slowest first."""
    categories: dict[str, float] = defaultdict(float)
    for (_, kind), entry in totals.by_op.items():
        categories[kind] += entry["us"]
    between_ms = ort_ms - kernels_ms
    call_ms = mean_e2e_ms - tok_ms - ort_ms
    breakdown = [{"part": name, "kind": "operators", "ms": per_request(us)} for name, us in categories.items()]
    breakdown += [{"part": "tokenization", "kind": "tokenizer", "ms": tok_ms},
                  {"part": "ORT between kernels", "kind": "runtime", "ms": between_ms},
                  {"part": "Python call and feed", "kind": "runtime", "ms": call_ms}]
    for row in breakdown:
        row["share"] = row["ms"] / mean_e2e_ms if mean_e2e_ms > 0 else 0.0
    breakdown.sort(key=lambda row: -row["ms"])
    return breakdown


def _totals_rows(totals: _KernelTotals, per_request, n: int, mean_e2e_ms: float) -> dict:
    """The document's per-operator, per-layer, per-GEMM-kind and slowest-node tables."""
    op_rows = [{
        "op_type": op_type, "category": kind, "ms": per_request(entry["us"]),
        "calls_per_request": entry["calls"] / n, "share": per_request(entry["us"]) / mean_e2e_ms,
        "gflops_per_s": (entry["flops"] / (entry["flops_us"] * 1e3)) if entry["flops_us"] else None,
    } for (op_type, kind), entry in totals.by_op.items()]
    op_rows.sort(key=lambda row: -row["ms"])
    return {
        "op_types": op_rows,
        "layers": [{"layer": label, "ms": per_request(us), "share": per_request(us) / mean_e2e_ms}
                   for label, us in sorted(totals.by_layer.items(), key=lambda item: layer_map.sort_key(item[0]))],
        "gemm_throughput": [{"kind": kind, "ms": per_request(v["us"]), "gflop_per_request": v["flops"] / n / 1e9,
                             "gflops_per_s": v["flops"] / (v["us"] * 1e3) if v["us"] else None}
                            for kind, v in sorted(totals.gemm.items())],
        "top_nodes": [{"node": node, "op_type": op, "ms": per_request(us)}
                      for (node, op), us in sorted(totals.by_node.items(), key=lambda item: -item[1])[:10]],
    }


def summarize(timed, samples: dict, settings: Settings, graph, rows: int) -> dict:
    """The profile document from the timed trace runs and the request timings (seconds)."""
    n = len(timed)
    totals = _kernel_totals(timed, graph)
    tok_on = [t for t, _ in samples["on"]]
    e2e_on = [e for _, e in samples["on"]]
    e2e_off = [e for _, e in samples["off"]]
    kernel_us = [r.kernel_us for r in timed]
    ort_us = [r.dur_us for r in timed]
    mean_e2e_ms = 1e3 * sum(e2e_on) / n

    def per_request(us: float) -> float:  # total microseconds -> ms per request
        return us / n / 1e3

    tok_ms = 1e3 * sum(tok_on) / n
    breakdown = _breakdown(totals, per_request, tok_ms, per_request(sum(kernel_us)), per_request(sum(ort_us)),
                           mean_e2e_ms)
    shares = {name: next((row["share"] for row in breakdown if row["part"] == name), 0.0) for name in NAMED_SHARES}
    accounted = [1e3 * t + k / 1e3 for t, k in zip(tok_on, kernel_us)]
    median_on, median_off = 1e3 * _median(e2e_on), 1e3 * _median(e2e_off)
    coverage = _median(accounted) / median_on if median_on > 0 else 0.0
    tables = _totals_rows(totals, per_request, n, mean_e2e_ms)
    return {
        "schema": SCHEMA,
        "settings": {**asdict(settings), "rows": rows,
                     "inputs": f"exact length {settings.seq}" if settings.seq else "real held-out lengths"},
        "end_to_end": {
            "median_ms": median_on, "mean_ms": mean_e2e_ms, "median_ms_profiling_off": median_off,
            "profiling_overhead": (median_on / median_off - 1) if median_off > 0 else None,
        },
        "accounted": {
            "operators_median_ms": _median(kernel_us) / 1e3,
            "tokenization_median_ms": 1e3 * _median(tok_on),
            "operators_plus_tokenization_median_ms": _median(accounted),
            "share_of_end_to_end_median": coverage,
            # The same within each request (robust when a busy host makes the timings bimodal).
            "median_share_per_request": _median([a / (1e3 * e) for a, e in zip(accounted, e2e_on) if e > 0]),
            "within_limit": abs(coverage - 1) <= COVERAGE_LIMIT,
            "limit": COVERAGE_LIMIT,
            "ort_run_median_ms": _median(ort_us) / 1e3,
            "operators_share_of_ort_run": (sum(kernel_us) / sum(ort_us)) if sum(ort_us) else None,
        },
        "shares": shares,
        "breakdown": breakdown,
        **tables,
        "kernel_calls_unmapped_to_a_layer": totals.unmapped,
    }


def add_peak(doc: dict, threads: int, *, remeasure: bool = False) -> dict:
    """The host's GEMM peak into ``doc``; a cached peak that this profile's GEMMs beat was measured
    on a busier host, so it is measured again (once) before comparing."""

    attach_peak(doc, gemm_peak(threads, remeasure=remeasure))
    if not remeasure and any((row.get("fraction_of_peak") or 0) > 1 for row in doc["gemm_throughput"]):
        _log.info("this profile's GEMMs ran faster than the cached peak (measured on a busier host); measuring it again")
        attach_peak(doc, gemm_peak(threads, remeasure=True))
    return doc


def attach_peak(doc: dict, peak: dict) -> dict:
    """Each GEMM kind's achieved GFLOP/s as a fraction of this host's measured peak of its precision."""
    doc["gemm_peak"] = peak
    for row in doc["gemm_throughput"]:
        base = {"fp32": peak.get("fp32_gflops"), "int8": peak.get("int8_gflops")}.get(row["kind"])
        if row["kind"] == "attention":
            base = None  # fused attention does softmax besides its GEMMs, in int8 or fp32: no one peak applies
        row["peak_gflops_per_s"] = base
        row["fraction_of_peak"] = (row["gflops_per_s"] / base) if base and row["gflops_per_s"] else None
    return doc


REPORT_RUNS, REPORT_WARMUP = 30, 5


def profile_for_report(stage, heldout, threads: int, seed: int) -> dict | None:
    """A short profile of an ONNX encoder stage for report.json (``profile``), or None where there
    is nothing to profile (a PyTorch stage or a decoder). A profile that fails is logged and
    recorded as ``{"error": ...}``: it informs, it never fails the run."""
    import tempfile

    if stage.kind != "onnx" or "profile" in stage.spec.task_def.refuses:
        return None
    texts, pairs = stage.spec.task_def.timing_inputs(heldout)
    settings = Settings(runs=REPORT_RUNS, warmup=REPORT_WARMUP, threads=threads, seed=seed)
    try:
        with tempfile.TemporaryDirectory(prefix="xformopt-profile-") as work:
            doc, _ = profile_stage(stage.spec, stage.path, texts, pairs, settings, Path(work))
        add_peak(doc, threads)
    except Exception as exc:  # noqa: BLE001 - ORT's profiler, a damaged trace: the artifact is still good
        message = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        _log.info(f"profile of {stage.name} not made: {message}")
        return {"error": message}
    doc["stage"] = stage.name
    return doc
