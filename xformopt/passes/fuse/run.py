"""fuse: ONNX Runtime's transformer fusions, verified by count and kept only where they pay.

ORT's fused CPU kernels (Attention, SkipLayerNormalization, ...) are usually faster, but not on
every CPU and shape. So the pass builds candidates (fully fused, attention left unfused, each of
those with its SkipLayerNormalizations split back into Sum + LayerNormalization (split_norms.py),
and the unfused input), times them against each other interleaved on real held-out texts at batch 1
on this host, and keeps the fastest. ``expect`` checks what *can* be fused (the fully fused candidate):
a recipe that expects 6 Attention nodes fails loudly when only 5 fuse.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import shutil
import tempfile
import threading
import warnings
from contextlib import contextmanager
from importlib import import_module
from pathlib import Path
from typing import Literal

from pydantic import Field

from xformopt.artifact import copy_stage
from xformopt.errors import PassFailed
from xformopt.measure import memory
from xformopt.models.validate import read_config
from xformopt.onnx_graph import fused_counts, load_graph, needs_external_data
from xformopt.passes.base import Pass, PassContext, PassOptions
from xformopt.passes.export.dynamo import (
    add_missing_layernorm_bias,
    is_dynamo_graph,
    onnxscript_fusions,
)
from xformopt.passes.fuse.split_norms import split_skip_norms
from xformopt.passes.records import FuseRecord
from xformopt.passes.seq2seq_stages import fuse_seq2seq
from xformopt.passes.stage_runs import stage_runs
from xformopt.passes.timing import preferred_within_tolerance

Candidate = Literal["all", "all_split_norms", "no_attention", "no_attention_split_norms", "none"]

# FusionOptions switches each candidate turns off (on top of what the target disables).
CANDIDATES: dict[str, tuple[str, ...]] = {
    "all": (),
    "no_attention": ("enable_attention",),
    "none": (),  # the unfused input graph, copied as is
}
# A candidate with this suffix is its base candidate with the SkipLayerNormalizations split (split_norms.py).
SPLIT_NORMS = "_split_norms"

FUSION_ORDER = ("all", "all_split_norms", "no_attention", "no_attention_split_norms", "none")  # most fused first

# Graph kinds (``Task.graph``) whose stages are not one model.onnx: fused by their own function.
OWN_GRAPH_RUNS = {"seq2seq": fuse_seq2seq}


class FuseOptions(PassOptions):
    select: Literal["fastest", "all", "none"] = Field(
        "fastest", description="fastest: time candidates and keep the quickest; all: keep full fusion"
    )
    candidates: list[Candidate] = Field(list(FUSION_ORDER), min_length=1,
                                        description="select fastest: the fusion levels timed against each other "
                                                    "(a split_norms candidate is dropped where it splits nothing)")
    expect: dict[str, int] = Field(default_factory=dict, description="minimum fused-op counts, e.g. {Attention: 6}")
    expect_full: bool = Field(True, description="every layer's attention and layer norms must fuse")
    timing_rounds: int = Field(40, ge=3, description="interleaved rounds when selecting the fastest")
    tolerance: float = Field(
        0.05, ge=0, description="keep the most-fused candidate whose median is within this fraction of the fastest"
    )


# Initializers of at least this many bytes stay on disk while ORT's optimizer works (onnx's default).
WEIGHTS_ON_DISK_BYTES = 1024


_thread_weights = threading.local()  # the weights directory of the fusion running in this thread
_wrap_lock = threading.Lock()


def _resolving_in_weights_dir(to_array):
    """onnx's ``numpy_helper.to_array`` reading external data from the calling thread's weights directory
    when the caller names none (ORT's fusions never do: their base is the process's working directory)."""

    @functools.wraps(to_array)
    def resolved(tensor, base_dir: str = ""):
        return to_array(tensor, base_dir or getattr(_thread_weights, "path", ""))

    resolved.reads_thread_weights_dir = True  # type: ignore[attr-defined]
    return resolved


@contextmanager
def weights_dir(path: Path):
    """Where the fusions running in this thread find the weights left on disk (``with_weights_on_disk``).

    ORT's fusions read a weight's values with ``numpy_helper.to_array(tensor)``, which resolves an
    external tensor against the working directory. Changing directory would move every thread of the
    process (a server, a notebook); instead onnx's function is wrapped once to default ``base_dir`` to
    the calling thread's directory, set here for this block only: other threads, and this one outside
    the block, get onnx's own behaviour."""
    from onnx import numpy_helper

    with _wrap_lock:
        if not getattr(numpy_helper.to_array, "reads_thread_weights_dir", False):
            numpy_helper.to_array = _resolving_in_weights_dir(numpy_helper.to_array)
    previous = getattr(_thread_weights, "path", "")
    _thread_weights.path = str(path)
    try:
        yield
    finally:
        _thread_weights.path = previous


