"""What a profile document holds, as types: schema ``xformopt.profile/1``, as ``xformopt profile DIR --json``
prints it and ``-o`` writes ``profile.json``, and as report.json carries it (``profile``: the same body less
the fields that describe the command's run, plus the profiled stage's name).

TypedDicts for the reason the report's are (``report/types.py``): the document is JSON, the dict stays the
wire format and these classes are its schema (docs/report-schema.md, "profile" and "Profile documents").
:func:`check_profile` holds a document to :class:`ProfileDocument` with the check the report and the pass
records use (``xformopt.typed_json``): strict in tests, a logged warning elsewhere.
"""

import logging
from typing import Any

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict  # pydantic needs typing_extensions' before 3.12

from xformopt.typed_json import check_typed, type_errors

# No `from __future__ import annotations`: evaluated annotations give each TypedDict its required keys.

_log = logging.getLogger(__name__)

_CLOSED = ConfigDict(extra="forbid")


@with_config(_CLOSED)
class ProfileSettings(TypedDict):
    batch: int
    seq: int | None  # None: each text at its own length
    runs: int
    warmup: int
    threads: int
    seed: int
    rows: int
    inputs: str


@with_config(_CLOSED)
class EndToEnd(TypedDict):
    median_ms: float
    mean_ms: float
    median_ms_profiling_off: float
    profiling_overhead: float | None


@with_config(_CLOSED)
class Accounted(TypedDict):
    operators_median_ms: float
    tokenization_median_ms: float
    operators_plus_tokenization_median_ms: float
    share_of_end_to_end_median: float
    median_share_per_request: float
    within_limit: bool
    limit: float
    ort_run_median_ms: float
    operators_share_of_ort_run: float | None


@with_config(_CLOSED)
class BreakdownRow(TypedDict):
    part: str
    kind: str  # operators | tokenizer | runtime
    ms: float
    share: float


@with_config(_CLOSED)
class OpTypeRow(TypedDict):
    op_type: str
    category: str
    ms: float
    calls_per_request: float
    share: float
    gflops_per_s: float | None


@with_config(_CLOSED)
class LayerRow(TypedDict):
    layer: str
    ms: float
    share: float


@with_config(_CLOSED)
class GemmRow(TypedDict):
    kind: str  # fp32 | int8 | int4 | attention
    ms: float
    gflop_per_request: float
    gflops_per_s: float | None
    peak_gflops_per_s: float | None
    fraction_of_peak: float | None


@with_config(_CLOSED)
class NodeRow(TypedDict):
    node: str
    op_type: str
    ms: float


@with_config(_CLOSED)
class GemmPeak(TypedDict):
    """``peak.gemm_peak``: this host's measured GEMM peak (cached per host and thread count)."""

    fp32_gflops: float
    int8_gflops: float
    threads: int
    shape: dict[str, int]
    host_fingerprint: str
    host: dict[str, Any]  # cpu_model, machine, cpu_flags, cores_usable
    load_average: float | None
    measured: str
    cached: bool


@with_config(_CLOSED)
class ProfileBody(TypedDict):
    """What ``measure.summarize`` and ``add_peak`` make: the part the command and the report share."""

    schema: str
    settings: ProfileSettings
    end_to_end: EndToEnd
    accounted: Accounted
    shares: dict[str, float]  # gemm, attention, layer norm, tokenization
    breakdown: list[BreakdownRow]
    op_types: list[OpTypeRow]
    layers: list[LayerRow]
    gemm_throughput: list[GemmRow]
    top_nodes: list[NodeRow]
    kernel_calls_unmapped_to_a_layer: int
    gemm_peak: GemmPeak


@with_config(_CLOSED)
class ReportProfile(ProfileBody):
    """report.json's ``profile``: the body and the profiled stage."""

    stage: str


@with_config(_CLOSED)
class ProfileError(TypedDict):
    """report.json's ``profile`` when the profile could not be made (the run still succeeds)."""

    error: str


@with_config(_CLOSED)
class ProfileDocument(ProfileBody):
    """The document of ``xformopt profile DIR`` (``--json``; ``profile.json`` under ``-o``)."""

    created: str
    artifact: str
    stage: str
    heldout: dict[str, Any]  # the bench plan's: source, rows, row_ids_sha256
    host: dict[str, Any]  # measure.host.host_info() (report/types.py's Host; the report stands above profiling)
    host_fingerprint: str
    trace: str | None  # "trace.json" under -o


def profile_errors(doc: dict) -> list[str]:
    """Where ``doc`` departs from :class:`ProfileDocument`: one line per field."""
    return type_errors(ProfileDocument, doc)


def check_profile(doc: dict) -> None:
    """Hold a profile document to :class:`ProfileDocument`: raise under ``XFORMOPT_STRICT_RECORDS=1`` (the
    test suite), log a warning otherwise."""
    check_typed("the profile document", ProfileDocument, doc, _log)
