"""Latency of the front candidates, measured serially and interleaved on this host (like `bench`).

Trials that ran side by side slowed each other down by amounts that depend on what else ran, so
their latencies only steer the sampler. Here every candidate, the PyTorch fp32 baseline and the
reference INT8 artifact run one after another on the same text in shuffled order, round after
round, with the host's own threads: drift hits all of them alike.
"""

from __future__ import annotations

from pathlib import Path

from xformopt.measure.host import host_info
from xformopt.measure.modes import real
from xformopt.runtime.encoder import OrtPredictor, TorchPredictor


def remeasure(spec, candidates: dict[str, Path], texts, pairs, *, rounds: int, warmup: int, threads: int,
              seed: int = 0, include_pytorch: bool = True, progress=None) -> dict:
    predictors = {name: OrtPredictor(spec, path, threads=threads) for name, path in candidates.items()}
    if include_pytorch:
        predictors = {"pytorch": TorchPredictor(spec, threads=threads), **predictors}
    stats = real(predictors, texts, pairs, rounds=rounds, warmup=warmup, seed=seed, progress=progress)
    host = host_info()
    return {
        "mode": "real", "batch": 1, "rounds": rounds, "warmup": warmup, "threads": threads, "seed": seed,
        "rows": len(texts), "host": {k: host.get(k) for k in ("cpu_model", "machine", "cores_usable", "int8_gemm_saturates")},
        "latency": {name: s.to_dict() for name, s in stats.items()},
    }
