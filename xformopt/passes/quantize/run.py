"""quantize: INT8 with ONNX Runtime's quantizer, formats chosen by the target profile.

Two modes. ``dynamic``: weights INT8 offline, activations quantized per batch at run time.
``static``: activation ranges calibrated offline on a calibration set (by default a sample of the
vendored *train* split, disjoint from the report's test rows), written as QOperator or QDQ as the
target says. The pass counts what really runs in INT8, names every weighted MatMul/Gemm left in
float, and fails when it quantized nothing: a silent no-op is the failure users complain about most.

Static on a fused graph. The calibrator and quantizer need every tensor typed; ORT's contrib ops
are typed by symbolic shape inference first (``calibration.prepare_for_static``), so static works
on the graph ``fuse`` produced and the ordering contract holds. ORT has no static kernel for the
fused ``Attention`` op (it is only in the dynamic QOperator registry: QAttention takes a
dynamically quantized input), so in static mode the MatMuls/Gemms are quantized statically and
each fused Attention's QKV projection dynamically (QAttention). Leaving it float instead was
measured slower (MiniLM, batch 1, median vs fp32: 0.605 float Attention, 0.425 QAttention); the
record counts both kinds.

Accuracy budget (``max_accuracy_drop``). After quantizing, the task metric is measured on a budget
split (the vendored *validation* split by default: neither the calibration nor the report's rows)
against the float input graph. Over budget, the weighted GEMMs are ranked by harm (local output
error under quantization, ``calibration.harm_scores``) and the most harmful return to float, 1, 2,
4, 8 ... nodes, then bisected; the passing candidates are timed interleaved at batch 1 and the
fastest kept. When none passes within ``max_float_nodes``, the best is written with
``budget_met: false`` and the run exits 1 after the artifact is written.

Agreement floor (``min_agreement``). Missed after every safer format and the float ladder (up to a
tenth of the GEMMs, rounded up), it is a failing verdict like a missed budget: the closest attempt is
written, ``verdict.passed`` is false, ``verdict.accept`` names the floor that accepts it, and the run
exits 1.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from xformopt import accuracy_budget
from xformopt.artifact import copy_stage
from xformopt.errors import InputError, PassFailed
from xformopt.models import ModelSpec
from xformopt.onnx_graph import int8_coverage, load_graph, weighted_gemms
from xformopt.passes.base import Pass, PassContext, PassOptions
from xformopt.passes.fewest import fewest_that_pass
from xformopt.passes.quantize import calibration as cal
from xformopt.passes.quantize import outliers
from xformopt.passes.quantize.budget import budget_search
from xformopt.passes.quantize.builders import dynamic_builder, static_builder
from xformopt.passes.quantize.calibration import dataset_reader
from xformopt.passes.quantize.formats import (
    accept_floor,
    agreement_floor,
    describe,
    failure_hint,
    float_gemm_bound,
    format_ladder,
)
from xformopt.passes.quantize.seq2seq import quantize_seq2seq
from xformopt.passes.records import QuantizeRecord
from xformopt.passes.stage_runs import stage_runs
from xformopt.targets import Target, u8s8_saturates

# Graph kinds (``Task.graph``) whose stages are not one model.onnx: quantized by their own function.
OWN_GRAPH_RUNS = {"seq2seq": quantize_seq2seq}


class QuantizeOptions(PassOptions):
    mode: Literal["dynamic", "static"] = Field(
        "dynamic", description="dynamic (activations per batch) or static (calibrated); 4-bit weight-only: the int4 pass")
    per_channel: bool | None = Field(None, description="per-channel weight scales; default: the target's")
    reduce_range: bool | None = Field(None, description="7-bit weights; default: the target's")
    weight_type: Literal["int8", "uint8"] | None = Field(None, description="weight type; default: the target's")
    op_types: list[str] | None = Field(None, description="op types to quantize; default: the target's")
    exclude_nodes: list[str] = Field(default_factory=list, description="node names kept in float")
    outlier_rules: bool = Field(True, description="apply the family's INT8 outlier rules (xformopt/families.py "
                                                  "int8_outliers: smooth, split or float); false: plain INT8")
    min_agreement: float | None = Field(
        None, ge=0, le=1,
        description="floor on the output cosine to the float graph; below it the pass tries safer formats, then "
                    "float for the most harmful GEMMs; default: 0.99 for embeddings, 0.9 otherwise")
    quant_format: Literal["QOperator", "QDQ"] | None = Field(None, description="static: graph format; default: the target's")
    activation_type: Literal["uint8", "int8"] | None = Field(None, description="static: activation type; default: the target's")
    activation_symmetric: bool | None = Field(None, description="static: zero-point 0 activations; default: the target's")
    calibration_data: str | None = Field(None, description="calibration texts (same formats as --data); default: vendored train split")
    calibration_method: Literal["minmax", "entropy", "percentile"] = Field("minmax", description="static: range estimator")
    calibration_limit: int | None = Field(256, ge=1, description="calibrate on at most this many rows (seeded sample)")
    calibration_batch_size: int = Field(8, ge=1, description="rows per calibration batch")
    calibration_chunk_batches: int = Field(16, ge=1, description="batches of intermediate outputs held before a flush")
    max_accuracy_drop: float | str | None = Field(
        None, description="budget: absolute metric points (0.5) or relative to the float value ('1%'); none: no budget"
    )
    budget_data: str | None = Field(None, description="budget evaluation texts; default: vendored validation split")
    budget_limit: int | None = Field(None, ge=1, description="budget rows (seeded sample); default: all (0.5 points needs ~1000 rows)")
    max_float_nodes: int | None = Field(None, ge=0, description="most GEMMs the budget may return to float; default: half")
    timing_rounds: int = Field(40, ge=3, description="interleaved rounds when timing passing candidates")

    @field_validator("max_accuracy_drop", mode="before")
    @classmethod
    def _budget(cls, value):
        return None if value is None else accuracy_budget.parse(value)

    @field_validator("mode", mode="before")
    @classmethod
    def _int4_moved(cls, value):
        # Recipes written before int4 became its own pass: refused with the fix (CHANGELOG), not translated.
        if value == "int4":
            raise PydanticCustomError("int4_moved", "quantize mode int4 is its own pass now: write the step as "
                                                    "`int4: {...}` with the same options and no mode (`xformopt int4` on "
                                                    "the command line)")
        return value


def treat_outliers(ctx: PassContext, src: Path, work: Path, options: QuantizeOptions) -> tuple[Path, dict | None]:
    """The family's outlier rules applied to a copy of the float stage (xformopt/passes/quantize/outliers.py):
    the stage to quantize, and the record (None when the family has no rules or they are off)."""
    workspace = cal.outlier_workspace(ctx, src, work, options)
    if workspace is None:
        return src, None
    rules, treated, rows = workspace
    reader = dataset_reader(ctx.spec, src, rows, batch_size=1)  # one row each: no padding in the ranges
    feeds = list(iter(reader.get_next, None))
    record = outliers.treat(src / "model.onnx", treated / "model.onnx", rules, feeds, feeds[:4])
    record["range_source"] = rows.source
    ctx.log(f"{ctx.spec.model_type} INT8 outlier rules: {len(record['nodes'])} GEMM input(s) smoothed or split, "
            f"{len(record['kept_float'])} kept float" + (f", {len(record['skipped'])} skipped" if record["skipped"] else "")
            + " (outlier_rules: false turns them off)")
    return treated, record


def resolved_formats(target: Target, options: QuantizeOptions) -> dict:
    """The INT8 formats a run uses: each option, or where it is null the target profile's choice."""
    q = target.quant

    def pick(option, default):
        return default if option is None else option

    static = options.mode == "static"
    return {
        "weight_type": pick(options.weight_type, q.weight_type),
        # dynamic quantization always quantizes activations to asymmetric uint8, in QOperator form
        "activation_type": pick(options.activation_type, q.activation_type) if static else "uint8",
        "activation_symmetric": pick(options.activation_symmetric, q.activation_symmetric) if static else False,
        "per_channel": pick(options.per_channel, q.per_channel),
        "reduce_range": pick(options.reduce_range, q.reduce_range),
        "op_types": list(options.op_types or q.op_types),
        "format": pick(options.quant_format, q.quant_format) if static else "QOperator",
    }


