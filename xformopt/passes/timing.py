"""Timing shared by the passes that pick among candidate graphs (fuse, quantize's budget search).

Both time their candidates the same way (interleaved batch-1 calls on real texts, see
:func:`xformopt.measure.latency.run_interleaved`) and pick the same way: among candidates whose
median is within a tolerance of the fastest, the most preferred one wins, because differences of a
few percent at batch 1 are run-to-run noise on a busy host. The model code lives here, not in
``xformopt.measure.latency``, which stays free of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Hashable, Iterable, Mapping, TypeVar

from xformopt import progress
from xformopt.measure.latency import run_interleaved
from xformopt.runtime.encoder import OrtPredictor

if TYPE_CHECKING:
    from xformopt.data import TextDataset

K = TypeVar("K", bound=Hashable)

TIMED_TEXTS = 64
WARMUP_CALLS = 5


def time_stage_dirs(
    ctx,
    dirs: Mapping[str, Path],
    rounds: int,
    data: TextDataset | None = None,
    tokenizer_dir: Path | None = None,
    tokenizer_dirs: Mapping[str, Path] | None = None,
) -> dict[str, dict]:
    """Time the ONNX stage directories ``dirs`` interleaved at batch 1 on up to 64 real requests.

    ``data``: the rows to time on [default: ``ctx.sample_data``], each request as the task serves it
    (``Task.timing_inputs``: a question with its context, a context with its choices); ``tokenizer_dir``:
    where the tokenizer lives when the directories have none of their own [default: each directory].
    Every candidate is fed the same encodings (tokenized once, by the first candidate's tokenizer), except those
    named in ``tokenizer_dirs``, which read the same texts through their own tokenizer (a pretrained student of
    another vocabulary). Returns each name's latency summary (:meth:`LatencyStats.to_dict`).
    """
    own = dict(tokenizer_dirs or {})
    predictors = {name: OrtPredictor(ctx.spec, d, threads=ctx.threads, tokenizer_dir=own.get(name, tokenizer_dir))
                  for name, d in dirs.items()}
    first = next(iter(predictors.values()))
    texts, pairs = ctx.spec.task_def.timing_inputs(ctx.sample_data if data is None else data)

    def encode(p) -> list:
        return [p.tokenize([texts[i]], None if pairs is None else [pairs[i]]) for i in range(min(TIMED_TEXTS, len(texts)))]

    shared = encode(first)
    encoded = {name: encode(p) if name in own else shared for name, p in predictors.items()}
    calls = {name: (lambda i, p=p, e=encoded[name]: p.run_encoded(e[i])) for name, p in predictors.items()}
    stats = run_interleaved(calls, len(shared), warmup=WARMUP_CALLS, iterations=rounds,
                            progress=progress.tracker(f"timing {len(calls)} candidates (rounds)"))
    return {name: s.to_dict() for name, s in stats.items()}


def preferred_within_tolerance(medians: Mapping[K, float], preference: Iterable[K], tolerance: float) -> K:
    """The first of ``preference`` (most preferred first) whose median is within ``tolerance`` of the
    fastest: ``median <= fastest * (1 + tolerance)`` (exactly at the limit counts as within).

    Names in ``preference`` without a median are skipped; the fastest always qualifies, so a
    preference that lists every timed name always yields one."""
    fastest = min(medians.values())
    return next(name for name in preference if name in medians and medians[name] <= fastest * (1 + tolerance))
