"""`optimize` for decoders: every stage scored and timed against the PyTorch baseline.

Per stage (the report's rows, same shape as for encoders):

- ``metrics.perplexity``: on the held-out texts (each truncated to ``PPL_WINDOW`` tokens), with a
  bootstrap 95% interval over texts; ``metrics.next_token_agreement``: how often the stage's argmax
  at each position equals the baseline's (Wilson interval);
- ``latency``: one cached decode step at batch 1 (one new token after a real held-out prompt of
  ``STEP_PROMPT`` tokens), all stages interleaved: the per-token cost of serving;
- ``generation`` (report-level): time to first token, per-token percentiles and tokens/s with and
  without the cache at ``PROMPTS`` x ``NEW_TOKENS``, all stages interleaved (:mod:`.bench`).

``reference_outputs`` (saved to ``reference/``) are the baseline's summed NLL and token count per text.
"""

from __future__ import annotations

import logging

import numpy as np

from xformopt.decoder.bench import bench_generation
from xformopt.decoder.generate import context_window
from xformopt.decoder.perplexity import summarize, text_nll
from xformopt.measure.latency import compare, run_interleaved
from xformopt.models import load_tokenizer
from xformopt.onnx_graph import dir_size_bytes
from xformopt.runtime.decoder import OrtDecoder, TorchDecoder
from xformopt.scoring.metrics import proportion

_log = logging.getLogger(__name__)

PPL_WINDOW = 128
STEP_PROMPT = 32
STEP_PROMPTS = 8
PROMPTS = (16, 64)
NEW_TOKENS = (32,)
GENERATION_ROUNDS = 3


def runners_for(stages, spec, threads: int) -> dict:
    return {s.name: (TorchDecoder(s.path, threads=threads, trust_remote_code=spec.trust_remote_code) if s.kind == "hf"
                     else OrtDecoder(s.path, threads=threads)) for s in stages}


def step_calls(runners: dict, tokenizer, texts, prompt_tokens: int = STEP_PROMPT, prompts: int = STEP_PROMPTS):
    """Per runner, ``call(i)`` = one cached decode step after real prompt i (prefilled once, untimed)."""
    cases = []
    for text in texts:
        ids = list(tokenizer(text)["input_ids"])
        if len(ids) > prompt_tokens:
            cases.append((np.asarray(ids[:prompt_tokens], dtype=np.int64)[None], np.asarray([[ids[prompt_tokens]]])))
        if len(cases) == prompts:
            break
    if not cases:  # short texts only: the first text, whatever its length
        ids = list(tokenizer(texts[0])["input_ids"]) or [0]
        cases = [(np.asarray(ids, dtype=np.int64)[None], np.asarray([[ids[-1]]]))]
    calls = {}
    for name, runner in runners.items():
        states = [runner.forward(prompt)[1] for prompt, _ in cases]
        calls[name] = (lambda i, r=runner, s=states: r.forward(cases[i][1], s[i], last_only=True))
    return calls, len(cases)


def solo_steps(call, n: int, rounds: int, warmup: int, repeats: int) -> dict:
    """The artifact alone: ``repeats`` runs of ``rounds`` cached steps (the shape of modes.solo_repeats)."""
    stats = [run_interleaved({"m": call}, n, warmup=warmup if r == 0 else 0, iterations=rounds, seed=r)["m"]
             for r in range(repeats)]
    medians = [s.median_ms for s in stats]
    pooled = {k: float(np.median([getattr(s, k) for s in stats]))
              for k in ("median_ms", "p90_ms", "p99_ms", "mean_ms", "std_ms", "min_ms", "throughput_per_s")}
    return {**pooled, "n": sum(s.n for s in stats), "repeats": repeats, "repeat_medians_ms": medians,
            "spread_ms": (max(medians) - min(medians)) / 2 if len(medians) > 1 else 0.0,
            "unit": "one cached decode step (batch 1)"}


