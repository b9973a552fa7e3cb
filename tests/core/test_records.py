"""Pass records are typed (xformopt/passes/records.py): every pass declares its record's type, and the
pipeline holds what a pass returns to it (strict in this suite: tests/conftest.py sets the switch)."""

from __future__ import annotations

import logging

import pytest

from xformopt.passes import all_passes
from xformopt.passes.records import STRICT_ENV, ExportRecord, FuseRecord, check_record, record_errors

EXPORT = {"exporter": "torch.onnx.export (dynamo=True)", "opset": 18, "inputs": ["input_ids", "attention_mask"],
          "outputs": ["last_hidden_state"], "nodes": 120, "parity": {"max_abs_diff": 1e-6}}


def test_every_pass_declares_its_record_type():
    untyped = [p.name for p in all_passes() if p.Record is None]
    assert not untyped, f"passes without a record type: {untyped}"


def test_a_record_matching_its_type_passes():
    assert record_errors(ExportRecord, EXPORT) == []


@pytest.mark.parametrize("bad, where", [
    ({**EXPORT, "exporterr": "typo"}, "exporterr"),  # an undeclared key
    ({k: v for k, v in EXPORT.items() if k != "parity"}, "parity"),  # a required key missing
    ({**EXPORT, "opset": "eighteen"}, "opset"),  # a value of the wrong type
])
def test_a_record_departing_from_its_type_is_named(bad, where):
    errors = record_errors(ExportRecord, bad)
    assert errors and any(e.startswith(where) for e in errors), errors


def test_nested_types_are_checked_too():
    fuse = {"fusion_route": "r", "fused_before": {}, "fused_possible": {"Attention": 6}, "fused_kept": {"Attention": 6},
            "expected": {}, "kept": "all", "reason": "select=all", "timings_ms": {"all": {"median_ms": 1.0, "p90_ms": 1.2}}}
    assert any(e.startswith("timings_ms.all.n") for e in record_errors(FuseRecord, fuse))


def test_strict_raises_and_lenient_only_logs(monkeypatch, caplog):
    bad = {**EXPORT, "surprise": 1}
    monkeypatch.setenv(STRICT_ENV, "1")
    with pytest.raises(TypeError, match="'export'.*surprise"):
        check_record("export", ExportRecord, bad)
    monkeypatch.setenv(STRICT_ENV, "0")
    with caplog.at_level(logging.WARNING, logger="xformopt.passes"):
        check_record("export", ExportRecord, bad)
    assert "surprise" in caplog.text
