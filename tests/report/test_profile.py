"""`xformopt profile` and the profile in optimize's report: relations that hold on every host.

The artifact is the tiny classifier through export -> quantize (INT8 GEMMs, unfused attention,
layer norms). Nothing here asserts a time: only that the parts partition the whole, that
kernel times sit inside the runs that hold them, and that the GEMM peak is cached per host.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import error_lines, run_cli

from xformopt.profiling import ops
from xformopt.profiling.layers import node_layers
from xformopt.profiling.trace import load_events, runs


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, tiny_classifier, heldout_file) -> Path:
    from xformopt import pipeline, recipe

    root = tmp_path_factory.mktemp("profile")
    r = recipe.validate({"name": "tiny-profile", "target": "avx2", "passes": ["export", "quantize"],
                         "evaluation": {"data": str(heldout_file), "limit": 12, "latency_rounds": 3, "warmup": 1,
                                        "repeats": 1}})
    out = root / "artifact"
    pipeline.run(str(tiny_classifier), r, out, use_cache=False)
    return out


@pytest.fixture(scope="module")
def profiled(artifact, tmp_path_factory) -> tuple[dict, Path]:
    """`xformopt profile ARTIFACT -o DIR --json` once for the module: (stdout document, DIR)."""
    from xformopt.cli.app import main

    out = tmp_path_factory.mktemp("profile-out") / "prof"
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        try:
            main(["profile", str(artifact), "-o", str(out), "--runs", "6", "--warmup", "2", "--json", "-q"])
        except SystemExit as exc:
            assert exc.code in (0, None)
    return json.loads(buffer.getvalue()), out


def test_profile_files_and_json_agree(profiled):
    doc, out = profiled
    assert sorted(p.name for p in out.iterdir()) == ["profile.json", "profile.md", "profile.png", "trace.json"]
    assert json.loads((out / "profile.json").read_text()) == doc
    assert doc["schema"] == "xformopt.profile/1" and doc["trace"] == "trace.json"
    md = (out / "profile.md").read_text()
    assert "#### By operator type" in md and "profile.png" in md
    assert set(doc["shares"]) == {"gemm", "attention", "layer norm", "tokenization"}


def test_trace_is_valid_and_kernels_sit_inside_their_runs(profiled):
    doc, out = profiled
    found = runs(load_events(out / "trace.json"))
    s = doc["settings"]
    assert len(found) == s["runs"] + s["warmup"]  # the warm-up runs stay in the trace
    for run in found:
        assert run.kernels, "every run has kernel calls"
        assert run.kernel_us <= run.dur_us  # sequential executor: the kernels of a run fit in it
    timed = found[s["warmup"]:]
    per_request_ms = sum(r.kernel_us for r in timed) / len(timed) / 1e3
    op_ms = sum(row["ms"] for row in doc["op_types"])
    assert op_ms == pytest.approx(per_request_ms, rel=1e-9)
    acc = doc["accounted"]
    assert acc["operators_median_ms"] <= acc["ort_run_median_ms"]
    assert acc["within_limit"] == (abs(acc["share_of_end_to_end_median"] - 1) <= 0.10)
    assert 0 < acc["median_share_per_request"] <= 1  # within a request the parts never exceed the whole


def test_categories_and_layers_partition_the_operators(profiled):
    doc, _ = profiled
    op_ms = sum(row["ms"] for row in doc["op_types"])
    operator_rows = [row for row in doc["breakdown"] if row["kind"] == "operators"]
    assert sum(row["ms"] for row in operator_rows) == pytest.approx(op_ms, rel=1e-9)
    assert {row["part"] for row in operator_rows} == {row["category"] for row in doc["op_types"]}
    assert all(row["category"] in (ops.category(row["op_type"]), "attention") for row in doc["op_types"])
    assert sum(row["ms"] for row in doc["layers"]) == pytest.approx(op_ms, rel=1e-9)
    # The breakdown partitions the mean request: operators + tokenization + runtime = end to end.
    assert sum(row["ms"] for row in doc["breakdown"]) == pytest.approx(doc["end_to_end"]["mean_ms"], rel=1e-9)
    assert sum(row["share"] for row in doc["breakdown"]) == pytest.approx(1.0, rel=1e-9)
    assert all(row["ms"] >= 0 for row in doc["breakdown"] if row["kind"] != "runtime" or row["part"] != "Python call and feed")
    layers = [row["layer"] for row in doc["layers"]]
    assert {"layer 0", "layer 1"} <= set(layers)  # the tiny model has 2 layers
    categories = {row["op_type"]: row["category"] for row in doc["op_types"]}
    kinds = {row["category"] for row in doc["op_types"]}
    assert {"gemm", "attention", "layer norm"} <= kinds  # INT8 GEMMs, Q K^T and softmax, LayerNormalization
    assert categories.get("Softmax") == "attention"


def test_gemm_throughput_is_compared_with_the_peak(profiled):
    doc, _ = profiled
    peak = doc["gemm_peak"]
    assert peak["fp32_gflops"] > 0 and peak["int8_gflops"] > 0 and peak["host_fingerprint"] == doc["host_fingerprint"]
    int8 = next(row for row in doc["gemm_throughput"] if row["kind"] == "int8")
    assert int8["peak_gflops_per_s"] == peak["int8_gflops"]
    assert int8["fraction_of_peak"] == pytest.approx(int8["gflops_per_s"] / peak["int8_gflops"])


def test_optimize_report_carries_the_final_stage_profile(artifact):
    report = json.loads((artifact / "report.json").read_text())
    profile = report["profile"]
    assert profile["stage"] == "quantize" and profile["settings"]["runs"] == 30
    assert set(profile["shares"]) == {"gemm", "attention", "layer norm", "tokenization"}
    md = (artifact / "report.md").read_text()
    assert "Where the time goes (quantize" in md and "tokenization" in md


def test_batch_and_seq_shape_the_requests(artifact, capsys):
    code, out, err = run_cli(["profile", artifact, "--batch", "2", "--seq", "8", "--runs", "3", "--warmup", "0", "--json"],
                             capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["settings"]["batch"] == 2 and doc["settings"]["seq"] == 8
    assert doc["settings"]["inputs"] == "exact length 8"


@pytest.mark.parametrize("args, needle", [
    (["--runs", "0"], "--runs"),
    (["--data", "/nonexistent/file.jsonl"], "nonexistent"),
])
def test_bad_input_exits_2(artifact, capsys, args, needle):
    code, _, err = run_cli(["profile", artifact, *args], capsys)
    assert code == 2 and needle in err and len(error_lines(err)) == 1


def test_existing_output_refused_before_work(artifact, tmp_path, capsys):
    out = tmp_path / "prof"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, err = run_cli(["profile", artifact, "-o", out], capsys)
    assert code == 2 and "already exists" in err
    assert (out / "keep.txt").read_text() == "mine"


def test_decoder_artifact_refused(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    code, _, err = run_cli(["profile", tmp_path], capsys)
    assert code == 2 and "text-generation" in err and len(error_lines(err)) == 1


# --------------------------------------------------------------------------- units


def test_every_op_type_has_one_category():
    seen: dict[str, str] = {}
    for name, members in ops.CATEGORIES.items():
        for op in members:
            assert op not in seen, f"{op} in {seen.get(op)} and {name}"
            seen[op] = name
    assert ops.category("NoSuchOp") == ops.OTHER
    # An unfused graph's Q K^T multiplies two activations: attention, not a weight GEMM.
    assert ops.kernel_category("MatMul", False, [[1, 4, 9, 16], [1, 4, 16, 9]]) == "attention"
    assert ops.kernel_category("MatMul", True, [[1, 9, 64]]) == "gemm"
    assert ops.kernel_category("MatMul", None, [[1, 4, 9, 16], [1, 4, 16, 9]]) == "attention"
    assert ops.kernel_category("MatMul", None, [[1, 9, 64], [64, 64]]) == "gemm"


def test_flops_from_trace_shapes():
    # A [1, 12, 64] x W [64, 128] (W prepacked, absent from the trace's inputs) -> [1, 12, 128].
    assert ops.flops("DynamicQuantizeMatMul", [[1, 12, 64], [128]], [[1, 12, 128]]) == 2 * 12 * 64 * 128
    assert ops.flops("Gemm", [[5, 7], [7, 3]], [[5, 3]], {"transA": 1}) == 2 * 5 * 3 * 5
    batch, seq, hidden = 2, 10, 64
    qkv = 2 * batch * seq * hidden * 3 * hidden
    scores = 4 * batch * seq * seq * hidden
    assert ops.flops("QAttention", [[batch, seq, hidden]], [[batch, seq, hidden]]) == qkv + scores
    assert ops.flops("Add", [[1, 2]], [[1, 2]]) is None
    assert ops.precision("MatMulInteger", ["uint8"]) == "int8" and ops.precision("MatMul", ["float"]) == "fp32"


def test_layers_from_names_weights_and_neighbours():
    from onnx import TensorProto, helper

    def vi(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1])

    nodes = [
        helper.make_node("Cast", ["mask"], ["mask_f"], name="mask_cast"),  # before any layer
        helper.make_node("LayerNormalization", ["e", "bert.embeddings.LayerNorm.weight"], ["x"], name="LayerNorm_7"),
        helper.make_node("Attention", ["x", "mask_f"], ["a0"], name="Attention_0"),  # no layer in its names
        helper.make_node("SkipLayerNormalization", ["a0", "x", "encoder.layer.0.ln.weight"], ["h0"], name="SkipLN_0"),
        helper.make_node("Attention", ["h0", "mask_f"], ["a1"], name="Attention_1"),
        helper.make_node("SkipLayerNormalization", ["a1", "h0", "encoder.layer.1.ln.weight"], ["h1"], name="SkipLN_1"),
        helper.make_node("Gemm", ["h1", "classifier.weight"], ["logits"], name="/classifier/Gemm"),
    ]
    inits = [helper.make_tensor(n, TensorProto.FLOAT, [1], [1.0])
             for n in ("bert.embeddings.LayerNorm.weight", "encoder.layer.0.ln.weight", "encoder.layer.1.ln.weight",
                       "classifier.weight")]
    graph = helper.make_graph(nodes, "g", [vi("e"), vi("mask")], [vi("logits")], inits)
    assert node_layers(graph) == {"mask_cast": "embeddings", "LayerNorm_7": "embeddings", "Attention_0": "layer 0", "SkipLN_0": "layer 0",
                                  "Attention_1": "layer 1", "SkipLN_1": "layer 1", "/classifier/Gemm": "head"}


# --------------------------------------------------------------------------- GEMM peak cache


@pytest.fixture
def own_peak_cache(tmp_path, monkeypatch) -> Path:
    """A cache folder of this test's own: the suite shares one GEMM-peak folder among all other tests."""
    monkeypatch.setenv("XFORMOPT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_gemm_peak_cached_per_host_fingerprint(monkeypatch, own_peak_cache):
    from xformopt.profiling import peak

    assert peak.peak_dir() == own_peak_cache / "gemm-peak" and not peak.peak_dir().exists()
    measured = []
    monkeypatch.setattr(peak, "measure_gflops", lambda kind, threads: measured.append(kind) or {"fp32": 50.0, "int8": 65.0}[kind])
    fingerprint = {"value": "aaaa000011112222"}
    monkeypatch.setattr(peak.host, "host_fingerprint", lambda info: fingerprint["value"])
    monkeypatch.setattr(peak.host, "host_info", lambda: {"cpu_model": "test"})

    first = peak.gemm_peak(2)
    assert (first["cached"], first["fp32_gflops"], first["int8_gflops"]) == (False, 50.0, 65.0)
    assert measured == ["fp32", "int8"]
    second = peak.gemm_peak(2)
    assert second["cached"] is True and measured == ["fp32", "int8"]  # reused, not measured again
    assert {k: v for k, v in second.items() if k != "cached"} == {k: v for k, v in first.items() if k != "cached"}

    peak.gemm_peak(1)  # another thread count is another entry
    assert len(measured) == 4
    fingerprint["value"] = "bbbb000011112222"  # another host
    assert peak.gemm_peak(2)["cached"] is False and len(measured) == 6
    assert sorted(p.name for p in peak.peak_dir().glob("*.json")) == [
        "aaaa000011112222-t1.json", "aaaa000011112222-t2.json", "bbbb000011112222-t2.json"]

    # An edited entry fails its checksum and is measured again, never served.
    path = peak.peak_dir() / "bbbb000011112222-t2.json"
    doc = json.loads(path.read_text())
    doc["payload"]["int8_gflops"] = 9999.0
    path.write_text(json.dumps(doc))
    again = peak.gemm_peak(2)
    assert again["cached"] is False and again["int8_gflops"] == 65.0 and len(measured) == 8
    assert peak.gemm_peak(2, remeasure=True)["cached"] is False and len(measured) == 10


def test_a_peak_is_never_lowered_and_a_beaten_peak_is_remeasured(monkeypatch, own_peak_cache):
    from xformopt.profiling import measure, peak

    speeds = {"fp32": 50.0, "int8": 65.0}
    calls = []
    monkeypatch.setattr(peak, "measure_gflops", lambda kind, threads: calls.append(kind) or speeds[kind])
    monkeypatch.setattr(peak.host, "host_fingerprint", lambda info: "cccc000011112222")
    monkeypatch.setattr(peak.host, "host_info", lambda: {"cpu_model": "test"})
    peak.gemm_peak(2)
    speeds.update(fp32=20.0, int8=200.0)  # a busy moment for fp32, a quiet one for int8
    again = peak.gemm_peak(2, remeasure=True)
    assert (again["fp32_gflops"], again["int8_gflops"]) == (50.0, 200.0)

    speeds.update(int8=300.0)
    doc = {"gemm_throughput": [{"kind": "int8", "ms": 1.0, "gflop_per_request": 0.25, "gflops_per_s": 250.0}]}
    measure.add_peak(doc, 2)  # 250 beats the cached 200: measured again before comparing
    assert doc["gemm_peak"]["int8_gflops"] == 300.0 and doc["gemm_throughput"][0]["fraction_of_peak"] == 250.0 / 300.0


def test_report_markdown_says_why_a_profile_is_missing():
    from xformopt.report.markdown import _profile_lines

    assert _profile_lines(None) == []
    lines = _profile_lines({"error": "RuntimeError: no trace", "stage": "quantize"})
    assert lines[0].startswith("#### Where the time goes (quantize") and "not profiled: RuntimeError: no trace" in lines[2]
