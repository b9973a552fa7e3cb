"""Generation benchmark: time to first token, per-token latency and tokens/s, with and without the
KV cache, for several runners (PyTorch, ONNX fp32, INT8...) in one interleaved run.

For every (prompt length, new tokens) cell, each round runs every (runner, cache mode) pair once,
in an order shuffled per round (seeded), so machine drift lands on all of them alike (see
:mod:`xformopt.measure.latency`). Each run generates exactly ``new_tokens`` tokens greedily (EOS is
ignored, so every run does the same work) from a prompt of real held-out text cut to the length.

- ``ttft_ms``: the prompt step plus picking the first token (median over rounds);
- ``per_token_ms``: every later token's step, pooled over rounds (p50/p90/p99);
- ``tokens_per_s``: new tokens / total generation time (median over rounds);
- ``cache_speedup``: per runner, median total time without the cache / with it.
"""

from __future__ import annotations

import logging
import random
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from xformopt import cache
from xformopt.artifact import read_manifest
from xformopt.data import load_text_dataset
from xformopt.decoder.generate import Sampling, context_window, generate
from xformopt.decoder.traffic import achieved_gb_per_s, onnx_step_bytes
from xformopt.errors import InputError
from xformopt.measure import host as host_facts
from xformopt.measure.host import host_fingerprint, host_info
from xformopt.models import load_tokenizer
from xformopt.resources import vader_split_path
from xformopt.runtime.decoder import OrtDecoder, TorchDecoder
from xformopt.runtime.session import thread_pool_setting

_log = logging.getLogger(__name__)

CACHE_MODES = {"cache": True, "no_cache": False}


def prompt_of(tokenizer, texts, length: int) -> list[int]:
    """Exactly ``length`` tokens of real text (texts concatenated as needed)."""
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(" " + text if ids else text)["input_ids"])
        if len(ids) >= length:
            return ids[:length]
    if not ids:
        raise ValueError("no texts to build a prompt from")
    while len(ids) < length:  # tiny corpora: repeat
        ids.extend(ids[: length - len(ids)])
    return ids[:length]


def _percentiles(values_s: list[float]) -> dict:
    ms = np.asarray(values_s, dtype=np.float64) * 1000
    if ms.size == 0:
        return {"p50_ms": None, "p90_ms": None, "p99_ms": None, "n": 0}
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return {"p50_ms": float(p50), "p90_ms": float(p90), "p99_ms": float(p99), "mean_ms": float(ms.mean()), "n": int(ms.size)}


def summarize_runs(runs) -> dict:
    totals = [r.total_s for r in runs]
    return {
        "ttft_ms": float(np.median([r.first_token_s for r in runs]) * 1000),
        "per_token": _percentiles([s for r in runs for s in r.step_s]),
        "tokens_per_s": float(np.median([r.tokens_per_s for r in runs])),
        "total_ms": float(np.median(totals) * 1000),
        "rounds": len(runs),
    }


def bench_generation(
    runners: dict[str, object],
    tokenizer,
    texts,
    prompt_lengths: list[int],
    new_tokens: list[int],
    *,
    cache_modes: tuple[str, ...] = ("cache", "no_cache"),
    rounds: int = 3,
    warmup: int = 1,
    seed: int = 0,
) -> dict:
    """Time every runner x cache mode at every (prompt length, new tokens), interleaved per round."""
    cells = []
    for prompt_len in prompt_lengths:
        prompt = prompt_of(tokenizer, texts, prompt_len)
        for n_new in new_tokens:
            pairs = [(name, mode) for name in runners for mode in cache_modes]
            runs: dict[tuple[str, str], list] = {pair: [] for pair in pairs}
            _log.info(f"generation bench: prompt {prompt_len} tokens, {n_new} new tokens, {len(pairs)} variants x {rounds} rounds")
            for name, mode in pairs:  # warm-up: first calls pay for allocations and kernel choice
                for _ in range(warmup):
                    generate(runners[name], prompt, min(n_new, 4), Sampling(), use_cache=CACHE_MODES[mode])
            rng = random.Random(seed)
            order = list(pairs)
            tokens: dict[tuple[str, str], list[int]] = {}
            for _ in range(rounds):
                rng.shuffle(order)
                for pair in order:
                    result = generate(runners[pair[0]], prompt, n_new, Sampling(), use_cache=CACHE_MODES[pair[1]])
                    runs[pair].append(result)
                    tokens[pair] = result.new_ids
            results: dict[str, dict] = {}
            for (name, mode), r in runs.items():
                results.setdefault(name, {})[mode] = summarize_runs(r)
            cache_speedup = {
                name: modes["no_cache"]["total_ms"] / modes["cache"]["total_ms"]
                for name, modes in results.items() if "cache" in modes and "no_cache" in modes
            }
            first = next(iter(runners))
            same_tokens = {f"{name}/{mode}": tokens[(name, mode)] == tokens[(first, cache_modes[0])] for name, mode in pairs}
            cells.append({"prompt_tokens": prompt_len, "new_tokens": n_new, "results": results,
                          "cache_speedup": cache_speedup, f"same_tokens_as_{first}": same_tokens})
    return {"cells": cells, "settings": {"rounds": rounds, "warmup": warmup, "seed": seed, "batch": 1,
                                          "decoding": "greedy, EOS ignored", "cache_modes": list(cache_modes)}}


# --------------------------------------------------------------------------- `xformopt bench` on a decoder artifact

