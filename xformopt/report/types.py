"""What report.json holds, as types: every field of schema ``xformopt.report/1`` (docs/report-schema.md),
with its value type, from the top level down to a latency's percentiles.

TypedDicts rather than dataclasses for the reason the pass records are (``passes/records.py``): the report
*is* JSON. ``report/build.py`` writes it, ``xformopt report`` and ``xformopt bench`` read it back from
files older runs wrote, and CI jobs read it with jq, so the dict stays the wire format (its keys, their
order and values unchanged) and these classes are its schema. A field the report always has is
``Required``; one that appears only when it was measured (*optional* in the docs) is not.

Where the docs fix a section's fields, the type forbids others, so a field added to the report without
its row in docs/report-schema.md fails the test suite (tests/report/test_report_types.py also checks each
documented table against these types). Where a section carries names that vary per model (stages,
metrics, operators) the key is ``str``; a metric object may carry a task's own counts beside the shared
fields; ``profile`` (schema ``xformopt.profile/1``) is typed in ``profiling/types.py``, and ``generation``'s
cells (their own schema) are typed at their top only.

:func:`check_report` holds a report to :class:`Report` the way the pipeline holds a pass to its record type
(``xformopt.typed_json``): strict in tests, a logged warning elsewhere.
"""

import logging
from typing import Any

from pydantic import ConfigDict, with_config
from typing_extensions import NotRequired, Required, TypedDict  # pydantic needs typing_extensions' before 3.12

from xformopt.profiling.types import ProfileError, ReportProfile
from xformopt.typed_json import check_typed, type_errors

# No `from __future__ import annotations` here: evaluated annotations are what give each TypedDict its
# required and optional keys (tests/report/test_report_types.py reads them against the docs).

_log = logging.getLogger(__name__)

_CLOSED = ConfigDict(extra="forbid")


@with_config(_CLOSED)
class LatencyStats(TypedDict):
    """``measure.latency.LatencyStats.to_dict()``: times in ms."""

    n: int
    median_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    throughput_per_s: float


@with_config(_CLOSED)
class StageLatency(LatencyStats, total=False):
    unit: str  # decoders and seq2seq: what one timed call is (a cached decode step, a generated sentence)
    tokens_per_s: float  # seq2seq: mean generated tokens over the mean call


@with_config(_CLOSED)
class ArtifactLatency(StageLatency, total=False):
    """The artifact timed alone: each field the median over the repeats (``n`` their total)."""

    repeats: Required[int]
    repeat_medians_ms: Required[list[float]]
    spread_ms: Required[float]


@with_config(ConfigDict(extra="allow"))  # a task adds its own counts (entities, skipped rows, k, ...)
class Metric(TypedDict, total=False):
    value: Required[float]
    n: int
    ci95: list[float]  # [low, high]
    stderr: float
    p1: float
    train_rows: int  # probe_accuracy
    texts: int  # perplexity


Metrics = dict[str, Metric]  # metric name -> metric object


@with_config(_CLOSED)
class MemoryBlock(TypedDict):
    """``measure.memory`` block ``to_dict()``: RSS in MB."""

    peak_rss_mb: float
    start_rss_mb: float
    peak_delta_mb: float
    end_rss_mb: float
    child_processes: int
    children_peak_rss_mb: float
    method: str


# what the pass that made the stage, loading it and scoring it took; "pass" is a keyword, hence the functional form
StageMemory = with_config(_CLOSED)(TypedDict("StageMemory", {"pass": MemoryBlock, "load": MemoryBlock,
                                                             "evaluate": MemoryBlock}, total=False))


@with_config(_CLOSED)
class GraphFacts(TypedDict, total=False):
    """What an ONNX stage's graph holds so far (the passes' ``report_facts``, inherited stage to stage)."""

    fused_ops: dict[str, int]
    fusion_kept: str
    fusion_reason: str
    int8_gemms: int
    matmulnbits: dict[str, Any]  # int4: MatMulNBits nodes and their bits and blocks
    weighted_gemms: int
    float_gemms: list[str]


@with_config(_CLOSED)
class StageRow(TypedDict):
    name: str
    kind: str  # pytorch | onnx
    size_bytes: int
    metrics: Metrics
    delta_to_baseline: dict[str, float]
    latency: StageLatency
    speedup: float
    graph: NotRequired[GraphFacts]  # ONNX stages only
    memory: StageMemory
    outputs_read_from_disk: NotRequired[bool]  # the baseline's held-out outputs from an earlier run (evaluate/baseline_store.py)