class QuantizePass(Pass):
    name = "quantize"
    stage = "onnx"
    consumes = "onnx"
    produces = "onnx"
    Options = QuantizeOptions
    Record = QuantizeRecord
    must_not_follow = {"quantize": "the graph is already quantized", "int4": "the graph is already 4-bit"}
    summary = "INT8 quantization (dynamic or calibrated static), formats from the target, optional accuracy budget"
    needs = ("calibration data (static; default: vendored train split)", "budget data (with max_accuracy_drop; default: vendored validation split)")
    flags = {"validation_data": "budget_data", "calibration_data": "calibration_data",
             "max_accuracy_drop": "max_accuracy_drop", "per_channel": "per_channel", "min_agreement": "min_agreement"}
    data_options = ("calibration_data", "budget_data")
    labelled_fallbacks = {"budget_data": ("validation", "the INT8 accuracy budget")}
    read_when = {"calibration_data": "in static mode (mode: static)",
                 "budget_data": "with an accuracy budget (max_accuracy_drop)"}

    @classmethod
    def reads(cls, option: str, options: dict) -> bool:
        if option == "calibration_data":
            return options.get("mode") == "static"
        if option == "budget_data":
            return options.get("max_accuracy_drop") is not None
        return True

    @classmethod
    def check_own(cls, spec: ModelSpec, options: dict) -> None:
        if options.get("mode") == "static":
            spec.task_def.refuse("static-int8", f"quantize mode static on {spec.model_type}")
        if not spec.task_def.int8_calibration and (
                options.get("mode") == "static" or options.get("max_accuracy_drop") is not None):
            raise InputError("decoders (text-generation) support dynamic INT8 only: static calibration and the accuracy "
                             "budget feed encoder inputs; use --mode dynamic without --max-accuracy-drop")

    @classmethod
    def resolve(cls, options: dict, target: Target) -> dict:
        """The INT8 formats ``target`` decides where the options say null (what the run will use)."""
        formats = resolved_formats(target, QuantizeOptions.model_validate(options))
        return {**options, "weight_type": formats["weight_type"], "per_channel": formats["per_channel"],
                "reduce_range": formats["reduce_range"], "op_types": formats["op_types"],
                "quant_format": formats["format"], "activation_type": formats["activation_type"],
                "activation_symmetric": formats["activation_symmetric"]}

    @staticmethod
    def report_facts(record: dict) -> dict:
        cov = record["coverage"]
        return {"int8_gemms": cov["int8"], "weighted_gemms": cov["weighted_gemms"],
                "float_gemms": [g["name"] for g in cov["kept_float"]]}

    @staticmethod
    def budget_failure(record: dict, out: Path) -> str:
        b = record.get("budget", {})
        floor = (record.get("verdict") or {}).get("checks", {}).get("agreement_floor", {"met": True})
        if not floor["met"]:
            missed = floor_failure(record, out)
            return missed if b.get("budget_met", True) else f"{missed}; {QuantizePass._budget_line(b, out)}"
        return QuantizePass._budget_line(b, out)

    @staticmethod
    def _budget_line(b: dict, out: Path) -> str:
        return (f"accuracy budget not met: {b.get('metric')} drop {b.get('drop')} points > allowed "
                f"{b.get('allowed_drop_points')} with up to {b.get('max_float_nodes')} node(s) in float; the best "
                f"candidate was written to {out} (raise max_float_nodes, loosen the budget, or try another calibration)")

    @staticmethod
    def summarize(rec: dict) -> str:
        """One line: what the pass changed and how it was verified."""
        c = rec["coverage"]
        mode = rec.get("mode", "dynamic")
        if mode == "static":
            cal = rec["calibration"]
            mode = f"static {rec['formats']['format']}, {cal['method']} on {cal['rows']} rows"
        line = (f"{mode}: {c['int8']}/{c['weighted_gemms']} weighted GEMMs in INT8 ({json.dumps(c['int8_ops'])}), "
                f"{len(c['kept_float'])} kept in float; output {rec['agreement']['measure']} vs float {rec['agreement']['mean_agreement']:.4f}")
        if rec.get("outliers", {}).get("nodes"):
            o = rec["outliers"]
            done = [n["treatment"] for n in o["nodes"].values()]
            line += (f"; outlier rules: {done.count('smooth')} input(s) smoothed, {done.count('split')} split "
                     f"(float parity {o['float_parity_max_abs_diff']:.1e})")
        if "budget" in rec:
            b = rec["budget"]
            line += (f"; budget {'met' if b['budget_met'] else 'NOT met'}: {b['metric']} {b['float_metric']:.2f} -> "
                     f"{b['metric_after']:.2f} (drop {b['drop']:.2f} {'<=' if b['budget_met'] else '>'} {b['allowed_drop_points']:.2f}), "
                     f"{len(b['kept_float'])} returned to float after {len(b['search'])} candidate(s)")
        floor = (rec.get("verdict") or {}).get("checks", {}).get("agreement_floor")
        if floor and not floor["met"]:
            line += f"; verdict FAILED: agreement floor not met ({floor['mean_agreement']:.4f} < {floor['min_agreement']})"
        return line

    def run(self, ctx: PassContext, src: Path, dst: Path, options: QuantizeOptions) -> QuantizeRecord:
        formats = resolved_formats(ctx.target, options)
        if (own := OWN_GRAPH_RUNS.get(ctx.spec.task_def.graph)) is not None:  # two graphs, not model.onnx
            return own(ctx, src, dst, options, formats)
        record: dict = {"mode": options.mode}
        copy_stage(src, dst, with_model=False)  # tokenizer and config; the graph is written below
        work = dst / ".quantize"
        work.mkdir()
        float_src = src  # agreement is checked against the input stage itself
        try:
            src, treated = treat_outliers(ctx, src, work, options)
            if treated is not None:
                record["outliers"] = treated
                extra = [n for n in treated["kept_float"] if n not in options.exclude_nodes]
                options = options.model_copy(update={"exclude_nodes": [*options.exclude_nodes, *extra]})
            if options.mode == "static":
                make_builder, record["calibration"], prepared, ranges, harm_reader = self._static(ctx, src, work, options, formats)
            else:
                make_builder = lambda fmt: dynamic_builder(src, fmt)  # noqa: E731
                prepared, ranges, harm_reader = src / "model.onnx", None, None
            search = choose_formats(ctx, options, formats, src, work, make_builder, prepared, ranges, harm_reader)
            formats, build, chosen = search.pop("formats"), search.pop("build"), search.pop("dir")
            record["formats"], record["format_search"] = formats, search
            if options.max_accuracy_drop is not None:
                budget_options = options.model_copy(update={"exclude_nodes": search["exclude_nodes"]})
                chosen.rename(work / "candidate-0")
                chosen, record["budget"] = budget_search(ctx, budget_options, formats, src, work, build, prepared,
                                                         ranges, harm_reader)
                record["budget_met"] = record["budget"]["budget_met"]
            for item in chosen.iterdir():
                shutil.move(str(item), dst / item.name)
            coverage = int8_coverage(load_graph(src / "model.onnx"), load_graph(dst / "model.onnx"))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if coverage["int8"] == 0:
            raise PassFailed(
                f"quantize changed nothing: none of {coverage['weighted_gemms']} weighted MatMul/Gemm nodes "
                f"became INT8 (op types {formats['op_types']})"
            )
        agreement = stage_runs(ctx.spec).agreement(ctx, float_src, dst)
        floor = agreement_floor(ctx.spec.task_def, options.min_agreement)
        record["verdict"] = verdict(record, agreement, floor,
                                    failure_hint(formats, _fixed(options), floor, len(record["format_search"]["exclude_nodes"])))
        if not record["verdict"]["passed"]:
            ctx.log(f"verdict: FAILED ({', '.join(k for k, c in record['verdict']['checks'].items() if not c['met'])}); "
                    "the best attempt is written and the run exits 1")
        return {**record, "coverage": coverage, "agreement": agreement}

    def _static(self, ctx: PassContext, src: Path, work: Path, options: QuantizeOptions, formats: dict):
        prepared = work / "prepared.onnx"
        prep = cal.prepare_for_static(src / "model.onnx", prepared)
        dataset = cal.load_split(options.calibration_data, "train", ctx.spec, options.calibration_limit, 0, labels=False)
        ctx.log(f"calibrating static INT8 ({options.calibration_method}) on {len(dataset)} rows from {dataset.source}")
        reader = cal.dataset_reader(ctx.spec, src, dataset, graph=prepared, batch_size=options.calibration_batch_size)
        cache = work / "calibration.json"
        stats = cal.calibrate(prepared, reader, options.calibration_method, formats["op_types"], cache, work,
                              chunk_batches=options.calibration_chunk_batches,
                              symmetric=formats["activation_symmetric"])
        ctx.log(f"calibrated {stats['tensors']} tensors in {stats['chunks']} chunk(s) of <= {stats['chunk_batches']} batches "
                f"({stats['seconds']:.1f}s)")
        record = {**cal.dataset_record(dataset, "calibration"), **stats, "prepare": prep}
        def make_builder(fmt: dict):
            return static_builder(prepared, cache, options.calibration_method, fmt)

        return make_builder, record, prepared, cal.tensor_ranges(cache), reader


