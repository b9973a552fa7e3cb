"""What a bench document holds, as types: schema ``xformopt.bench/1`` (``xformopt bench --json`` / ``-o``,
``xformopt.bench()``), with its ``comparison`` (the gate's result) down to each check.

TypedDicts for the reason the report's are (``report/types.py``): the document *is* JSON that CI jobs
read with jq and later runs read back as a ``--baseline``, so the dict stays the wire format (keys, their
order and values unchanged) and these classes are its schema (docs/report-schema.md, "Bench documents").
The sections a bench shares with the report (the artifact's solo latency, its metrics, the host) are the
report's own types.

:func:`check_bench` holds a document to :class:`BenchDocument` with the check the report and the pass records
use (``xformopt.typed_json``): strict in tests, a logged warning elsewhere.
"""

import logging
from typing import Any

from pydantic import ConfigDict, with_config
from typing_extensions import NotRequired, TypedDict  # pydantic needs typing_extensions' before 3.12

from xformopt.report.types import ArtifactLatency, Host, Metrics
from xformopt.typed_json import check_typed, type_errors

# No `from __future__ import annotations`: evaluated annotations give each TypedDict its required keys.

_log = logging.getLogger(__name__)

_CLOSED = ConfigDict(extra="forbid")


@with_config(_CLOSED)
class BenchModel(TypedDict):
    """What the artifact's report or manifest says the model is (None where neither says)."""

    source: str | None
    model_type: str | None
    task: str | None


@with_config(_CLOSED)
class BenchHeldout(TypedDict):
    source: str
    rows: int
    row_ids_sha256: str  # the sampled rows' ids, hashed: two documents on other rows never compare


@with_config(_CLOSED)
class BenchSettings(TypedDict):
    mode: str  # "real"
    batch: int  # 1
    threads: int
    rounds: int
    warmup: int
    repeats: int
    seed: int
    heldout: BenchHeldout
    thread_pools: str


@with_config(_CLOSED)
class BenchArtifact(TypedDict):
    stage: str
    latency: ArtifactLatency
    metrics: Metrics
    # encoder-decoders: decoded tokens per second over the solo timing, and the generation settings used
    tokens_per_s: NotRequired[float]
    generation: NotRequired[dict[str, int | str]]  # num_beams, max_new_tokens, decode_loop


@with_config(_CLOSED)
class Mismatch(TypedDict):
    """A setting or host field that differs between the baseline and this run."""

    field: str
    baseline: Any
    current: Any
    hint: NotRequired[str]  # settings only: the flag that makes the runs comparable


@with_config(_CLOSED)
class Limits(TypedDict, total=False):
    max_latency_regression: float  # a fraction (0.05 is 5%)
    max_accuracy_drop_points: float | None  # None: the metric check was skipped under a relative limit
    max_accuracy_drop: str  # as given, where it was relative ("1%")


@with_config(_CLOSED)
class Check(TypedDict):
    """One check of the gate: the latency median or the headline metric."""

    name: str
    kind: str  # latency | metric
    unit: str  # ms | points
    baseline: float | None
    current: float | None
    change: float | None
    change_pct: NotRequired[float]  # latency
    change_points: NotRequired[float | None]  # metric
    limit: float | None
    limit_relative: NotRequired[str]  # metric, a limit given relative to the baseline ("1%")
    tolerance: float
    threshold: float | None
    verdict: str  # pass | regression | skipped
    message: str
    evidence: dict[str, Any]


@with_config(_CLOSED)
class Comparison(TypedDict):
    """``gate.compare`` / ``gate.no_comparison``: the bench gate's result."""

    baseline: str | None
    baseline_schema: str | None
    baseline_created: str | None
    gated: bool
    comparable: bool
    settings_mismatch: list[Mismatch]
    host_mismatch: list[Mismatch]
    host_mismatch_allowed: bool
    reason: str | None
    limits: Limits
    checks: list[Check]
    latency_only: NotRequired[str]  # gated on latency alone: neither run has the headline metric
    passed: bool


@with_config(_CLOSED)
class BenchDocument(TypedDict):
    """The bench document, schema ``xformopt.bench/1``."""

    schema: str
    created: str
    artifact_path: str
    model: BenchModel
    target: str | None
    headline_metric: str
    settings: BenchSettings
    host: Host
    host_fingerprint: str
    artifact: BenchArtifact
    notes: list[str]
    comparison: Comparison


def bench_errors(doc: dict) -> list[str]:
    """Where ``doc`` departs from :class:`BenchDocument`: one line per field."""
    return type_errors(BenchDocument, doc)


def check_bench(doc: dict) -> None:
    """Hold a bench document to :class:`BenchDocument`: raise under ``XFORMOPT_STRICT_RECORDS=1`` (the test
    suite), log a warning otherwise (the measurement is still good)."""
    check_typed("the bench document", BenchDocument, doc, _log)
