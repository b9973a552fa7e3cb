"""How the passes run and measure a stage, per kind of graph (``Task.graph``).

An encoder graph answers a request in one forward (``OrtPredictor``); a decoder graph takes a prompt
step, then one cached step per new token (``OrtDecoder``, xformopt/decoder/). Fuse times its candidates
and records what fused, quantize and int4 measure a quantized graph against the float one, through the
class of the model's graph kind below: no pass tests what kind of model it has.

The classes call the timers and measures by their module names at call time (not stored references),
so a test that decides timing races by replacing ``time_stage_dirs`` / ``time_decoder_dirs`` reaches them.
"""

from __future__ import annotations

from pathlib import Path

from xformopt.decoder.fusion import attention_record, logits_agreement, time_decoder_dirs
from xformopt.models import ModelSpec
from xformopt.passes.base import PassContext
from xformopt.passes.timing import time_stage_dirs
from xformopt.runtime.encoder import OrtPredictor

AGREEMENT_ROWS = 32


def output_agreement(ctx: PassContext, float_dir: Path, int8_dir: Path) -> dict:
    """The task's per-row agreement (cosine of logits or embeddings, span or tag agreement) of INT8
    outputs with float outputs on real rows: catches saturation and broken scales."""
    rows = ctx.sample_data.subset(range(min(AGREEMENT_ROWS, len(ctx.sample_data))))
    ref = OrtPredictor(ctx.spec, float_dir, threads=ctx.threads).predict_data(rows)
    got = OrtPredictor(ctx.spec, int8_dir, threads=ctx.threads, tokenizer_dir=float_dir).predict_data(rows)
    agree = ctx.spec.task_def.agreement(got, ref)
    return {"measure": ctx.spec.task_def.agreement_measure, "mean_agreement": float(agree.mean()),
            "min_agreement": float(agree.min()), "texts": len(rows)}


class EncoderRuns:
    """Encoder graphs: a request is one forward at batch 1 over real rows as the task serves them."""

    @staticmethod
    def time_candidates(ctx: PassContext, dirs: dict[str, Path], rounds: int) -> dict[str, dict]:
        return time_stage_dirs(ctx, dirs, rounds)

    @staticmethod
    def agreement(ctx: PassContext, float_dir: Path, quantized_dir: Path) -> dict:
        return output_agreement(ctx, float_dir, quantized_dir)

    @staticmethod
    def fusion_record(spec: ModelSpec, counts: dict[str, int]) -> dict:
        """Nothing beyond the counts: ``expect_full`` already fails a pass whose attention does not fuse."""
        return {}


class DecoderRuns:
    """KV-cache decoder graphs: timed as one cached decode step, compared on logits at every position."""

    @staticmethod
    def time_candidates(ctx: PassContext, dirs: dict[str, Path], rounds: int) -> dict[str, dict]:
        return time_decoder_dirs(ctx, dirs, rounds)

    @staticmethod
    def agreement(ctx: PassContext, float_dir: Path, quantized_dir: Path) -> dict:
        return logits_agreement(ctx, float_dir, quantized_dir)

    @staticmethod
    def fusion_record(spec: ModelSpec, counts: dict[str, int]) -> dict:
        """Whether attention fused, loud when it did not: a family exported without onnxruntime-genai's
        builder is expected to fuse its norms and rotary embeddings only (xformopt/decoder/fusion.py)."""
        return {"decoder": attention_record(spec, counts)}


RUNS: dict[str, type[EncoderRuns] | type[DecoderRuns]] = {"encoder": EncoderRuns, "decoder": DecoderRuns}


def stage_runs(spec: ModelSpec) -> type[EncoderRuns] | type[DecoderRuns]:
    """How a stage of ``spec``'s model runs and is measured (its task's ``graph``)."""
    return RUNS[spec.task_def.graph]