def verdict(record: dict, agreement: dict, floor: float, hint: str) -> dict:
    """Whether the written graph meets what it had to: the agreement floor and, when set, the accuracy
    budget. A miss is a failing verdict, not a failed pass: the best attempt is written like a missed
    budget, the run exits 1, and ``accept`` holds the option values that would accept this graph."""
    checks = {"agreement_floor": {"met": agreement["mean_agreement"] >= floor, "min_agreement": floor,
                                  "measure": agreement["measure"], "mean_agreement": round(agreement["mean_agreement"], 6)}}
    if "budget" in record:
        b = record["budget"]
        checks["accuracy_budget"] = {"met": bool(b["budget_met"]), "metric": b["metric"], "drop": b["drop"],
                                     "allowed_drop_points": b["allowed_drop_points"]}
    passed = all(c["met"] for c in checks.values())
    out: dict = {"passed": passed, "checks": checks}
    if not checks["agreement_floor"]["met"]:
        out["accept"] = {"min_agreement": accept_floor(agreement["mean_agreement"])}
        out["hint"] = hint
    return out


def floor_failure(record: dict, out: Path) -> str:
    """The line for a missed agreement floor: what was tried (formats, the float ladder), where the best
    attempt is, and how to accept it."""
    check, search = record["verdict"]["checks"]["agreement_floor"], record.get("format_search")
    if search is None:  # seq2seq: one build per candidate, no format ladder
        search = {"attempts": [{"float_nodes": []}]}
    ladder = search.get("float_ladder")
    tried = f"{sum(1 for a in search['attempts'] if not a['float_nodes'])} format(s)"
    if ladder:
        steps = ", ".join(f"{s['float_gemms']}: {s['mean_agreement']:.3f}" for s in ladder["steps"])
        tried += f" and up to {ladder['bound']} of {ladder['weighted_gemms']} GEMMs in float ({steps})"
    accept = record["verdict"]["accept"]["min_agreement"]
    return (f"INT8 agreement floor not met: mean {check.get('measure', 'agreement')} {check['mean_agreement']:.3f} < "
            f"{check['min_agreement']} after {tried}; the best attempt was written to {out} with a failing verdict "
            f"(manifest.json: the quantize record's verdict); accept it with --min-agreement {accept} "
            f"(min_agreement: {accept} in a recipe), or {record['verdict'].get('hint', 'keep the model in float')}")