class _NarrowAttentionNote(logging.Filter):
    """Pruned heads leave a layer's attention narrower than the hidden size (8 heads x 32 = 256 of 384):
    ORT's attention fusion warns on each such layer that the widths differ, which is what pruning meant."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Input hidden size")


@contextmanager
def quiet_fusion_logs(pruned: bool = False):
    """ORT's symbolic shape inference warns once per Slice it cannot bound (a decoder's past/total
    lengths): harmless for fusion, silenced for the block only (the logger's level is given back).
    On a head-pruned model the attention-width warning goes too (:class:`_NarrowAttentionNote`)."""
    logger = logging.getLogger("symbolic_shape_infer")
    # ORT's optimizer imports its fusions as top-level modules: the logger is "fusion_attention"
    attention = [logging.getLogger(n) for n in ("fusion_attention", "onnxruntime.transformers.fusion_attention")]
    note = _NarrowAttentionNote()
    previous = logger.level
    logger.setLevel(logging.ERROR)
    for log in attention if pruned else ():
        log.addFilter(note)
    try:
        yield
    finally:
        logger.setLevel(previous)
        for log in attention:
            log.removeFilter(note)


def with_weights_on_disk(graph, scratch: Path, threshold: int = WEIGHTS_ON_DISK_BYTES):
    """The graph (a path or a ModelProto) with its weights moved to ``scratch/weights.bin``.

    ORT's optimizer copies the whole ModelProto for every symbolic shape inference and keeps the
    copies, and serializes it to save: a candidate's peak was several times the weights' size (docs/results/profile.md,
    "Memory"). With the weights on disk those copies hold names and shapes only.
    The fusions that read a weight's values (numpy_helper.to_array) find the file through
    ``weights_dir(scratch)`` around them."""
    import onnx

    model = onnx.load(str(graph)) if isinstance(graph, (str, Path)) else graph
    onnx.save_model(model, str(scratch / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=threshold)
    del model
    memory.release()
    return onnx.load(str(scratch / "model.onnx"), load_external_data=False)


def weights_back_in_graph(model, scratch: Path) -> None:
    """Load the weights left on disk back into their tensors as they were (no external-data marks
    left: the saved graph is byte for byte the one an in-memory fusion writes)."""
    from onnx import TensorProto
    from onnx.external_data_helper import load_external_data_for_model

    load_external_data_for_model(model, str(scratch))
    for tensor in model.graph.initializer:
        if tensor.data_location == TensorProto.DEFAULT:
            tensor.ClearField("data_location")  # loading sets it explicitly; the exporter never did


def build_fused(src_model: Path, out_model: Path, ctx: PassContext, disabled: tuple[str, ...],
                weights_threshold: int = WEIGHTS_ON_DISK_BYTES) -> dict[str, int]:
    import onnx
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.onnx_model import OnnxModel
    from onnxruntime.transformers.optimizer import optimize_model

    from xformopt.fusions import embed_layer_norm  # imports onnx, like the lines above: loaded when fusing

    fusion = FusionOptions(ctx.spec.ort_model_type)
    for switch in (*ctx.target.fusion_disabled, *disabled):
        setattr(fusion, switch, False)
    dynamo = is_dynamo_graph(load_graph(src_model))
    if dynamo:  # ORT's embedding fusion misreads dynamo graphs (a mask input of the wrong shape on RoBERTa);
        fusion.enable_embed_layer_norm = False  # xformopt's own (fusions/embed_layer_norm.py) runs after it
    graph = prepared_for_ort(src_model, out_model, attention="enable_attention" not in disabled,
                             rotary=not ctx.spec.family.decoder)
    out_model = Path(os.path.abspath(out_model))
    with tempfile.TemporaryDirectory(prefix=".weights-", dir=out_model.parent) as scratch, \
            warnings.catch_warnings(), quiet_fusion_logs(bool(ctx.spec.pruned)):
        warnings.simplefilter("ignore")
        graph = with_weights_on_disk(graph, Path(scratch), weights_threshold)
        with weights_dir(Path(scratch)):  # where ORT's fusions find the weights they read (see above)
            try:
                model = optimize_model(
                    graph if isinstance(graph, str) else copy.deepcopy(graph),  # (it edits a proto in place)
                    model_type=ctx.spec.ort_model_type,
                    # Pruned heads (config.pruned_heads) leave each layer its own head count: 0 makes ORT read
                    # num_heads and the attention width per layer from the graph's Reshape shapes.
                    num_heads=0 if ctx.spec.pruned else ctx.spec.num_heads,
                    hidden_size=0 if ctx.spec.pruned else ctx.spec.hidden_size,
                    optimization_options=fusion,
                    opt_level=0,  # python fusions only: the saved graph stays portable to any CPU
                )
            except RuntimeError as exc:
                # ORT 1.32's cascaded-Transpose clean-up drops a Transpose whose output a Shape still reads
                # (a one-head layer of a dynamo graph): keep onnxscript's fusions without ORT's pass.
                if not dynamo or "not a DAG" not in str(exc):
                    raise
                ctx.log(f"ONNX Runtime's optimizer failed on this graph ({str(exc)[:80]}); kept onnxscript's fusions")
                model = OnnxModel(graph if not isinstance(graph, str) else onnx.load(graph, load_external_data=False))
            own = ctx.spec.family.own_fusion
            if own and "enable_attention" not in disabled:
                # ORT's optimizer fuses no attention for this family: the family's own fusion does (in ORT's
                # Fusion style, on the same OnnxModel), e.g. xformopt/fusions/<family>.py.
                module, function = own.split(":")
                getattr(import_module(module), function)(model, ctx.spec)
            switched_off = {*ctx.target.fusion_disabled, *disabled}
            if dynamo and not ctx.spec.family.decoder and "enable_embed_layer_norm" not in switched_off:
                embed_layer_norm.fuse(model)  # ORT matches the TorchScript graph's embeddings only
        weights_back_in_graph(model.model, Path(scratch))
    model.save_model_to_file(str(out_model), use_external_data_format=needs_external_data(src_model))
    counts = fused_counts(model.model)
    del model, graph
    memory.release()  # ORT's OnnxModel and its fusions reference each other: freed only by the collector
    return counts


def split_candidate(base: Path, cdir: Path) -> tuple[int, dict[str, int]]:
    """``base``'s stage copied to ``cdir`` with its SkipLayerNormalizations split (split_norms.py): how many, and
    the fused-op counts of the graph written.

    Only the graph proto is rewritten: weights kept in a file beside it keep their relative location."""
    import onnx

    cdir.mkdir(parents=True, exist_ok=True)
    copy_stage(base, cdir)
    model = load_graph(cdir / "model.onnx")
    count = split_skip_norms(model)
    if count:
        onnx.save(model, str(cdir / "model.onnx"))
    return count, fused_counts(model)


def prepared_for_ort(src_model: Path, out_model: Path, attention: bool, rotary: bool = False):
    """The graph ORT's optimizer gets: a dynamo export first goes through onnxscript's ORT fusions
    (its attention fuses only there: xformopt/passes/export/dynamo.py), skipped when attention must stay
    unfused (``rotary``, for encoders: xformopt's rule for transformers 5's rotary too, xformopt/fusions/rotary.py);
    bias-less layer norms get a zero bias (ORT's SkipLayerNorm fusion crashes on them). The path itself
    when neither applies."""
    import onnx

    model = onnx.load(str(src_model), load_external_data=False)  # the graph alone: big weights stay on disk
    changed = False
    if attention and is_dynamo_graph(model):
        rewritten = out_model.with_name("onnxscript.onnx")
        onnxscript_fusions(src_model, rewritten, rotary=rotary)
        model = onnx.load(str(rewritten))
        rewritten.unlink()
        changed = True
    elif any(n.op_type == "LayerNormalization" and len(n.input) == 2 for n in model.graph.node):
        model = onnx.load(str(src_model))
    else:  # nothing to prepare: ORT reads the file itself (no in-memory proto: graphs over 2 GB load)
        return str(src_model)
    changed |= add_missing_layernorm_bias(model) > 0
    return model if changed else str(src_model)


def runtime_fusions(model_path: Path, scratch: Path) -> dict[str, int]:
    """What ONNX Runtime's own C++ optimizers fuse in a graph when a session loads it.

    Explains near-ties: ORT fuses parts of an unfused graph at load time (LayerNorm, Gelu, some
    attention patterns), so "unfused" is never fully unfused at run time.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(scratch / "runtime.onnx")
    ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    return {op: n for op, n in fused_counts(load_graph(scratch / "runtime.onnx")).items() if n}


def full_fusion_expectation(ctx: PassContext, before: dict[str, int] | None = None, src: Path | None = None) -> dict[str, int]:
    """What every layer must reach (the family's ``fused_per_layer``: BERT's one Attention and two SkipLayerNorms)."""
    config = read_config(src) if src is not None and (src / "config.json").is_file() else None
    return ctx.spec.family.expected_fusions(ctx.spec.num_layers, before, config)


class FusePass(Pass):
    name = "fuse"
    stage = "onnx"
    consumes = "onnx"
    produces = "onnx"
    Options = FuseOptions
    Record = FuseRecord
    must_not_follow = {"quantize": "fusions match float subgraphs; put fuse before quantize",
                       "int4": "fusions match float subgraphs; put fuse before int4"}
    summary = "ONNX Runtime transformer fusions (Attention, SkipLayerNorm, ...), counted and timed"
    needs = ("held-out texts (timing candidates)",)

    @staticmethod
    def report_facts(record: dict) -> dict:
        return {"fused_ops": {k: v for k, v in record["fused_kept"].items() if v},
                "fusion_kept": record["kept"], "fusion_reason": record["reason"]}

    @staticmethod
    def summarize(rec: dict) -> str:
        """One line: what the pass changed and how it was verified."""
        kept = ", ".join(f"{k} {v}" for k, v in rec["fused_kept"].items() if v) or "none"
        return f"kept {rec['kept']} ({kept}); {rec['reason']}"

    def run(self, ctx: PassContext, src: Path, dst: Path, options: FuseOptions) -> FuseRecord:
        if (own := OWN_GRAPH_RUNS.get(ctx.spec.task_def.graph)) is not None:  # two graphs, not model.onnx
            return own(ctx, src, dst, options)
        before = fused_counts(load_graph(src / "model.onnx"))
        work = dst / ".candidates"
        candidates: dict[str, Path] = {}
        counts: dict[str, dict[str, int]] = {}
        wanted = ["all"] if options.select == "all" else ["none"] if options.select == "none" else options.candidates
        split_counts: dict[str, int] = {}
        # "all" is always built: it proves fusability; a split candidate's base is built before it
        for name in dict.fromkeys(["all", *(n.removesuffix(SPLIT_NORMS) for n in wanted), *wanted]):
            cdir = work / name
            cdir.mkdir(parents=True)
            if name.endswith(SPLIT_NORMS):
                split_counts[name], counts[name] = split_candidate(candidates[name.removesuffix(SPLIT_NORMS)], cdir)
            elif name != "none":
                copy_stage(src, cdir)
                ctx.log(f"fusing ({name})")
                counts[name] = build_fused(src / "model.onnx", cdir / "model.onnx", ctx, CANDIDATES[name])
            else:
                copy_stage(src, cdir)
                counts[name] = before
            candidates[name] = cdir
        # a split that changed nothing is its base (timed once, under the base's name)
        wanted = list(dict.fromkeys(n if split_counts.get(n, 1) else n.removesuffix(SPLIT_NORMS) for n in wanted))

        expected = {**(full_fusion_expectation(ctx, before, src) if options.expect_full else {}), **options.expect}
        missing = {op: (reached(counts["all"], op), n) for op, n in expected.items() if reached(counts["all"], op) < n}
        if missing:
            detail = ", ".join(f"{op} {got}/{want}" for op, (got, want) in missing.items())
            raise PassFailed(f"fusion fell short of what was expected: {detail} (fused counts {counts['all']})")

        timings: dict[str, dict] = {}
        if options.select == "fastest" and len(wanted) > 1:
            timed = {name: candidates[name] for name in wanted}
            if ctx.host_runs_target:
                ctx.log(f"timing {', '.join(timed)} interleaved ({options.timing_rounds} rounds)")
                timings = stage_runs(ctx.spec).time_candidates(ctx, timed, options.timing_rounds)
                chosen, reason = choose(timings, options.tolerance)
            else:
                chosen, reason = "all", f"host lacks target {ctx.target.name}: not timed here, kept full fusion"
        else:
            chosen = wanted[0]
            reason = f"select={options.select}"

        graph_facts = stage_runs(ctx.spec).fusion_record(ctx.spec, counts["all"])  # decoders: attention fused?
        at_load = runtime_fusions(src / "model.onnx", work)
        for item in candidates[chosen].iterdir():
            shutil.move(str(item), dst / item.name)
        shutil.rmtree(work)
        dynamo = is_dynamo_graph(load_graph(src / "model.onnx"))
        return {
            "fusion_route": ("onnxscript.rewriter.ort_fusions, then ONNX Runtime's optimizer" if dynamo
                             else "ONNX Runtime's optimizer"),
            "fused_before": before,
            "fused_possible": counts["all"],
            "fused_kept": counts[chosen],
            "expected": expected,
            "ort_fuses_unfused_at_load": at_load,
            "kept": chosen,
            "reason": reason,
            "timings_ms": {name: {k: t[k] for k in ("median_ms", "p90_ms", "n")} for name, t in timings.items()},
            "split_norms": split_counts,
            **graph_facts,
        }


ATTENTION_OPS = ("Attention", "MultiHeadAttention")


def reached(counts: dict[str, int], op: str) -> int:
    """How many ``op`` a graph has, one layer's fused attention counted whichever fused op holds it
    (onnxscript writes MultiHeadAttention where packed Attention cannot hold the layer, e.g. one head)."""
    if op in ATTENTION_OPS:
        return sum(counts.get(name, 0) for name in ATTENTION_OPS)
    return counts.get(op, 0)


def choose(timings: dict[str, dict], tolerance: float) -> tuple[str, str]:
    """The most-fused candidate whose median is within ``tolerance`` of the fastest.

    Differences of a few percent at batch 1 are within run-to-run noise on a busy host; between
    near-equals the fused graph wins, because its fusions are fixed in the file (portable to any
    session setting) and quantize turns its Attention nodes into QAttention.
    """
    medians = {name: t["median_ms"] for name, t in timings.items()}
    fastest = min(medians.values())
    summary = ", ".join(f"{n} {m:.2f} ms" for n, m in sorted(medians.items(), key=lambda kv: kv[1]))
    chosen = preferred_within_tolerance(medians, FUSION_ORDER, tolerance)
    if medians[chosen] == fastest:
        return chosen, f"fastest median at batch 1 on this host ({summary})"
    return chosen, f"within {tolerance:.0%} of the fastest, and more fused (median at batch 1: {summary})"