@with_config(_CLOSED)
class Model(TypedDict):
    source: str
    model_type: str
    task: str


@with_config(_CLOSED)
class Heldout(TypedDict):
    path: str | None
    source: str
    rows: int


@with_config(_CLOSED)
class Settings(TypedDict):
    mode: str
    batch: int
    threads: int
    heldout: Heldout
    rounds: int
    warmup: int
    repeats: int
    seed: int
    thread_pools: str


@with_config(_CLOSED)
class Host(TypedDict):
    """``measure.host.host_info()``."""

    cpu_model: str
    machine: str
    cpu_flags: list[str]
    int8_gemm_saturates: bool | None
    cores_logical: int | None
    cores_usable: int
    memory_total_gb: float | None
    os: str
    python: str
    versions: dict[str, str]
    onnxruntime_providers: list[str]
    forced_facts: NotRequired[dict[str, str | None]]  # tests and demos: the CPU facts were forced by environment


@with_config(_CLOSED)
class Artifact(TypedDict):
    stage: str
    latency: ArtifactLatency
    metrics: Metrics
    # seq2seq: the artifact's generation figures beside its timing
    tokens_per_s: NotRequired[float]
    step_cost_ms: NotRequired[Any]
    generation: NotRequired[dict[str, int | str]]  # num_beams, max_new_tokens, decode_loop
    examples: NotRequired[list[dict[str, str]]]


@with_config(_CLOSED)
class MemorySummary(TypedDict):
    peak_rss_mb: float
    peak_in: str | None
    passes: dict[str, float]
    evaluation: MemoryBlock | None


@with_config(_CLOSED)
class FixedCell(LatencyStats):
    stage: str
    batch: int
    seq: int


@with_config(_CLOSED)
class Throughput(TypedDict):
    samples_per_s: float
    best_batch: int
    by_batch: dict[int, float]  # batch size -> samples/s ("8" in JSON)


@with_config(_CLOSED)
class GenerationSettings(TypedDict):
    rounds: int
    warmup: int
    seed: int
    batch: int
    decoding: str
    cache_modes: list[str]


@with_config(_CLOSED)
class Generation(TypedDict):
    cells: list[dict[str, Any]]  # one per (prompt_tokens, new_tokens): results per stage and cache mode
    settings: GenerationSettings


@with_config(_CLOSED)
class ShapeSearch(TypedDict):
    """``recipe_search/shapes.py``'s record of the prune shape it chose for this task."""

    max_accuracy_drop: Any  # as given: points (a number) or a string such as "1%"
    allowed_points: float
    validation: dict[str, Any]  # source, rows, fp32_metric
    order: str
    ordering: dict[str, Any] | None  # order measured: each shape's untrained student timed on this host (None: FLOPs)
    max_minutes: float
    seconds: float
    tried: list[dict[str, Any]]  # one per shape: its shape, status, metric, drop, latency, why
    latency: dict[str, Any] | None  # how the tried artifacts were timed together (None: not timed)
    kept: dict[str, Any]
    why: str


@with_config(_CLOSED)
class Report(TypedDict, total=False):
    """report.json, schema ``xformopt.report/1``."""

    schema: Required[str]
    created: Required[str]
    model: Required[Model]
    target: Required[str]
    target_on_host: Required[bool]
    headline_metric: Required[str]
    settings: Required[Settings]
    host: Required[Host]
    host_fingerprint: Required[str]
    stages: Required[list[StageRow]]
    artifact: Required[Artifact]
    memory: MemorySummary  # absent in reports written before it existed
    fixed: list[FixedCell]
    throughput: dict[str, Throughput]
    model_call: dict[str, LatencyStats]
    generation: Generation
    shape_search: ShapeSearch
    profile: ReportProfile | ProfileError  # schema xformopt.profile/1 less its run's fields, or {"error": ...}


def report_errors(report: dict) -> list[str]:
    """Where ``report`` departs from :class:`Report`: one line per field (undeclared, missing, wrong type)."""
    return type_errors(Report, report)


def check_report(report: dict) -> None:
    """Hold a report to :class:`Report`: raise under ``XFORMOPT_STRICT_RECORDS=1`` (the test suite), log a
    warning otherwise (a report that reads fine but says a little more or less must not cost the artifact)."""
    check_typed("the report", Report, report, _log)
