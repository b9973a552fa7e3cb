"""The INT8 format ladder: the target's formats first, then safer ones, then float for the most
harmful GEMMs; what the user fixed is never changed; failures name the switch that would help.

Saturation is injected (an agreement function that punishes full-range int8 weights, as ONNX
Runtime's VPMADDUBSW kernel does on hosts without VNNI), so every branch runs on every host. The
real kernel is checked where it exists: on this host by the probe, and under qemu's Haswell CPU
model (AVX2, no VNNI) when qemu-user is installed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
from conftest import make_ctx, run_pass
from onnx import numpy_helper

from xformopt import targets
from xformopt.measure.host import cpu_flags
from xformopt.errors import PassFailed
from xformopt.measure.kernel_probe import int8_gemm_saturates
from xformopt.passes import quantize as q
from xformopt.passes.int8_formats import agreement_floor, format_ladder

FORMATS = {"weight_type": "int8", "per_channel": False, "reduce_range": False, "activation_type": "uint8",
           "activation_symmetric": False, "op_types": ["MatMul"], "format": "QOperator"}
NOT_FIXED = {"per_channel": None, "reduce_range": None, "weight_type": None}


def test_ladder_moves_only_towards_safer_formats():
    ladder = format_ladder(FORMATS, NOT_FIXED, saturating_target=True)
    steps = [(f["weight_type"], f["per_channel"], f["reduce_range"]) for f in ladder]
    assert steps == [("int8", False, False), ("int8", True, False), ("int8", True, True), ("uint8", True, True)]
    assert ladder[0]["change"] == "the target's formats"


def test_ladder_skips_unsigned_weights_on_vnni_and_keeps_what_the_user_fixed():
    ladder = format_ladder(FORMATS, NOT_FIXED, saturating_target=False)
    assert [f["weight_type"] for f in ladder] == ["int8"] * 3
    fixed = {"per_channel": False, "reduce_range": None, "weight_type": None}
    ladder = format_ladder(FORMATS, fixed, saturating_target=True)
    assert all(f["per_channel"] is False for f in ladder)
    assert [(f["weight_type"], f["reduce_range"]) for f in ladder] == [("int8", False), ("int8", True), ("uint8", True)]


def test_task_floors():
    from xformopt import tasks

    assert agreement_floor(tasks.get("feature-extraction"), None) == 0.99
    assert agreement_floor(tasks.get("text-classification"), None) == 0.9
    assert agreement_floor(tasks.get("feature-extraction"), 0.5) == 0.5


def _weights_saturate(model_dir) -> bool:
    """What the VPMADDUBSW kernel punishes: signed 8-bit weights using the full range."""
    model = onnx.load(str(model_dir / "model.onnx"))
    quantized = [numpy_helper.to_array(i) for i in model.graph.initializer if i.data_type == onnx.TensorProto.INT8]
    return any(np.abs(w.astype(int)).max() > 64 for w in quantized if w.size > 16)


def saturating_agreement(calls: list):
    def agree(ctx, float_dir, int8_dir):
        cosine = 0.95 if _weights_saturate(int8_dir) else 0.995
        calls.append(cosine)
        return {"measure": "cosine", "mean_agreement": cosine, "min_agreement": cosine, "texts": 1}

    return agree


def test_saturation_moves_to_reduce_range(fused_classifier, tiny_classifier, tmp_path, sample_texts, monkeypatch):
    calls: list = []
    monkeypatch.setattr(q, "output_agreement", saturating_agreement(calls))
    ctx = make_ctx(tiny_classifier, sample_texts, target="avx512_vnni")  # full range: saturates where injected
    record = run_pass("quantize", ctx, fused_classifier[0], tmp_path / "q", min_agreement=0.99)
    search = record["format_search"]
    assert [a["passes"] for a in search["attempts"]] == [False, True]
    assert search["chosen"] == 1 and "7-bit" in search["reason"]
    assert record["formats"]["reduce_range"] is True and record["formats"]["per_channel"] is True
    assert not _weights_saturate(tmp_path / "q")  # the written graph is the chosen one
    assert search["exclude_nodes"] == [] and record["coverage"]["kept_float"] == []
    assert any("first attempt over the floor" in m for m in ctx.messages)


def test_fixed_reduce_range_falls_to_unsigned_weights_on_a_saturating_host(
        fused_classifier, tiny_classifier, tmp_path, sample_texts, monkeypatch):
    monkeypatch.setattr(q, "output_agreement", saturating_agreement([]))
    ctx = make_ctx(tiny_classifier, sample_texts, target="avx512_vnni", host_flags={"avx2", "avx512f"})
    record = run_pass("quantize", ctx, fused_classifier[0], tmp_path / "q", min_agreement=0.99, reduce_range=False)
    assert record["formats"]["reduce_range"] is False  # the user's choice stands
    assert record["formats"]["weight_type"] == "uint8"
    assert record["format_search"]["attempts"][-1]["passes"] is True


def test_harmful_gemms_go_to_float_as_a_last_resort(fused_classifier, tiny_classifier, tmp_path, sample_texts,
                                                    monkeypatch):
    def agree(ctx, float_dir, int8_dir):  # only a graph with some GEMM back in float is close enough
        kept = q.int8_coverage(q.load_graph(float_dir / "model.onnx"), q.load_graph(int8_dir / "model.onnx"))
        cosine = 0.995 if kept["kept_float"] else 0.9
        return {"measure": "cosine", "mean_agreement": cosine, "min_agreement": cosine, "texts": 1}

    monkeypatch.setattr(q, "output_agreement", agree)
    ctx = make_ctx(tiny_classifier, sample_texts, target="avx512_vnni")
    record = run_pass("quantize", ctx, fused_classifier[0], tmp_path / "q", min_agreement=0.99)
    search = record["format_search"]
    assert len(search["exclude_nodes"]) == 1
    assert search["attempts"][search["chosen"]]["change"] == "1 most harmful GEMM(s) in float"
    assert [g["name"] for g in record["coverage"]["kept_float"]] == search["exclude_nodes"]


def test_failure_names_the_switch_the_user_fixed(fused_classifier, tiny_classifier, tmp_path, sample_texts,
                                                 monkeypatch):
    monkeypatch.setattr(q, "output_agreement", lambda *a: {"measure": "cosine", "mean_agreement": 0.5, "min_agreement": 0.5, "texts": 1})
    ctx = make_ctx(tiny_classifier, sample_texts, target="avx512_vnni")
    with pytest.raises(PassFailed) as info:
        run_pass("quantize", ctx, fused_classifier[0], tmp_path / "q", min_agreement=0.99, per_channel=False)
    message = info.value.message
    assert "0.500 < 0.99" in message and "--per-channel" in message and "reduce-range" not in message
    assert "exclude_nodes" in message


def test_real_formats_agree_on_this_host(fused_classifier, tiny_classifier, tmp_path, sample_texts):
    """No injection: the host's own target writes a graph the floor accepts at the first attempt."""
    ctx = make_ctx(tiny_classifier, sample_texts, target=targets.detect().name)
    record = run_pass("quantize", ctx, fused_classifier[0], tmp_path / "q")
    assert record["format_search"]["attempts"][0]["passes"] is True
    assert record["agreement"]["mean_agreement"] >= 0.9