# --------------------------------------------------------------------------- format ladder


def _fixed(options: QuantizeOptions) -> dict:
    return {"per_channel": options.per_channel, "reduce_range": options.reduce_range, "weight_type": options.weight_type}


def choose_formats(ctx: PassContext, options: QuantizeOptions, formats: dict, src: Path, work: Path, make_builder,
                   prepared: Path, ranges: dict | None, harm_reader) -> dict:
    """Build with the target's formats; while the output cosine to float is under the floor, try the
    next safer format, then return the fewest of the most harmful GEMMs to float (up to a tenth, rounded up).

    Returns the chosen formats, their builder, the built directory, every attempt and the reason.
    """
    floor = agreement_floor(ctx.spec.task_def, options.min_agreement)
    agree = stage_runs(ctx.spec).agreement
    saturating = ctx.target.quant.reduce_range or u8s8_saturates(ctx.host_flags)
    ladder = format_ladder(formats, _fixed(options), saturating)
    attempts: list[dict] = []
    dirs: list[Path] = []
    exclude = list(options.exclude_nodes)

    def attempt(fmt: dict, extra_float: list[str], change: str) -> tuple[Path, dict]:
        out = work / f"format-{len(attempts)}"
        build = make_builder(fmt)
        build(out, [*exclude, *extra_float])
        measured = agree(ctx, src, out)
        row = {"formats": {k: fmt[k] for k in ("weight_type", "per_channel", "reduce_range")}, "change": change,
               "float_nodes": extra_float, **{k: (round(v, 6) if isinstance(v, float) else v)
                                              for k, v in measured.items()
                                              if k in ("measure", "mean_agreement", "min_agreement")}}
        # Judged on the measured value: a cosine of 0.9999996 rounds to 1.0 in the record but misses a floor of 1.
        row["passes"] = measured["mean_agreement"] >= floor
        ctx.log(f"INT8 formats ({describe(fmt)}{f', {len(extra_float)} node(s) in float' if extra_float else ''}): "
                f"mean {row['measure']} to float {row['mean_agreement']:.4f} ({'>=' if row['passes'] else '<'} {floor})")
        attempts.append(row)
        dirs.append(out)
        return out, row

    best = None
    for i, fmt in enumerate(ladder):
        fmt = {k: v for k, v in fmt.items() if k != "change"}
        out, row = attempt(fmt, [], ladder[i]["change"])
        if best is None or row["mean_agreement"] > best[2]["mean_agreement"]:
            best = (fmt, out, row)
        if row["passes"]:
            break
    fmt, out, row = best
    ladder_record = None
    candidates = [g for g in weighted_gemms(load_graph(src / "model.onnx")) if g["has_weight"] and g["name"] not in exclude]
    if not row["passes"] and ctx.spec.task_def.int8_calibration and candidates:  # harm ranking feeds model inputs
        most = float_gemm_bound(len(candidates))
        reader = harm_reader or _sample_reader(ctx, src)
        scores = cal.harm_scores(prepared, candidates, reader, fmt, ranges, work)
        ranked = sorted(scores, key=lambda n: -scores[n])
        first = len(attempts)
        ctx.log(f"INT8 formats: no format reached the floor {floor}; returning the most harmful GEMMs to float, "
                f"1, 2, 4 ... up to {most} of {len(candidates)}")
        fewest_that_pass(lambda k: attempt(fmt, ranked[:k], f"{k} most harmful GEMM(s) in float")[1]["passes"], most)
        ladder_record = {"weighted_gemms": len(candidates), "bound": most, "rule": "a tenth of the weighted GEMMs, rounded up",
                         "steps": [{"float_gemms": len(a["float_nodes"]), "mean_agreement": a["mean_agreement"],
                                    "min_agreement": a["min_agreement"], "passes": a["passes"]} for a in attempts[first:]]}
    passing = [i for i, r in enumerate(attempts) if r["passes"]]
    # The fewest float nodes that pass (formats before float, in ladder order); nothing passed: the
    # closest, so the failure below reports the best this model can do.
    pick = (min(passing, key=lambda i: (len(attempts[i]["float_nodes"]), i)) if passing
            else max(range(len(attempts)), key=lambda i: attempts[i]["mean_agreement"]))
    final = attempts[pick]
    reason = ("the target's formats" if pick == 0 and passing else
              f"first attempt over the floor {floor}: {final['change']}" if passing else
              f"no attempt reached the floor {floor}")
    if pick:
        ctx.log(f"INT8 formats: {reason}")
    final_fmt = {**fmt, **final["formats"]}
    for i, d in enumerate(dirs):
        if i != pick:
            shutil.rmtree(d, ignore_errors=True)
    return {"formats": final_fmt, "build": make_builder(final_fmt), "dir": dirs[pick], "floor": floor,
            "attempts": attempts, "chosen": pick, "exclude_nodes": [*exclude, *final["float_nodes"]], "reason": reason,
            "float_ladder": ladder_record, "weighted_gemms": len(candidates)}


def _sample_reader(ctx: PassContext, src: Path):
    return cal.dataset_reader(ctx.spec, src, ctx.sample_data.subset(range(min(64, len(ctx.sample_data)))))
