"""`optimize` for encoder-decoder models: every stage generates for the held-out sources and is scored
and timed against the PyTorch baseline.

Per stage (the report's rows, as for encoders):

- ``metrics``: the task's own against the references (BLEU and chrF, or ROUGE-1/2/L) with bootstrap
  95% intervals, the share of rows whose output equals the fp32 model's, and next-token agreement with
  it (teacher-forced on the baseline's greedy output);
- ``latency``: one sentence at batch 1 end to end (tokenize, generate with the model's generation
  config, greedy or beams, decode), all stages interleaved; ``tokens_per_s``: generated tokens over that time.

The artifact row adds its solo timing (repeats), its ``tokens_per_s`` over that solo timing (what
``xformopt bench`` re-measures), and ``step_cost_ms``: one cached decoder step after
1, 8, 32 and 128 earlier steps (those the model's positions allow), the evidence that decoding uses the cache (the cost grows only by the
attention's share). ``reference_outputs`` are the baseline's generated ids (padded with -1).
"""

from __future__ import annotations

import logging

import numpy as np

from xformopt.decoder.evaluate import solo_steps
from xformopt.measure.latency import compare, run_interleaved
from xformopt.models import load_tokenizer, position_limit
from xformopt.onnx_graph import dir_size_bytes
from xformopt.seq2seq import GRAPH_FILES
from xformopt.seq2seq.generate import GenerationSettings, decode_loop
from xformopt.seq2seq.measure import (
    decode,
    forced_agreement,
    generate_rows,
    padded,
    sentence_call,
    step_cost_by_length,
)
from xformopt.seq2seq.runner import OrtSeq2Seq, TorchSeq2Seq
from xformopt.seq2seq.search_graph import open_search_graph

_log = logging.getLogger(__name__)

MAX_NEW_TOKENS = 128  # a bound on evaluation time; generation stops at EOS first
AGREEMENT_ROWS = 64
STEP_LENGTHS = (1, 8, 32, 128)  # earlier steps before a timed cached step (those the positions allow)
UNIT = "one sentence end to end (batch 1: tokenize, generate, decode)"


def runner_for(stage, threads: int):
    """An ONNX stage runs as it is served: in its BeamSearch graph where it has one (``decode_loop`` says which)."""
    if stage.kind == "hf":
        return TorchSeq2Seq(stage.path, threads=threads)
    return OrtSeq2Seq(stage.path, threads=threads, search=open_search_graph(stage.path, threads))


def size_bytes(stage) -> int:
    if stage.kind == "onnx":
        return sum(p.stat().st_size for name in GRAPH_FILES for p in stage.path.glob(name + "*"))
    weights = [p for p in stage.path.iterdir() if p.suffix in (".safetensors", ".bin")]
    return sum(p.stat().st_size for p in weights) or dir_size_bytes(stage.path)


def generation_settings(model_dir, num_beams: int | None) -> GenerationSettings:
    """The model's generation config, bounded to MAX_NEW_TOKENS; ``num_beams`` None keeps the config's."""
    generation = GenerationSettings.from_model_dir(model_dir)
    return generation.with_(max_new_tokens=min(generation.max_new_tokens, MAX_NEW_TOKENS), num_beams=num_beams)


def solo_sentences(call, n: int, rounds: int, warmup: int, repeats: int) -> dict:
    """The artifact alone: ``repeats`` runs of ``rounds`` sentences (report["artifact"] and ``xformopt bench``)."""
    return {**solo_steps(call, n, rounds, warmup, repeats), "unit": UNIT}


def tokens_per_s(rows: list[list[int]], mean_ms: float) -> float:
    """Mean generated tokens per row over the mean call."""
    tokens = float(np.mean([len(r) for r in rows])) if rows else 0.0
    return tokens / (mean_ms / 1e3) if mean_ms else 0.0


def evaluate_seq2seq_stages(stages, spec, heldout, settings, threads: int,
                            progress=None) -> dict:
    task = spec.task_def
    tokenizer = load_tokenizer(spec.path, spec.trust_remote_code)
    generation = generation_settings(spec.path, settings.num_beams)
    runners = {s.name: runner_for(s, threads) for s in stages}
    base, final = stages[0].name, stages[-1].name
    texts = list(heldout.texts)
    rows, decoded = {}, {}
    for name, runner in runners.items():
        _log.info(f"generating with {name} for {len(texts)} held-out sources ({generation.num_beams} beam(s), "
            f"up to {generation.max_new_tokens} tokens)")
        rows[name] = generate_rows(runner, tokenizer, texts, generation)
        decoded[name] = decode(tokenizer, rows[name])
    few = texts[:AGREEMENT_ROWS]
    metrics = {}
    for name, runner in runners.items():
        agree = forced_agreement(runner, tokenizer, few, rows[base][:AGREEMENT_ROWS])
        metrics[name] = task.score_texts(decoded[name], decoded[base], heldout, settings.seed, next_token_agreement=agree)

    calls = {name: sentence_call(runner, tokenizer, texts, generation) for name, runner in runners.items()}
    _log.info(f"timing one generated sentence per stage, interleaved ({settings.latency_rounds} rounds, {threads} threads)")
    latency = run_interleaved(calls, len(texts), warmup=settings.warmup, iterations=settings.latency_rounds,
                              seed=settings.seed)
    speedup = compare(latency, base)
    _log.info(f"timing the artifact alone ({settings.repeats} repeats x {settings.latency_rounds} sentences)")
    solo = solo_sentences(calls[final], len(texts), settings.latency_rounds, settings.warmup, settings.repeats)
    positions = position_limit(spec.path)
    lengths = [n for n in STEP_LENGTHS if positions is None or n < positions - 1]
    _log.info(f"cached-step cost of the artifact after {lengths} earlier steps")
    steps = step_cost_by_length(runners[final], tokenizer, texts[0], lengths)

    per_stage = {s.name: {"metrics": metrics[s.name],
                          "latency": {**latency[s.name].to_dict(), "unit": UNIT, "tokens_per_s": tokens_per_s(rows[s.name], latency[s.name].mean_ms)},
                          "speedup": speedup[s.name], "size_bytes": size_bytes(s)} for s in stages}
    return {
        "stages": per_stage,
        "artifact": {"stage": final, "latency": solo, "metrics": metrics[final], "tokens_per_s": tokens_per_s(rows[final], solo["mean_ms"]),
                     "step_cost_ms": steps, "generation": {"num_beams": generation.num_beams,
                                                          "max_new_tokens": generation.max_new_tokens,
                                                          "decode_loop": decode_loop(runners[final], generation)},
                     "examples": [{"source": t, "output": o} for t, o in zip(texts[:3], decoded[final][:3])]},
        "reference_outputs": padded(rows[base]).astype(np.float32),
    }
