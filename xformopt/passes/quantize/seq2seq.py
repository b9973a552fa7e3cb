"""quantize for encoder-decoder stages (two graphs, xformopt/seq2seq/), called by the quantize pass
through its graph-kind table; the record has the keys the pass's summary and the report read.

- Outlier rules (the family's ``int8_outliers``, matched on node names or module paths) rewrite each
  graph in float first, on activation ranges recorded while the float graphs generate; each rewrite
  is checked exact against its graph (``outliers.treat``). Record keys are ``graph:node``.
- dynamic: ONNX Runtime's dynamic INT8 on both graphs with the target's formats.
- static: each graph calibrated on its own inputs, recorded while the float graphs generate the
  calibration split (``xformopt.seq2seq.feeds``: every encoder call, a sample of decoder steps), then
  written as QOperator or QDQ as the target says.
- Verified by next-token agreement with the float graphs; with ``max_accuracy_drop``, the task metric
  (BLEU, ROUGE) on labelled rows holds it, trying INT8 in both graphs, then the encoder graph alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from xformopt import accuracy_budget
from xformopt.artifact import copy_stage
from xformopt.errors import PassFailed
from xformopt.models import load_tokenizer
from xformopt.onnx_graph import int8_coverage, load_graph
from xformopt.passes.base import PassContext
from xformopt.passes.quantize import calibration as cal
from xformopt.passes.quantize import outliers, transposed_weights
from xformopt.passes.quantize.builders import dynamic_builder, static_builder
from xformopt.passes.seq2seq_stages import SAMPLE_ROWS
from xformopt.passes.seq2seq_stages import _settings as sample_settings
from xformopt.seq2seq import DECODER_FILE, ENCODER_FILE, GRAPH_FILES
from xformopt.seq2seq.feeds import record_feeds
from xformopt.seq2seq.measure import decode, forced_agreement, generate_rows
from xformopt.seq2seq.runner import OrtSeq2Seq
from xformopt.seq2seq.search_graph import CHECK_ROWS, write_search_graph

BUDGET_ROWS = 200  # labelled rows the budget generates on when budget_limit is unset
PARITY_FEEDS = 4  # feeds per graph the outlier rewrite's float parity is checked on


def quantize_seq2seq(ctx: PassContext, src: Path, dst: Path, options, formats: dict) -> dict:
    """``formats``: the target's INT8 formats (quantize's ``resolved_formats``)."""
    copy_stage(src, dst, with_model=False)
    for name in GRAPH_FILES:
        (dst / name).unlink(missing_ok=True)
    work = dst / ".quantize"
    work.mkdir()
    tokenizer = load_tokenizer(src)
    record: dict = {"mode": options.mode, "formats": formats, "graphs": list(GRAPH_FILES)}
    try:
        # ``treated``: the float graphs INT8 is built from (src itself when no rule applies)
        treated, exclude = treat_outliers(ctx, src, work, options, tokenizer, record)
        if options.mode == "static":
            builders, record["calibration"] = _static_builders(ctx, src, treated, work, options, formats, tokenizer)
        else:
            builders = {name: dynamic_builder(treated, formats, name, untie_weights=True) for name in GRAPH_FILES}
            record["untied_heads"] = {name: nodes for name in GRAPH_FILES
                                      if (nodes := transposed_weights.transposed_weight_nodes(treated / name))}
        chosen, graphs = _budget_ladder(ctx, src, work, options, builders, exclude, tokenizer, record)
        for item in chosen.iterdir():
            shutil.move(str(item), dst / item.name)
        coverage = {name: int8_coverage(load_graph((treated if name in graphs else src) / name), load_graph(dst / name))
                    for name in GRAPH_FILES}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    record["coverage"] = _merge_coverage(coverage)
    record["coverage_by_graph"] = coverage
    if record["coverage"]["int8"] == 0:
        raise PassFailed(f"quantize changed nothing: none of {record['coverage']['weighted_gemms']} weighted "
                         f"MatMul/Gemm nodes became INT8 (op types {formats['op_types']})")
    _agreement_verdict(ctx, src, dst, options, tokenizer, record)
    # built from the INT8 graphs as written: the op embeds them as they are
    record["search_graph"] = write_search_graph(dst, list(ctx.sample_texts)[:CHECK_ROWS], tokenizer, ctx.threads)
    return record


def treat_outliers(ctx: PassContext, src: Path, work: Path, options, tokenizer, record: dict) -> tuple[Path, dict]:
    """The family's outlier rules applied to each float graph (a copy under ``work``); returns the stage to
    quantize and, per graph, the nodes to keep float (``exclude_nodes`` and the rules' ``float``)."""
    exclude = {name: list(options.exclude_nodes) for name in GRAPH_FILES}
    workspace = cal.outlier_workspace(ctx, src, work, options)
    if workspace is None:
        return src, exclude
    rules, treated, rows = workspace
    # one row at a time, as the encoder route: no padding in the ranges
    feeds = record_feeds(src, tokenizer, rows.texts, sample_settings(src), batch_size=1, threads=ctx.threads)
    merged: dict = {"rules": [list(r) for r in rules], "nodes": {}, "kept_float": [], "skipped": {},
                    "range_source": rows.source, "range_feeds": feeds.record(), "by_graph": {}}
    for name, graph_feeds in ((ENCODER_FILE, feeds.encoder), (DECODER_FILE, feeds.decoder)):
        got = outliers.treat(src / name, treated / name, rules, graph_feeds, graph_feeds[:PARITY_FEEDS])
        merged["nodes"].update({f"{name}:{n}": v for n, v in got["nodes"].items()})
        merged["kept_float"] += [f"{name}:{n}" for n in got["kept_float"]]
        merged["skipped"].update({f"{name}:{n}": why for n, why in got["skipped"].items()})
        merged["by_graph"][name] = {k: got[k] for k in ("range_rows", "float_parity_max_abs_diff") if k in got}
        exclude[name] += [n for n in got["kept_float"] if n not in exclude[name]]
    parities = [g["float_parity_max_abs_diff"] for g in merged["by_graph"].values() if "float_parity_max_abs_diff" in g]
    if parities:
        merged["float_parity_max_abs_diff"] = max(parities)
    record["outliers"] = merged
    ctx.log(f"{ctx.spec.model_type} INT8 outlier rules: {len(merged['nodes'])} GEMM input(s) smoothed or split, "
            f"{len(merged['kept_float'])} kept float" + (f", {len(merged['skipped'])} skipped" if merged["skipped"] else "")
            + " in the two graphs (outlier_rules: false turns them off)")
    return treated, exclude


def _static_builders(ctx: PassContext, src: Path, treated: Path, work: Path, options, formats: dict,
                     tokenizer) -> tuple[dict, dict]:
    """Each graph calibrated on the inputs it saw while the float graphs generated the calibration rows."""
    rows = cal.load_split(options.calibration_data, "train", ctx.spec, options.calibration_limit, 0, labels=False)
    ctx.log(f"static INT8: recording both graphs' inputs while the float graphs generate {len(rows)} rows "
            f"from {rows.source}")
    feeds = record_feeds(src, tokenizer, rows.texts, sample_settings(src), batch_size=options.calibration_batch_size,
                         threads=ctx.threads)
    builders, per_graph = {}, {}
    for name, graph_feeds in ((ENCODER_FILE, feeds.encoder), (DECODER_FILE, feeds.decoder)):
        prepared, cache = work / f"prepared-{name}", work / f"calibration-{name}.json"
        prep = cal.prepare_for_static(treated / name, prepared)
        stats = cal.calibrate(prepared, cal.FeedReader(graph_feeds), options.calibration_method, formats["op_types"],
                              cache, work, chunk_batches=options.calibration_chunk_batches,
                              symmetric=formats["activation_symmetric"])
        ctx.log(f"calibrated {name} ({stats['method']}): {stats['tensors']} tensors on {len(graph_feeds)} feeds "
                f"({stats['seconds']:.1f}s)")
        per_graph[name] = {**stats, "feeds": len(graph_feeds), "prepare": prep}
        builders[name] = static_builder(prepared, cache, options.calibration_method, formats, name)
    method = per_graph[ENCODER_FILE]["method"]
    return builders, {**cal.dataset_record(rows, "calibration"), "method": method, **feeds.record(),
                      "graphs": per_graph}


def _candidate(src: Path, out: Path, builders: dict, graphs: tuple[str, ...], exclude: dict[str, list[str]]) -> Path:
    """The float stage with ``graphs`` replaced by their INT8 builds."""
    out.mkdir(parents=True)
    copy_stage(src, out)
    for name in graphs:
        (out / name).unlink()
        builders[name](out, exclude[name])
    return out


def _task_points(ctx: PassContext, path: Path, data, tokenizer) -> float:
    rows = generate_rows(OrtSeq2Seq(path, threads=ctx.threads), tokenizer, data.texts, sample_settings(path))
    task = ctx.spec.task_def
    return task.budget_value(task.reference_metrics(decode(tokenizer, rows), list(data.extra["targets"]), 0))


def _budget_ladder(ctx: PassContext, src: Path, work: Path, options, builders: dict, exclude: dict,
                   tokenizer, record: dict) -> tuple[Path, tuple[str, ...]]:
    """INT8 in both graphs; over the accuracy budget, in the encoder graph alone. Returns the chosen
    candidate's folder and its INT8 graphs."""
    ladder = [("both graphs", GRAPH_FILES), ("encoder graph only", GRAPH_FILES[:1])]
    budget_rows = None
    if options.max_accuracy_drop is not None:
        budget_rows = cal.load_split(options.budget_data, "validation", ctx.spec, options.budget_limit or BUDGET_ROWS,
                                     0, labels=True)
        if "targets" not in budget_rows.extra:
            raise PassFailed(f"the accuracy budget needs reference targets: {budget_rows.source} has none "
                             "(--validation-data FILE with source and target columns)")
        float_points = _task_points(ctx, src, budget_rows, tokenizer)
        allowed = accuracy_budget.points(options.max_accuracy_drop, float_points)
    else:
        ladder = ladder[:1]
    search, chosen = [], None
    for i, (what, graphs) in enumerate(ladder):
        ctx.log(f"{options.mode} INT8: {what}")
        cand = _candidate(src, work / f"candidate-{i}", builders, graphs, exclude)
        row = {"candidate": what, "graphs": list(graphs)}
        if budget_rows is not None:
            row["metric_after"] = _task_points(ctx, cand, budget_rows, tokenizer)
            row["drop"] = float_points - row["metric_after"]
            row["passes"] = row["drop"] <= allowed
        search.append(row)
        chosen = cand, graphs, row
        if row.get("passes", True):
            break
    cand, graphs, row = chosen
    if budget_rows is not None:
        record["budget"] = {"metric": ctx.spec.task_def.headline, "float_metric": float_points,
                            "metric_after": row["metric_after"], "drop": row["drop"], "allowed_drop_points": allowed,
                            "budget_met": row["passes"], "rows": len(budget_rows), "data": budget_rows.source,
                            "kept_float": [] if graphs == GRAPH_FILES else [DECODER_FILE],
                            "search": search, "max_float_nodes": "the decoder graph"}
        record["budget_met"] = row["passes"]
    return cand, graphs


def _agreement_verdict(ctx: PassContext, src: Path, dst: Path, options, tokenizer, record: dict) -> None:
    """Next-token agreement of the INT8 graphs with the float ones (teacher-forced on the float greedy
    output of the sample texts), and the verdict: the floor and, when set, the budget."""
    texts = list(ctx.sample_texts)[:SAMPLE_ROWS]
    reference = generate_rows(OrtSeq2Seq(src, threads=ctx.threads), tokenizer, texts, sample_settings(src))
    hits = forced_agreement(OrtSeq2Seq(dst, threads=ctx.threads), tokenizer, texts, reference)
    mean = float(hits.mean()) if hits.size else 1.0
    record["agreement"] = {"measure": ctx.spec.task_def.agreement_measure, "mean_agreement": mean,
                           "min_agreement": mean, "texts": len(texts), "positions": int(hits.size)}
    floor = ctx.spec.task_def.agreement_floor if options.min_agreement is None else options.min_agreement
    record["verdict"] = verdict(record["agreement"], floor, record.get("budget_met"))


def verdict(agreement: dict, floor: float, budget_met: bool | None) -> dict:
    """The agreement floor and, when there was a budget, whether it held; what a failing verdict reports."""
    mean = agreement["mean_agreement"]
    met = mean >= floor
    out = {"passed": met and budget_met is not False,
           "checks": {"agreement_floor": {"met": met, "mean_agreement": mean, "min_agreement": floor,
                                          "measure": agreement["measure"]}},
           "accept": {} if met else {"min_agreement": round(mean - 5e-5, 4)}}
    if not met:
        out["hint"] = ("keep the decoder graph in float (--max-accuracy-drop tries it) or check the family's "
                       "outlier rules (outlier_rules)")
    return out


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
