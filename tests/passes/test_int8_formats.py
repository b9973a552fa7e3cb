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
from helpers import make_ctx, run_pass
from host_facts import real_cpu_flags
from onnx import numpy_helper

from xformopt import targets
from xformopt.measure.host import cpu_flags
from xformopt.measure.kernel_probe import int8_gemm_saturates
from xformopt.passes import stage_runs
from xformopt.passes.quantize import run as q
from xformopt.passes.quantize.formats import agreement_floor, format_ladder

FORMATS = {"weight_type": "int8", "per_channel": False, "reduce_range": False, "activation_type": "uint8",
           "activation_symmetric": False, "op_types": ["MatMul"], "format": "QOperator"}
NOT_FIXED = {"per_channel": None, "reduce_range": None, "weight_type": None}

pytestmark = pytest.mark.host_sensitive


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
    monkeypatch.setattr(stage_runs, "output_agreement", saturating_agreement(calls))
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
    monkeypatch.setattr(stage_runs, "output_agreement", saturating_agreement([]))
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

    monkeypatch.setattr(stage_runs, "output_agreement", agree)
    ctx = make_ctx(tiny_classifier, sample_texts, target="avx512_vnni")
    record = run_pass("quantize", ctx, fused_classifier[0], tmp_path / "q", min_agreement=0.99)
    search = record["format_search"]
    assert len(search["exclude_nodes"]) == 1
    assert search["attempts"][search["chosen"]]["change"] == "1 most harmful GEMM(s) in float"
    assert [g["name"] for g in record["coverage"]["kept_float"]] == search["exclude_nodes"]


def test_failure_names_the_switch_the_user_fixed(fused_classifier, tiny_classifier, tmp_path, sample_texts,
                                                 monkeypatch):
    monkeypatch.setattr(stage_runs, "output_agreement", lambda *a: {"measure": "cosine", "mean_agreement": 0.5, "min_agreement": 0.5, "texts": 1})
    ctx = make_ctx(tiny_classifier, sample_texts, target="avx512_vnni")
    record = run_pass("quantize", ctx, fused_classifier[0], tmp_path / "q", min_agreement=0.99, per_channel=False)
    assert record["verdict"]["passed"] is False
    message = q.QuantizePass.budget_failure(record, tmp_path / "q")
    assert "0.500 < 0.99" in message and "--per-channel" in message and "reduce-range" not in message
    assert "exclude_nodes" in message and "--min-agreement 0.5 " in message


@pytest.mark.real_host
def test_real_formats_agree_on_this_host(fused_classifier, tiny_classifier, tmp_path, sample_texts):
    """No injection: the host's own target writes a graph the floor accepts at the first attempt."""
    ctx = make_ctx(tiny_classifier, sample_texts, target=targets.detect().name)
    record = run_pass("quantize", ctx, fused_classifier[0], tmp_path / "q")
    assert record["format_search"]["attempts"][0]["passes"] is True
    assert record["agreement"]["mean_agreement"] >= 0.9


# --------------------------------------------------------------------------- the kernel, for real


@pytest.mark.real_host
def test_probe_matches_the_flags_of_this_host():
    """Natively, ORT's kernel saturates exactly where the CPU lacks VNNI (x86)."""
    flags = cpu_flags()
    if "avx2" not in flags:
        assert int8_gemm_saturates() in (False, None)  # Arm and others: no VPMADDUBSW path
    else:
        assert int8_gemm_saturates() is targets.u8s8_saturates(flags)


QEMU = shutil.which("qemu-x86_64")


