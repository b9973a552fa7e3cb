"""What each pass's record holds, as types: the top-level keys a pass writes into ``manifest.json``
(``passes[].record``) and the report reads, with their value types.

TypedDicts rather than dataclasses because the record *is* JSON: it is cached beside the stage, written
into manifests and read back by ``xformopt report``/``bench`` from files older runs wrote, so the dict
stays the wire format and these classes are its schema. A key a pass writes always is ``Required``; one it
writes in some configurations only (a budget, a decoder's attention note, a seq2seq model's two graphs)
is optional. Nested values are typed where their shape is fixed and plain ``dict`` where they carry
per-model names (ops, graph inputs, layers).

:func:`check_record` holds a pass to its type (with ``xformopt.typed_json``, which holds the report to
``report/types.py`` the same way): tests run every pass with it strict (a key or a value type the type does
not declare fails the run); elsewhere a mismatch is logged, never fatal for a user's run.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ConfigDict, with_config
from typing_extensions import Required, TypedDict  # pydantic validates typing_extensions TypedDicts before 3.12

from xformopt.typed_json import STRICT_ENV, check_typed, type_errors  # noqa: F401  (STRICT_ENV: read here by tests)

_log = logging.getLogger("xformopt.passes")

Counts = dict[str, int]  # op type -> nodes


@with_config(ConfigDict(extra="forbid"))
class Timing(TypedDict):
    median_ms: float
    p90_ms: float
    n: int


@with_config(ConfigDict(extra="forbid"))
class ExportRecord(TypedDict, total=False):
    exporter: Required[str]  # which exporter wrote the graph, in words
    opset: Required[int]
    inputs: Required[list[str]]
    outputs: Required[list[str]]
    parity: Required[dict[str, Any]]  # against PyTorch: worst differences, lengths checked
    nodes: int
    dynamic_axes: dict[str, list[str | int]]
    task: str  # decoders and seq2seq: the graph's task
    cache_layout: str  # decoders: how past key/values are laid out
    past_inputs: int
    step0: str
    fused: Counts  # the genai builder fuses while it writes
    expected_fused: Counts
    decoder: dict[str, Any]  # attention fused per layer, and why not where not
    graphs: dict[str, Any]  # seq2seq: encoder.onnx and decoder.onnx
    search_graph: dict[str, Any]  # seq2seq: generate.onnx (the decode loop in ORT's BeamSearch op) or why none


@with_config(ConfigDict(extra="forbid"))
class FuseRecord(TypedDict, total=False):
    fusion_route: Required[str]
    fused_before: Required[Counts]
    fused_possible: Required[Counts]  # the "all" candidate: what fusion can reach
    fused_kept: Required[Counts]
    expected: Required[Counts]
    kept: Required[str]  # the candidate written
    reason: Required[str]
    timings_ms: Required[dict[str, Timing]]
    ort_fuses_unfused_at_load: dict[str, Any]
    split_norms: dict[str, int]  # each *_split_norms candidate built: SkipLayerNormalizations it split
    decoder: dict[str, Any]
    fused_by_graph: dict[str, Counts]  # seq2seq
    onnxscript_rewrites: dict[str, Any]
    slim: dict[str, Any]  # seq2seq: per graph, nodes before and after xformopt/seq2seq/slim.py's rewrites
    fused_parity: dict[str, Any]
    search_graph: dict[str, Any]  # seq2seq: generate.onnx (the decode loop in ORT's BeamSearch op) or why none


@with_config(ConfigDict(extra="forbid"))
class QuantizeRecord(TypedDict, total=False):
    mode: Required[str]  # dynamic | static
    formats: Required[dict[str, Any]]
    coverage: Required[dict[str, Any]]  # INT8 GEMMs, the ones kept float and why
    agreement: Required[dict[str, Any]]
    verdict: Required[dict[str, Any]]  # passed, checks, the option values that would accept
    format_search: dict[str, Any]
    outliers: dict[str, Any]  # the family's outlier rules: GEMMs smoothed, split or kept float
    calibration: dict[str, Any]  # static: rows, method, tensors
    budget: dict[str, Any]
    budget_met: bool
    graphs: list[str]  # seq2seq
    coverage_by_graph: dict[str, dict[str, Any]]
    untied_heads: dict[str, list[str]]  # seq2seq dynamic: per graph, the nodes that read a weight transposed (a tied LM head), given their own copy to go INT8
    search_graph: dict[str, Any]  # seq2seq: generate.onnx (the decode loop in ORT's BeamSearch op) or why none


@with_config(ConfigDict(extra="forbid"))
class Int4Record(TypedDict, total=False):
    mode: Required[str]
    algorithm: Required[str]
    block_size: Required[int]
    symmetric: Required[bool]
    accuracy_level: Required[int]
    weighted_matmuls: Required[int]
    block_sizes: dict[str, int]  # per-role block sizes over block_size
    requantize: list[str]  # roles quantized again though the GGUF file had their blocks
    kv_cache: dict[str, Any]  # int8: the cache's type and its calibrated scales
    matmulnbits: Required[dict[str, Any]]
    int8_matmuls: Required[list[dict[str, Any]]]
    kept_float: Required[list[dict[str, Any]]]
    size_bytes: Required[dict[str, int]]
    agreement: Required[dict[str, Any]]
    calibration: dict[str, Any]  # gptq
    gguf: dict[str, Any]  # blocks carried from a GGUF file
    fused_projections: dict[str, Any]  # same-input MatMuls packed as one: groups, node counts, parity
    budget: dict[str, Any]
    budget_met: bool


@with_config(ConfigDict(extra="forbid"))
class PruneRecord(TypedDict, total=False):
    flops_formula: Required[str]
    reference_length: Required[int]
    sample_mean_length: Required[float]
    target: Required[dict[str, Any]]
    strategy: Required[str]
    simd_multiple: Required[int]
    sparsity_achieved: Required[dict[str, float]]
    before: Required[dict[str, Any]]
    after: Required[dict[str, Any]]
    params: Required[dict[str, int]]
    removed_layers: Required[list[int]]
    kept_layers: Required[list[int]]
    pruned_heads: Required[dict[str, list[int]]]
    importance: Required[Any]
    candidates: Required[list[Any]]
    chosen: Required[str]
    selection: Required[dict[str, Any]]
    quality_before_recovery: Required[dict[str, Any]]
    weights_sha256: Required[str]
    latency: dict[str, Any]  # measure_latency: the pruned graph timed against the unpruned one


@with_config(ConfigDict(extra="forbid"))
class DistillRecord(TypedDict, total=False):
    teacher: Required[dict[str, Any]]
    student: Required[dict[str, Any]]
    losses: Required[dict[str, Any]]
    data: Required[dict[str, Any]]
    training: Required[dict[str, Any]]
    evaluations: Required[list[dict[str, Any]]]
    selection: Required[dict[str, Any]]
    quality: Required[dict[str, Any]]
    qat: Required[dict[str, Any] | None]
    reload_check: Required[dict[str, Any]]
    weights_sha256: Required[str]
    pass_seconds: Required[float]
    curve: Required[str | None]  # the training-curve plot's file, None where it could not be drawn


def record_errors(record_type: type, record: dict) -> list[str]:
    """Where ``record`` departs from ``record_type``: one line per key (undeclared, missing, wrong type)."""
    return [e.replace("(top):", "(record):", 1) for e in type_errors(record_type, record)]


def check_record(pass_name: str, record_type: type | None, record: dict) -> None:
    """Hold a pass's record to its type: raise under ``XFORMOPT_STRICT_RECORDS=1`` (the test suite), log
    a warning otherwise (a schema slip must never cost a user the artifact a long run built)."""
    if record_type is None:
        return
    check_typed(f"pass {pass_name!r} wrote a record", record_type, record, _log)