GENERATION_BENCH_SCHEMA = "xformopt.generation-bench/1"


def plan_stages(artifact, compare=(), pytorch: bool = True):
    """What to time: the PyTorch model the manifest names, earlier stages still in the pass cache,
    ``compare`` directories, then the artifact. Returns ({name: (kind, path)}, notes)."""
    artifact = Path(artifact)
    if not (artifact / "model.onnx").is_file():
        raise InputError(f"{artifact} has no model.onnx; pass a decoder artifact (the -o folder of export, fuse, quantize or optimize)")
    manifest = {}
    if (artifact / "manifest.json").is_file():
        manifest = read_manifest(artifact)
    notes: list[str] = []
    stages: dict[str, tuple[str, Path]] = {}
    source = (manifest.get("input") or {}).get("path")
    if pytorch:
        if source and (Path(source) / "config.json").is_file():
            stages["pytorch"] = ("hf", Path(source))
        else:
            notes.append("PyTorch baseline skipped: the manifest names no input model that exists here")
    passes = manifest.get("passes") or []
    for entry in passes[:-1]:
        hit = cache.lookup(entry["cache_key"]) if entry.get("cache_key") else None
        if hit and (hit[0] / "model.onnx").is_file():
            stages[entry["pass"]] = ("onnx", hit[0])
        else:  # a decoder's chain has ONNX stages only (its task takes no torch pass)
            notes.append(f"stage {entry.get('pass')!r} not timed: not in the pass cache (pass it with --compare DIR)")
    for directory in compare:
        directory = Path(directory)
        if not (directory / "model.onnx").is_file():
            raise InputError(f"--compare {directory}: no model.onnx there; pass an ONNX decoder stage directory")
        name = directory.name or str(directory)
        while name in stages:
            name += "'"
        stages[name] = ("onnx", directory)
    final = passes[-1]["pass"] if passes else "artifact"
    while final in stages:
        final += "'"
    stages[final] = ("onnx", artifact)
    return stages, notes


def bench_artifact(artifact, *, compare=(), pytorch: bool = True, prompt_lengths=(16, 64), new_tokens=(32, 128),
                   cache_modes=("cache", "no_cache"), rounds: int = 3, threads: int | None = None, seed: int = 0) -> dict:
    """The generation bench document for a decoder artifact (schema ``xformopt.generation-bench/1``)."""
    stages, notes = plan_stages(artifact, compare, pytorch)
    context = context_window(artifact)
    longest = max(prompt_lengths) + max(new_tokens)
    if context and longest > context:
        raise InputError(f"--prompt-tokens {max(prompt_lengths)} + --new-tokens {max(new_tokens)} = {longest} exceeds the "
                         f"model's context window of {context} tokens; use shorter lengths")
    threads = threads or host_facts.usable_cpus()
    runners = {name: TorchDecoder(path, threads=threads) if kind == "hf" else OrtDecoder(path, threads=threads)
               for name, (kind, path) in stages.items()}
    tokenizer = load_tokenizer(artifact)

    texts = load_text_dataset(vader_split_path("test"), label_column="", limit=None, seed=seed).texts
    _log.info(f"timing {', '.join(stages)}: prompts {list(prompt_lengths)} x new tokens {list(new_tokens)}, "
        f"{' and '.join(cache_modes)}, {rounds} interleaved rounds, {threads} threads")
    doc = bench_generation(runners, tokenizer, texts, list(prompt_lengths), list(new_tokens), cache_modes=tuple(cache_modes),
                           rounds=rounds, seed=seed)
    traffic = add_traffic(doc["cells"], stages, notes)
    host = host_info()
    return {
        "schema": GENERATION_BENCH_SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "artifact_path": str(artifact),
        "stages": {name: str(path) for name, (_, path) in stages.items()},
        "settings": {**doc["settings"], "threads": threads, "prompt_tokens": list(prompt_lengths),
                     "new_tokens": list(new_tokens), "thread_pools": thread_pool_setting(),
                     "prompts": "real held-out text (vendored VADER test split) cut to length"},
        "host": host,
        "host_fingerprint": host_fingerprint(host),
        "cells": doc["cells"],
        "bytes_per_token": traffic,
        "notes": notes,
    }


def add_traffic(cells: list[dict], stages: dict, notes: list[str]) -> dict:
    """Bytes each ONNX stage reads per cached decode step (xformopt.decoder.traffic), and in each cell the
    step's bytes at its mean cached length (prompt + half the new tokens) and the GB/s its p50 achieves.
    Returns {stage: weights by role, KV bytes per position}."""
    per_stage = {}
    for name, (kind, path) in stages.items():
        if kind != "onnx":
            continue
        try:
            per_stage[name] = onnx_step_bytes(path)
        except Exception as exc:  # noqa: BLE001 - a figure beside the timings, never worth the bench
            notes.append(f"bytes per token of {name} not counted ({type(exc).__name__}: {exc})")
    for cell in cells:
        positions = cell["prompt_tokens"] + cell["new_tokens"] // 2
        for name, modes in cell["results"].items():
            if name in per_stage and "cache" in modes:
                total = per_stage[name].at(positions)["total"]
                modes["cache"]["bytes_per_token"] = total
                modes["cache"]["gb_per_s"] = achieved_gb_per_s(total, modes["cache"]["per_token"]["p50_ms"])
    return {name: {**step.at(0), "kv_per_position": step.kv_per_position} for name, step in per_stage.items()}