@pytest.mark.real_host
@pytest.mark.skipif(QEMU is None or "avx2" not in real_cpu_flags(),
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


# --------------------------------------------------------------------------- a floor that cannot be met


@pytest.fixture(scope="module")
def deep_exported(tmp_path_factory, tokenizer_dir, sample_texts):
    """A 6-layer tiny BertModel exported unfused: 36+ weighted MatMuls, so the float ladder's bound (a
    tenth, rounded up) is 4 and the walk has several steps. Embeddings: the cosine of 64-wide vectors,
    which INT8 never brings to exactly 1.0."""
    import torch
    from helpers import _bert_config, _save
    from transformers import BertModel

    torch.manual_seed(3)
    config = _bert_config(tokenizer_dir)
    config.num_hidden_layers = 6
    model = _save(BertModel(config).eval(), tokenizer_dir, tmp_path_factory.mktemp("deep-enc"))
    exported = tmp_path_factory.mktemp("deep-enc-onnx") / "e"
    run_pass("export", make_ctx(model, sample_texts), model, exported)
    return model, exported


def test_a_floor_miss_walks_the_float_ladder_to_its_bound_and_writes_a_failing_verdict(
        deep_exported, sample_texts, tmp_path):
    import math

    model, exported = deep_exported
    ctx = make_ctx(model, sample_texts, target="avx512_vnni")
    record = run_pass("quantize", ctx, exported, tmp_path / "q", min_agreement=1.0)  # real agreement, unreachable
    ladder = record["format_search"]["float_ladder"]
    assert ladder["weighted_gemms"] >= 36
    assert ladder["bound"] == math.ceil(ladder["weighted_gemms"] / 10) >= 4
    steps = [s["float_gemms"] for s in ladder["steps"]]
    assert steps[0] == 1 and steps[-1] == ladder["bound"]  # 1, 2, 4 ... up to the bound, none passing
    assert steps == sorted(steps) and all(b <= 2 * a for a, b in zip(steps, steps[1:]))
    # The record rounds to 6 places: on exact 8-bit kernels (VNNI) a step can read 1.0 and still miss the floor.
    assert all(not s["passes"] and 0 < s["mean_agreement"] <= 1.0 for s in ladder["steps"])
    attempts = record["format_search"]["attempts"]
    assert [len(a["float_nodes"]) for a in attempts if a["float_nodes"]] == steps  # each step really built
    verdict = record["verdict"]
    assert verdict["passed"] is False and verdict["checks"]["agreement_floor"]["met"] is False
    assert verdict["accept"]["min_agreement"] <= record["agreement"]["mean_agreement"] < 1.0
    assert (tmp_path / "q" / "model.onnx").is_file() and record["coverage"]["int8"] > 0


def test_a_floor_miss_exits_1_with_the_artifact_and_the_accept_command_accepts_it(
        deep_exported, tmp_path, capsys):
    import json
    import shlex

    from helpers import run_cli

    _, exported = deep_exported
    out = tmp_path / "q"
    code, _, err = run_cli(["quantize", exported, "-o", out, "--target", "avx512_vnni", "--min-agreement", "1"], capsys)
    assert code == 1, err
    assert "INT8 agreement floor not met" in err and "failing verdict" in err
    assert (out / "model.onnx").is_file() and (out / "manifest.json").is_file()
    record = json.loads((out / "manifest.json").read_text())["passes"][-1]["record"]
    assert record["verdict"]["passed"] is False and record["format_search"]["float_ladder"]["steps"]
    line = next(x for x in err.splitlines() if "to accept it: " in x)
    command = shlex.split(line.split("to accept it: ", 1)[1])
    accepted = record["verdict"]["accept"]["min_agreement"]
    assert command[:2] == ["xformopt", "quantize"] and command[-3:] == ["--min-agreement", str(accepted), "--force"]
    assert command.count("--min-agreement") == 1  # the user's --min-agreement 1 was replaced
    code, _, err = run_cli(command[1:], capsys)
    assert code == 0, err
    record = json.loads((out / "manifest.json").read_text())["passes"][-1]["record"]
    assert record["verdict"]["passed"] is True and record["agreement"]["mean_agreement"] >= accepted


def test_optimize_floor_miss_writes_the_artifact_and_report_and_exits_1(deep_exported, tmp_path, capsys):
    import json

    from helpers import run_cli

    model, _ = deep_exported
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: floor\ntarget: avx512_vnni\npasses:\n  - export\n  - quantize\n"
                      "evaluation:\n  limit: 8\n  latency_rounds: 3\n  warmup: 1\n  repeats: 1\n")
    out = tmp_path / "artifact"
    code, _, err = run_cli(["optimize", model, "--recipe", recipe, "-o", out, "--min-agreement", "1.0"], capsys)
    assert code == 1, err
    assert "quantize: INT8 agreement floor not met" in err and "to accept it: xformopt optimize" in err
    for name in ("model.onnx", "manifest.json", "report.json", "report.md"):
        assert (out / name).is_file(), name
    entry = json.loads((out / "manifest.json").read_text())["passes"][-1]
    assert entry["options"]["min_agreement"] == 1.0 and entry["record"]["verdict"]["passed"] is False


def test_accept_command_replaces_the_users_value():
    from xformopt.cli.accept import accept_command

    assert accept_command(["optimize", "m", "--min-agreement=0.99", "-o", "out dir"], {"min_agreement": 0.8}) == \
        "xformopt optimize m -o 'out dir' --min-agreement 0.8 --force"
    assert accept_command(["quantize", "e", "--force", "--min-agreement", "0.9"], {"min_agreement": 0.85}) == \
        "xformopt quantize e --force --min-agreement 0.85"