# --------------------------------------------------------------------------- the kernel, for real


def test_probe_matches_the_flags_of_this_host():
    """Natively, ORT's kernel saturates exactly where the CPU lacks VNNI (x86)."""
    flags = cpu_flags()
    if "avx2" not in flags:
        assert int8_gemm_saturates() in (False, None)  # Arm and others: no VPMADDUBSW path
    else:
        assert int8_gemm_saturates() is targets.u8s8_saturates(flags)


QEMU = shutil.which("qemu-x86_64")


@pytest.mark.skipif(QEMU is None or "avx2" not in cpu_flags(),
                    reason="qemu-user (qemu-x86_64) is not installed: .ci/run installs it to emulate an AVX2-only CPU")
def test_probe_sees_saturation_on_an_emulated_avx2_cpu():
    code = "from xformopt.measure.kernel_probe import int8_gemm_saturates as s; print(s())"
    out = subprocess.run([QEMU, "-cpu", "Haswell", sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "True"


# --------------------------------------------------------------------------- the shared search


@pytest.mark.parametrize(("need", "most"), [(1, 8), (3, 8), (5, 8), (8, 8), (6, 6), (7, 12)])
def test_fewest_that_pass_finds_the_threshold_with_few_tries(need, most):
    from xformopt.passes.fewest import fewest_that_pass

    tried = []
    found = fewest_that_pass(lambda k: tried.append(k) or k >= need, most)
    assert found == need
    assert len(tried) <= 2 * most.bit_length()  # doubling then bisection, not a scan
    assert fewest_that_pass(lambda k: False, most) is None