def evaluate_decoder_stages(stages, spec, heldout, settings, threads: int,
                            progress=None) -> dict:
    encoder_only = [m for m in settings.modes if m != "real"]
    if encoder_only:  # said, not silently dropped: a decoder's timing is its decode step and generation
        _log.info(f"latency modes {', '.join(encoder_only)} time encoders; this decoder's report times one cached "
            "decode step (no tokenization) and greedy generation")
    runners = runners_for(stages, spec, threads)
    tokenizer = load_tokenizer(spec.path, spec.trust_remote_code)
    limit = min(PPL_WINDOW, context_window(spec.path) or PPL_WINDOW)  # one forward per text, no cache
    lists = [list(tokenizer(text)["input_ids"])[:limit] for text in heldout.texts]  # one per held-out row
    base = stages[0].name
    nll: dict[str, list] = {name: [] for name in runners}
    argmax: dict[str, list] = {name: [] for name in runners}
    for name, runner in runners.items():
        _log.info(f"scoring {name}: perplexity on {len(lists)} held-out texts")
        for ids in lists:
            if len(ids) < 2:  # nothing to predict; kept as a (0, 0) row so reference/ aligns with the rows
                nll[name].append((0.0, 0))
                argmax[name].append(np.zeros(0, dtype=np.int64))
                continue
            batch = np.asarray(ids, dtype=np.int64)[None]
            logits = runner.forward(batch, None, use_cache=False)[0][0, :-1]
            nll[name].append(text_nll(logits, ids))
            argmax[name].append(logits.argmax(-1))
    metrics = {}
    for name in runners:
        rows = np.asarray(nll[name], dtype=np.float64)
        rows = rows[rows[:, 1] > 0]
        same = np.concatenate([a == b for a, b in zip(argmax[name], argmax[base])])
        metrics[name] = {"perplexity": summarize(rows, settings.seed), "next_token_agreement": proportion(same)}

    calls, n_inputs = step_calls(runners, tokenizer, heldout.texts)
    _log.info(f"timing one cached decode step per stage, interleaved ({settings.latency_rounds} rounds, {threads} threads)")
    latency = run_interleaved(calls, n_inputs, warmup=settings.warmup, iterations=settings.latency_rounds, seed=settings.seed)
    speedup = compare(latency, base)
    final = stages[-1].name
    _log.info(f"timing the artifact alone ({settings.repeats} repeats x {settings.latency_rounds} cached steps)")
    artifact_latency = solo_steps(calls[final], n_inputs, settings.latency_rounds, settings.warmup, settings.repeats)
    context = context_window(spec.path)
    prompts = [p for p in PROMPTS if not context or p + max(NEW_TOKENS) <= context]
    generation = None
    if prompts:
        _log.info(f"generation benchmark: prompts {prompts} x new tokens {list(NEW_TOKENS)}, with and without the cache")
        generation = bench_generation(runners, tokenizer, heldout.texts, prompts, list(NEW_TOKENS),
                                      rounds=GENERATION_ROUNDS, seed=settings.seed)
    else:
        _log.info(f"note: no generation benchmark: the context window ({context}) is shorter than "
            f"{min(PROMPTS)} + {max(NEW_TOKENS)} tokens")

    def size(stage) -> int:
        if stage.kind == "onnx":
            return sum(p.stat().st_size for p in stage.path.glob("model.onnx*"))
        weights = [p for p in stage.path.iterdir() if p.suffix in (".safetensors", ".bin")]
        return sum(p.stat().st_size for p in weights) or dir_size_bytes(stage.path)

    per_stage = {s.name: {"metrics": metrics[s.name], "latency": {**latency[s.name].to_dict(), "unit": "one cached decode step (batch 1)"},
                          "speedup": speedup[s.name], "size_bytes": size(s)} for s in stages}
    return {
        "stages": per_stage,
        "artifact": {"stage": final, "latency": artifact_latency, "metrics": metrics[final]},
        "reference_outputs": np.asarray(nll[base], dtype=np.float32),
        **({"generation": generation} if generation else {}),
    }
