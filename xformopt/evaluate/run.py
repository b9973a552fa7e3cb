"""Evaluate and time every stage on the same held-out rows, with the PyTorch model as the baseline.

Stage-to-stage comparisons are timed interleaved in one process so machine drift hits all stages
alike. The final artifact is additionally timed alone, in repeats: that is the figure
``xformopt bench`` reproduces and gates on (alone, as it will be served), with its spread.
"""

from __future__ import annotations

import logging

import numpy as np

from xformopt import progress as progress_events
from xformopt.decoder.evaluate import evaluate_decoder_stages
from xformopt.evaluate.baseline_store import baseline_outputs
from xformopt.evaluate.seq2seq import evaluate_seq2seq_stages
from xformopt.measure import memory, modes
from xformopt.measure.latency import compare
from xformopt.onnx_graph import dir_size_bytes
from xformopt.runtime.encoder import OrtPredictor, TorchPredictor

_log = logging.getLogger(__name__)


def stage_predictor(stage, spec, threads: int):
    if stage.kind == "hf":
        return TorchPredictor(spec, stage.path, threads=threads)
    return OrtPredictor(spec, stage.path, threads=threads)


def model_bytes(stage) -> int:
    """Size of the weights on disk (model.onnx or the checkpoint files), tokenizer excluded."""
    if stage.kind == "onnx":
        return sum(p.stat().st_size for p in stage.path.glob("model.onnx*"))
    weights = [p for p in stage.path.iterdir() if p.suffix in (".safetensors", ".bin")]
    return sum(p.stat().st_size for p in weights) or dir_size_bytes(stage.path)


def quality(task, outputs: dict[str, np.ndarray], baseline_name: str, heldout, seed: int) -> dict[str, dict]:
    baseline = outputs[baseline_name]
    return {name: task.score(out, baseline, heldout, seed) for name, out in outputs.items()}


def evaluate_stages(stages, spec, heldout, settings, threads: int, progress=None) -> dict:
    """Metrics and latency for every stage; returns per-stage results plus the artifact's solo timing.
    How depends on the task's graph (``EVALUATIONS``): decoders are scored on perplexity and timed per
    cached step, with a generation grid (xformopt/decoder/evaluate.py)."""
    return EVALUATIONS[spec.task_def.graph](stages, spec, heldout, settings, threads, progress)


def evaluate_encoder_stages(stages, spec, heldout, settings, threads: int,
                            progress=None) -> dict:
    """Every stage scored by the task on the held-out rows and timed interleaved per request."""
    report = progress or progress_events.report  # (label, done, total): a live bar or periodic lines

    def bar(label):
        return lambda done, total: report(label, done, total)

    # Every stage stays loaded: the interleaved timing below needs them all in one process. What each
    # holds (its load delta) and what scoring it adds on top are measured per stage.
    predictors, stage_memory = {}, {}
    for stage in stages:
        with memory.measured(f"load {stage.name}") as loaded:
            predictors[stage.name] = stage_predictor(stage, spec, threads)
        stage_memory[stage.name] = {"load": loaded.to_dict()}
    outputs, read_from_disk = {}, {}
    for stage in stages:
        name, predictor = stage.name, predictors[stage.name]
        _log.info(f"evaluating {name} on {len(heldout)} held-out rows")
        with memory.measured(f"evaluate {name}") as scored:
            if stage is stages[0]:  # the baseline: the same model on the same rows is scored once (a search's trials)
                outputs[name], read_from_disk[name] = baseline_outputs(stage, spec, heldout, predictor, threads,
                                                                       bar(f"evaluating {name} (rows)"))
            else:
                outputs[name] = predictor.predict_data(heldout, progress=bar(f"evaluating {name} (rows)"))
        stage_memory[name]["evaluate"] = scored.to_dict()
    metrics = quality(spec.task_def, outputs, stages[0].name, heldout, settings.seed)
    texts, pairs = spec.task_def.timing_inputs(heldout)

    _log.info(f"timing {len(predictors)} stages interleaved at batch 1 ({settings.latency_rounds} rounds, {threads} threads)")
    latency = modes.real(predictors, texts, pairs, rounds=settings.latency_rounds,
                         warmup=settings.warmup, seed=settings.seed, progress=bar("latency (real, interleaved)"))
    speedup = compare(latency, stages[0].name)
    final = stages[-1].name
    _log.info(f"timing the artifact alone ({settings.repeats} repeats x {settings.latency_rounds} rounds)")
    artifact_latency = modes.solo_repeats(predictors[final], texts, pairs,
                                          rounds=settings.latency_rounds, warmup=settings.warmup,
                                          repeats=settings.repeats, seed=settings.seed,
                                          progress=bar(f"latency ({final} alone, {settings.repeats} repeats)"))
    extra = {}
    if "fixed" in settings.modes:
        _log.info(f"timing fixed shapes: batch {settings.batch} x seq {settings.seq}")
        extra["fixed"] = modes.fixed(predictors, texts, settings.batch, settings.seq,
                                     rounds=settings.fixed_rounds, warmup=2, seed=settings.seed, progress=bar("latency (fixed grid)"))
    if "throughput" in settings.modes:
        _log.info(f"measuring throughput at batch sizes {settings.batch}")
        extra["throughput"] = modes.throughput(predictors, texts, pairs, settings.batch, seed=settings.seed,
                                               progress=bar("throughput (passes)"))
    if "model" in settings.modes:
        _log.info(f"timing the model call alone, every text tokenized beforehand ({settings.latency_rounds} rounds)")
        model_only = modes.model_call(predictors, texts, pairs, rounds=settings.latency_rounds, warmup=settings.warmup,
                                      seed=settings.seed, progress=bar("latency (model call, interleaved)"))
        extra["model_call"] = {name: stats.to_dict() for name, stats in model_only.items()}
    per_stage = {
        name: {
            "metrics": metrics[name],
            "latency": latency[name].to_dict(),
            "speedup": speedup[name],
            "size_bytes": model_bytes(stage),
            "memory": stage_memory[name],
            **({"outputs_read_from_disk": True} if read_from_disk.get(name) else {}),
        }
        for name, stage in ((stage.name, stage) for stage in stages)
    }
    return {
        "stages": per_stage,
        "artifact": {"stage": final, "latency": artifact_latency, "metrics": metrics[final]},
        "reference_outputs": outputs[stages[0].name],
        **extra,
    }


EVALUATIONS = {"encoder": evaluate_encoder_stages, "decoder": evaluate_decoder_stages,
               "seq2seq": evaluate_seq2seq_stages}
