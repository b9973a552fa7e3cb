"""fuse and quantize for encoder-decoder stages (two graphs, xformopt/seq2seq/), called by those
passes through their graph-kind tables; each record has the keys the pass's summary and the report read.

- fuse: onnxscript's ORT fusion rewriter on both graphs (the dynamo graphs' attention, self and cross,
  fuses only there), verified against the unfused graphs (logits of the first and cached steps), and
  kept only where it is not slower: both variants generate the sample sentences, interleaved.
- quantize: ONNX Runtime's dynamic INT8 on both graphs with the target's formats; verified by next-token
  agreement with the float graphs; with ``max_accuracy_drop``, the task metric (BLEU, ROUGE) on labelled
  rows holds it, trying INT8 in both graphs, then the encoder graph alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from xformopt import accuracy_budget
from xformopt.artifact import copy_stage
from xformopt.errors import PassFailed
from xformopt.measure.latency import run_interleaved
from xformopt.models import load_tokenizer
from xformopt.onnx_graph import fused_counts, int8_coverage, load_graph
from xformopt.passes.base import PassContext
from xformopt.passes.export.dynamo import onnxscript_fusions
from xformopt.passes.quantize.calibration import load_split
from xformopt.passes.timing import preferred_within_tolerance
from xformopt.seq2seq import GRAPH_FILES
from xformopt.seq2seq.generate import GenerationSettings, generate
from xformopt.seq2seq.measure import decode, encode, forced_agreement, generate_rows
from xformopt.seq2seq.parity import check_parity
from xformopt.seq2seq.runner import OrtSeq2Seq

SAMPLE_ROWS = 16  # sentences each candidate generates when timed and compared
MAX_NEW_TOKENS = 32
FUSED_PARITY = 1e-3


def _settings(path: Path) -> GenerationSettings:
    settings = GenerationSettings.from_model_dir(path)
    return settings.with_(max_new_tokens=min(settings.max_new_tokens, MAX_NEW_TOKENS), num_beams=1)


def _time(ctx: PassContext, dirs: dict[str, Path], rounds: int) -> dict[str, dict]:
    """Median ms to generate one sample sentence greedily at batch 1, per candidate, interleaved."""
    tokenizer = load_tokenizer(next(iter(dirs.values())))
    texts = list(ctx.sample_texts)[:SAMPLE_ROWS]
    encoded = [encode(tokenizer, [t]) for t in texts]
    settings = _settings(next(iter(dirs.values())))
    runners = {name: OrtSeq2Seq(path, threads=ctx.threads) for name, path in dirs.items()}
    calls = {name: (lambda i, r=r: generate(r, encoded[i]["input_ids"], encoded[i]["attention_mask"], settings))
             for name, r in runners.items()}
    stats = run_interleaved(calls, len(encoded), warmup=2, iterations=rounds, seed=0)
    return {name: {"median_ms": s.median_ms, "p90_ms": s.p90_ms, "n": s.n} for name, s in stats.items()}


def fuse_seq2seq(ctx: PassContext, src: Path, dst: Path, options) -> dict:
    work = dst / ".candidates"
    fused, plain = work / "all", work / "none"
    for cdir in (fused, plain):
        cdir.mkdir(parents=True)
        copy_stage(src, cdir)
    before, counts, rewrites = {}, {}, {}
    for name in GRAPH_FILES:
        ctx.log(f"fusing {name} (onnxscript's ORT fusions)")
        before[name] = fused_counts(load_graph(src / name))
        rewrites[name] = onnxscript_fusions(src / name, fused / name)
        counts[name] = {op: n for op, n in fused_counts(load_graph(fused / name)).items() if n}
    total = _sum(counts.values())
    missing = {op: (total.get(op, 0), n) for op, n in options.expect.items() if total.get(op, 0) < n}
    if missing:
        detail = ", ".join(f"{op} {got}/{want}" for op, (got, want) in missing.items())
        raise PassFailed(f"fusion fell short of what was expected: {detail} (fused counts {total})")
    attention = sum(total.get(op, 0) for op in ("Attention", "MultiHeadAttention"))
    # a generic row (a model type the table does not know) requires no fusion: the record says which fired
    if options.expect_full and attention == 0 and not ctx.spec.family.generic:
        raise PassFailed(f"no attention fused in either graph of this {ctx.spec.model_type} (fused counts {total}); "
                         "expect_full: false keeps the unfused graphs")
    tokenizer = load_tokenizer(src)
    parity = check_parity(OrtSeq2Seq(src, threads=ctx.threads), OrtSeq2Seq(fused, threads=ctx.threads), tokenizer,
                          list(ctx.sample_texts))
    if parity["max_abs_diff"] > FUSED_PARITY:
        raise PassFailed(f"fused graphs differ from the unfused ones: max |logit diff| {parity['max_abs_diff']:.2e} "
                         f"(limit {FUSED_PARITY:.0e})")
    timings = {}
    wanted = {"all": fused, "none": plain}
    if options.select == "fastest" and ctx.host_runs_target:
        ctx.log(f"timing fused and unfused graphs, one generated sentence each, interleaved ({options.timing_rounds} rounds)")
        timings = _time(ctx, wanted, options.timing_rounds)
        chosen = preferred_within_tolerance({k: t["median_ms"] for k, t in timings.items()}, ("all", "none"),
                                            options.tolerance)
        summary = ", ".join(f"{k} {t['median_ms']:.2f} ms" for k, t in timings.items())
        reason = f"median per generated sentence at batch 1 on this host ({summary})"
    else:
        chosen = "none" if options.select == "none" else "all"
        reason = f"select={options.select}" if options.select != "fastest" else \
            f"host lacks target {ctx.target.name}: not timed here, kept full fusion"
    for item in wanted[chosen].iterdir():
        shutil.move(str(item), dst / item.name)
    shutil.rmtree(work)
    kept = counts if chosen == "all" else {n: {op: v for op, v in before[n].items() if v} for n in GRAPH_FILES}
    return {"fusion_route": "onnxscript.rewriter.ort_fusions on encoder.onnx and decoder.onnx",
            "fused_before": _sum(before.values()), "fused_possible": total, "fused_kept": _sum(kept.values()),
            "fused_by_graph": counts, "onnxscript_rewrites": rewrites, "expected": dict(options.expect),
            "fused_parity": parity, "kept": chosen, "reason": reason,
            "timings_ms": timings}


def _sum(dicts) -> dict[str, int]:
    total: dict[str, int] = {}
    for d in dicts:
        for op, n in d.items():
            total[op] = total.get(op, 0) + n
    return total


def _quantize_graph(src: Path, dst: Path, formats: dict, exclude: list[str]) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), op_types_to_quantize=list(formats["op_types"]),
                     per_channel=formats["per_channel"], reduce_range=formats["reduce_range"],
                     weight_type=QuantType.QInt8 if formats["weight_type"] == "int8" else QuantType.QUInt8,
                     nodes_to_exclude=list(exclude))


def _candidate(src: Path, out: Path, formats: dict, graphs: tuple[str, ...], exclude: list[str]) -> Path:
    out.mkdir(parents=True)
    copy_stage(src, out)
    for name in graphs:
        (out / name).unlink()
        _quantize_graph(src / name, out / name, formats, exclude)
    return out


def _task_points(ctx: PassContext, path: Path, data, tokenizer) -> float:
    rows = generate_rows(OrtSeq2Seq(path, threads=ctx.threads), tokenizer, data.texts, _settings(path))
    task = ctx.spec.task_def
    return task.budget_value(task.reference_metrics(decode(tokenizer, rows), list(data.extra["targets"]), 0))


BUDGET_ROWS = 200  # labelled rows the budget generates on when budget_limit is unset


def quantize_seq2seq(ctx: PassContext, src: Path, dst: Path, options, formats: dict) -> dict:
    """``formats``: the target's INT8 formats (quantize's ``resolved_formats``)."""
    copy_stage(src, dst, with_model=False)
    for name in GRAPH_FILES:
        (dst / name).unlink(missing_ok=True)
    work = dst / ".quantize"
    ladder = [("both graphs", GRAPH_FILES), ("encoder graph only", GRAPH_FILES[:1])]
    if options.max_accuracy_drop is None:
        ladder = ladder[:1]
    tokenizer = load_tokenizer(src)
    record: dict = {"mode": "dynamic", "formats": formats, "graphs": list(GRAPH_FILES)}
    try:
        budget_rows = None
        if options.max_accuracy_drop is not None:
            budget_rows = load_split(options.budget_data, "validation", ctx.spec, options.budget_limit or BUDGET_ROWS,
                                     0, labels=True)
            if "targets" not in budget_rows.extra:
                raise PassFailed(f"the accuracy budget needs reference targets: {budget_rows.source} has none "
                                 "(--validation-data FILE with source and target columns)")
            float_points = _task_points(ctx, src, budget_rows, tokenizer)
            allowed = accuracy_budget.points(options.max_accuracy_drop, float_points)
        search, chosen = [], None
        for i, (what, graphs) in enumerate(ladder):
            ctx.log(f"dynamic INT8: {what}")
            cand = _candidate(src, work / f"candidate-{i}", formats, graphs, options.exclude_nodes)
            row = {"candidate": what, "graphs": list(graphs)}
            if budget_rows is not None:
                row["metric_after"] = _task_points(ctx, cand, budget_rows, tokenizer)
                row["drop"] = float_points - row["metric_after"]
                row["passes"] = row["drop"] <= allowed
            search.append(row)
            chosen = cand, row
            if row.get("passes", True):
                break
        cand, row = chosen
        if budget_rows is not None:
            record["budget"] = {"metric": ctx.spec.task_def.headline, "float_metric": float_points,
                                "metric_after": row["metric_after"], "drop": row["drop"], "allowed_drop_points": allowed,
                                "budget_met": row["passes"], "rows": len(budget_rows), "data": budget_rows.source,
                                "kept_float": [] if row["graphs"] == list(GRAPH_FILES) else [GRAPH_FILES[1]],
                                "search": search, "max_float_nodes": "the decoder graph"}
            record["budget_met"] = row["passes"]
        for item in cand.iterdir():
            shutil.move(str(item), dst / item.name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    coverage = {name: int8_coverage(load_graph(src / name), load_graph(dst / name)) for name in GRAPH_FILES}
    record["coverage"] = _merge_coverage(coverage)
    record["coverage_by_graph"] = coverage
    if record["coverage"]["int8"] == 0:
        raise PassFailed(f"quantize changed nothing: none of {record['coverage']['weighted_gemms']} weighted "
                         f"MatMul/Gemm nodes became INT8 (op types {formats['op_types']})")
    texts = list(ctx.sample_texts)[:SAMPLE_ROWS]
    float_runner = OrtSeq2Seq(src, threads=ctx.threads)
    reference = generate_rows(float_runner, tokenizer, texts, _settings(src))
    hits = forced_agreement(OrtSeq2Seq(dst, threads=ctx.threads), tokenizer, texts, reference)
    mean = float(hits.mean()) if hits.size else 1.0
    record["agreement"] = {"measure": ctx.spec.task_def.agreement_measure, "mean_agreement": mean,
                           "min_agreement": mean, "texts": len(texts), "positions": int(hits.size)}
    floor = ctx.spec.task_def.agreement_floor if options.min_agreement is None else options.min_agreement
    met = mean >= floor
    record["verdict"] = {"passed": met and record.get("budget_met", True) is not False,
                         "checks": {"agreement_floor": {"met": met, "mean_agreement": mean, "min_agreement": floor}},
                         "accept": {} if met else {"min_agreement": round(mean - 5e-5, 4)}}
    return record


def _merge_coverage(per_graph: dict[str, dict]) -> dict:
    merged = {"weighted_gemms": 0, "int8": 0, "kept_float": [], "activation_matmuls_float": 0, "int8_ops": {}}
    for name, cov in per_graph.items():
        merged["weighted_gemms"] += cov["weighted_gemms"]
        merged["int8"] += cov["int8"]
        merged["activation_matmuls_float"] += cov["activation_matmuls_float"]
        merged["kept_float"] += [{**g, "graph": name} for g in cov["kept_float"]]
        for op, n in cov["int8_ops"].items():
            merged["int8_ops"][op] = merged["int8_ops"].get(op, 0) + n
    return merged
