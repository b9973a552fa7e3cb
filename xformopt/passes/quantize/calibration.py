"""Static-quantization helpers for the quantize pass: calibration texts, a streaming data reader,
bounded-memory calibration, graph preparation, and per-node harm scores for the accuracy budget.

Bounded memory. ONNX Runtime's calibrators keep every intermediate output of every batch they are
fed until ``compute_data``. Its ``CalibMaxIntermediateOutputs`` option is meant to flush them in
chunks, but in the installed onnxruntime (1.32) ``MinMaxCalibrater.collect_data`` *clears* the
chunk without computing its range first (the missing ``compute_data()`` of
microsoft/onnxruntime#18893 / PR #20226): every chunk but the last is silently dropped, and a batch
count that is an exact multiple raises "No data is collected". Histogram calibrators (Entropy,
Percentile) ignore the option altogether. So this module does the chunking itself: the reader
yields one tokenized batch at a time, and ``calibrate`` calls ``collect_data`` once per chunk of
``chunk_batches`` batches; each call ends by merging the chunk (min/max ranges, or histograms) and
clearing it. At most ``chunk_batches`` batches of intermediate outputs are held, for every method.
``tests/passes/test_quantize_static.py`` pins the ORT behaviour, so an upgrade that fixes it is noticed.

The ranges are saved with ORT's calibration cache format and every quantization candidate of the
accuracy-budget search reuses them: one calibration per pass, however many candidates.

SmoothQuant: not shipped. ORT's ``quantize_static(extra_options={"SmoothQuant": True})`` imports
``neural_compressor.adaptor.ox_utils``, which neural-compressor 3.x removed with its ONNX Runtime
backend. INC 3.10's torch SmoothQuant (``neural_compressor.torch.algorithms.smooth_quant``) traces
LayerNorm->Linear pairs with ``torch.jit`` and hands quantization to IPEX, which is not installed
here, so only its scale formula (``cal_scale``: s = max|X|^a / max|W|^(1-a) per input channel)
would be usable; a pass built on that alone was not measured in the time of issue 4 and a pass
that cannot show its effect does not ship. What helps the budget here instead: Percentile/Entropy
calibration and returning the most harmful nodes to float.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from xformopt import progress
from xformopt.artifact import copy_stage
from xformopt.data import TextDataset
from xformopt.models import load_tokenizer
from xformopt.onnx_graph import load_graph
from xformopt.passes.quantize.outliers import RANGE_TEXTS
from xformopt.runtime.session import ort_feed, ort_session

_log = logging.getLogger(__name__)

METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}


def row_ids_hash(dataset: TextDataset) -> str:
    return hashlib.sha256(",".join(map(str, dataset.row_ids)).encode()).hexdigest()[:16]


def dataset_record(dataset: TextDataset, role: str) -> dict:
    return {"role": role, "path": dataset.path, "source": dataset.source, "rows": len(dataset),
            "row_ids_sha256": row_ids_hash(dataset)}


def outlier_workspace(ctx, src: Path, work: Path, options) -> tuple[tuple, Path, TextDataset] | None:
    """What both quantize routes (encoder, encoder-decoder) start outlier treatment from: the family's rules,
    a float copy of the stage under ``work`` to treat, and the train rows the ranges are read on. None when
    the family has no rules or ``outlier_rules`` is off."""
    rules = ctx.spec.family.int8_outliers if options.outlier_rules else ()
    if not rules:
        return None
    treated = work / "outliers"
    treated.mkdir()
    copy_stage(src, treated, with_model=False)
    rows = load_split(options.calibration_data, "train", ctx.spec, RANGE_TEXTS, 0, labels=False)
    return rules, treated, rows


def load_split(path: str | None, default_split: str, spec, limit: int | None, seed: int, labels: bool) -> TextDataset:
    """A user file (in the task's formats, as --data) or the task's vendored split; labels mapped through
    the model's, or none read (``labels`` False)."""
    task = spec.task_def
    source = Path(path) if path else task.default_data(default_split)
    return task.load(source, label2id=(spec.label2id or None) if labels else None, limit=limit, seed=seed,
                     columns={"label": None if labels else ""}, require_labels=False)


def dataset_reader(spec, stage: Path, rows: TextDataset, *, graph: Path | None = None, batch_size: int = 8):
    """A TextBatchReader over ``rows`` as requests carry them (the task's timing inputs), tokenized with
    ``stage``'s tokenizer for the inputs of ``graph`` (default: the stage's model.onnx)."""
    texts, pairs = spec.task_def.timing_inputs(rows)
    return TextBatchReader(load_tokenizer(stage, spec.trust_remote_code), texts,
                           graph_input_names(graph or stage / "model.onnx"), batch_size=batch_size, pairs=pairs,
                           task=spec.task_def)


class TextBatchReader:
    """ORT CalibrationDataReader over texts: tokenizes one batch per ``get_next`` (never all at once).

    ``max_batch_rows`` and ``batches`` record what was really yielded; ``chunk(n)`` is a view that
    stops after ``n`` batches so the calibrator can be fed (and flushed) chunk by chunk.
    """

    def __init__(self, tokenizer, texts: Sequence[str], input_names: Sequence[str], batch_size: int = 8,
                 max_length: int = 128, pairs: Sequence[str] | None = None, task=None):
        self.tokenizer = tokenizer
        self.task = task  # xformopt.tasks.Task: batches are encoded the task's way (3-D for multiple choice)
        self.texts = list(texts)
        self.pairs = list(pairs) if pairs is not None else None
        self.input_names = list(input_names)
        self.batch_size = batch_size
        self.max_length = max_length
        self.position = 0
        self.batches = 0
        self.max_batch_rows = 0

    def __len__(self) -> int:
        return (len(self.texts) + self.batch_size - 1) // self.batch_size

    def rewind(self) -> None:
        self.position = 0

    @property
    def exhausted(self) -> bool:
        return self.position >= len(self.texts)

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.position >= len(self.texts):
            return None
        end = self.position + self.batch_size
        texts = self.texts[self.position:end]
        pairs = self.pairs[self.position:end] if self.pairs is not None else None
        self.position = end
        if self.task is not None:
            encoded = self.task.encode(self.tokenizer, texts, pairs, self.max_length)
        else:
            encoded = self.tokenizer(texts, pairs, padding=True, truncation=True, max_length=self.max_length,
                                     return_tensors="np")
        feed = ort_feed(encoded, self.input_names)
        self.batches += 1
        self.max_batch_rows = max(self.max_batch_rows, len(texts))
        return feed

    def chunk(self, n: int):
        return _Chunk(self, n)


class FeedReader:
    """The calibration reader over feed dicts already built (the seq2seq graphs' inputs, recorded while
    the float graphs generated: :mod:`xformopt.seq2seq.feeds`), one feed a batch; the interface of
    :class:`TextBatchReader` that :func:`calibrate` and :func:`harm_scores` use."""

    def __init__(self, feeds: Sequence[dict[str, np.ndarray]]):
        self.feeds = list(feeds)
        self.batch_size = max((len(next(iter(f.values()))) for f in self.feeds), default=0)
        self.position = 0
        self.batches = 0
        self.max_batch_rows = 0

    def __len__(self) -> int:
        return len(self.feeds)

    def rewind(self) -> None:
        self.position = 0

    @property
    def exhausted(self) -> bool:
        return self.position >= len(self.feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.exhausted:
            return None
        feed = self.feeds[self.position]
        self.position += 1
        self.batches += 1
        self.max_batch_rows = max(self.max_batch_rows, len(next(iter(feed.values()))))
        return feed

    def chunk(self, n: int):
        return _Chunk(self, n)


class _Chunk:
    """A view of a reader that stops after ``n`` batches, so the calibrator is fed (and flushed) chunk by chunk."""

    def __init__(self, parent, n: int):
        self.parent, self.left = parent, n

    def get_next(self):
        if self.left <= 0:
            return None
        self.left -= 1
        return self.parent.get_next()


def graph_input_names(model_path: Path) -> list[str]:
    model = load_graph(model_path)
    initializers = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in initializers]


def prepare_for_static(src: Path, dst: Path) -> dict:
    """Type every tensor of a (possibly fused) graph so ORT's calibrator and quantizer see it.

    ONNX shape inference cannot type the outputs of ORT's contrib ops (Attention,
    SkipLayerNormalization, EmbedLayerNormalization, BiasGelu); the calibrator then skips those
    tensors, so the MatMuls they feed get no activation range: QDQ quantizes their weights only
    and QOperator crashes. ORT's symbolic shape inference knows the contrib ops. (``quant_pre_process``
    runs the same inference plus an ORT graph optimization that would rewrite the fused graph.)
    """
    import onnx
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    model = onnx.load(str(src))
    before = len(model.graph.value_info)
    try:
        inferred = SymbolicShapeInference.infer_shapes(model, auto_merge=True, guess_output_rank=False)
        how = "symbolic (onnxruntime.tools.symbolic_shape_infer)"
    except Exception as error:  # noqa: BLE001 - ORT's inference raises anything on an op pattern it cannot follow
        # Dynamo graphs (the seq2seq exports) can trip it; ONNX's own inference types the standard ops,
        # which is all an unfused graph has.
        _log.info(f"symbolic shape inference failed on {src.name} ({type(error).__name__}: {error}); "
                  "using onnx.shape_inference")
        inferred = onnx.shape_inference.infer_shapes(model)
        how = f"onnx.shape_inference (symbolic failed: {type(error).__name__})"
    onnx.save(inferred, str(dst))
    return {"shape_inference": how, "typed_tensors": len(inferred.graph.value_info), "typed_before": before}


def calibrate(model_path: Path, reader: TextBatchReader, method: str, op_types: Sequence[str], cache_path: Path,
              workdir: Path, *, chunk_batches: int = 16, symmetric: bool = False, percentile: float = 99.999) -> dict:
    """Activation ranges for ``model_path`` from ``reader``, in chunks; saved to ``cache_path``."""
    from onnxruntime.quantization.calibrate import (
        CalibrationMethod,
        create_calibrator,
        save_tensors_data,
    )

    options: dict = {"symmetric": symmetric}
    if method == "percentile":
        options["percentile"] = percentile
    started = time.perf_counter()
    calibrator = create_calibrator(
        Path(model_path), list(op_types), augmented_model_path=str(workdir / "augmented.onnx"),
        calibrate_method=getattr(CalibrationMethod, METHODS[method]), extra_options=options,
    )
    if method != "minmax":
        # ORT's HistogramCollector stacks a chunk's outputs with np.asarray, so every batch of a chunk
        # must have the same sequence length; batches are padded to their own longest text, so the
        # histogram methods take one batch per chunk (histograms still merge across chunks).
        chunk_batches = 1
    total = len(reader)
    chunks = 0
    reader.rewind()
    while not reader.exhausted:
        with contextlib.redirect_stdout(io.StringIO()):  # ORT prints histogram progress to stdout
            calibrator.collect_data(reader.chunk(chunk_batches))  # merges the chunk, then clears it
        chunks += 1
        progress.report(f"calibrating ({METHODS[method]}, batches)", reader.batches, total)
        if chunks % max(1, 16 // chunk_batches) == 0 or reader.batches == total:
            _log.info(f"calibrating ({METHODS[method]}): {reader.batches}/{total} batches")
    with contextlib.redirect_stdout(io.StringIO()):
        ranges = calibrator.compute_data()
    save_tensors_data(ranges, cache_path)
    del calibrator
    return {
        "method": METHODS[method], "batches": reader.batches, "batch_size": reader.batch_size,
        "max_batch_rows": reader.max_batch_rows, "chunk_batches": chunk_batches, "chunks": chunks,
        "tensors": len(ranges.data), "seconds": round(time.perf_counter() - started, 2),
    }


# --------------------------------------------------------------------------- harm scores


def _fake_quant(x: np.ndarray, lo, hi, qmin: int, qmax: int, symmetric: bool) -> np.ndarray:
    lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
    if symmetric:
        bound = np.maximum(np.abs(lo), np.abs(hi))
        scale = np.where(bound > 0, 2 * bound / (qmax - qmin), 1.0)
        zero = 0.0 if qmin < 0 else float((qmin + qmax + 1) // 2)
    else:
        scale = np.where(hi > lo, (hi - lo) / (qmax - qmin), 1.0)
        zero = np.round(qmin - lo / scale)
    return (np.clip(np.round(x / scale) + zero, qmin, qmax) - zero) * scale


def harm_scores(model_path: Path, nodes: list[dict], reader: TextBatchReader, formats: dict,
                ranges: dict | None, scratch_dir: Path, max_batches: int = 4) -> dict[str, float]:
    """Per-node quantization error: mean over output channels c of ||(Q(X)Q(W) - XW)_c|| / ||(XW)_c||
    for each weighted GEMM, alone.

    X are the node's real float inputs (one run of the float graph with those tensors exposed), W its
    weight; both are fake-quantized as the pass will (weights symmetric int8, per-channel and
    reduce-range per the formats; activations from the calibrated range in static mode, per batch
    in dynamic mode). Local, so an early node is not blamed for errors it merely passed on. Costs one
    float run on a few batches plus a matmul per node, against one quantize + evaluate per node for
    leave-one-out sensitivity (24 nodes on MiniLM: minutes instead of seconds).
    """
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(model_path))
    weights = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            weights[node.output[0]] = node.attribute[0].t
    by_name = {n.name: n for n in model.graph.node}
    wanted = []
    for g in nodes:
        node = by_name[g["name"]]
        if node.input[0] not in {o.name for o in model.graph.output}:
            model.graph.output.append(helper.make_tensor_value_info(node.input[0], onnx.TensorProto.FLOAT, None))
        wanted.append(node)
    scratch = Path(scratch_dir) / "harm.onnx"
    onnx.save(model, str(scratch))
    session = ort_session(scratch, threads=None)
    names = [o.name for o in session.get_outputs()]
    acts: dict[str, list[np.ndarray]] = {}
    reader.rewind()
    planned = min(max_batches, len(reader))
    for b in range(max_batches):
        feed = reader.get_next()
        if feed is None:
            break
        progress.report("ranking GEMMs by harm (batches)", b + 1, planned)
        mask = feed.get("attention_mask")
        for name, value in zip(names, session.run(None, feed)):
            if mask is not None and value.ndim == 3 and value.shape[:2] == mask.shape:
                value = value[mask.astype(bool)]  # real tokens only: padding is not served
            acts.setdefault(name, []).append(value.reshape(-1, value.shape[-1]))
    scratch.unlink()

    wq = 64 if formats["reduce_range"] else 127
    a_signed = formats["activation_type"] == "int8"
    aq = (-128, 127) if a_signed else (0, 255)
    scores = {}
    for node in wanted:
        w = numpy_helper.to_array(weights[node.input[1]]).astype(np.float32)
        if node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute):
            w = w.T
        bound = np.abs(w).max(axis=0, keepdims=True) if formats["per_channel"] else np.abs(w).max()
        scale = np.where(bound > 0, bound / wq, 1.0)
        w_q = np.clip(np.round(w / scale), -wq, wq) * scale
        num = den = np.zeros(w.shape[1])
        for x in acts.get(node.input[0], []):
            if ranges is not None and node.op_type != "Attention" and node.input[0] in ranges:  # static range
                lo, hi = ranges[node.input[0]]
            else:  # dynamic: this batch's range
                lo, hi = float(x.min()), float(x.max())
            x_q = _fake_quant(x, lo, hi, *aq, symmetric=formats["activation_symmetric"])
            ref = x @ w
            num = num + ((x_q @ w_q - ref) ** 2).sum(axis=0)
            den = den + (ref ** 2).sum(axis=0)
        # per output channel, then averaged: one outlier channel must not hide the rest's damage
        live = den > 0
        scores[node.name] = float(np.sqrt(num[live] / den[live]).mean()) if live.any() else 0.0
    return scores


def tensor_ranges(cache_path: Path) -> dict[str, tuple[float, float]]:
    from onnxruntime.quantization.calibrate import load_tensors_data

    data = load_tensors_data(cache_path)
    out = {}
    for name, value in data.data.items():
        lo, hi = value.range_value
        out[name] = (float(np.min(lo)), float(np.max(hi)))
    return out
