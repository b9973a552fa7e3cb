"""The `xformopt` command: exit codes, one-line errors, help, JSON output, chained pass commands."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import onnx
import pytest
from helpers import error_lines, onnx_op_counts, run_cli, write_tiny_recipe

from xformopt import __version__
from xformopt.recipe import RECIPES_DIR
from xformopt.targets import PROFILES

LAYERS = 2


@pytest.fixture
def tiny_recipe_file(tmp_path, heldout_file) -> Path:
    return write_tiny_recipe(tmp_path / "tiny.yaml", heldout_file, limit=12, repeats=None)


def assert_input_error(code: int, stderr: str, *fragments: str) -> str:
    """Exit 2, exactly one line on stderr, starting with 'error:', containing FRAGMENTS."""
    lines = error_lines(stderr)
    assert code == 2, stderr
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def tmp_leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in Path(directory).iterdir() if re.match(r"^\..*\.(tmp|old)-", p.name))


# --------------------------------------------------------------------------- bad input: exit 2


def test_missing_model_path(tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = run_cli(["optimize", tmp_path / "nowhere" / "model", "-o", out], capsys)
    assert_input_error(code, err, "model path not found", "nowhere")
    assert not out.exists()


def test_non_transformer_directory(tmp_path, capsys):
    model = tmp_path / "not-a-model"
    model.mkdir()
    (model / "weights.pt").write_bytes(b"\0" * 16)
    out = tmp_path / "out"
    code, _, err = run_cli(["optimize", model, "-o", out], capsys)
    assert_input_error(code, err, "not a Hugging Face model directory", "config.json")
    assert not out.exists()


def test_unknown_alias_offline(tmp_path, capsys, monkeypatch, empty_hub_cache):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["optimize", "no-such-alias", "-o", "out"], capsys)
    assert_input_error(code, err, "'no-such-alias'", "HF_HUB_OFFLINE=1", "local path")
    assert not (tmp_path / "out").exists()


def test_unknown_target(tiny_classifier, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = run_cli(["optimize", tiny_classifier, "--target", "avx1024", "-o", out], capsys)
    line = assert_input_error(code, err, "unknown target 'avx1024'")
    for name in PROFILES:
        assert name in line
    assert not out.exists()


def test_malformed_recipe_file(tiny_classifier, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\npasses: [export, fuse\nevaluation: {limit: 3}\n")
    out = tmp_path / "out"
    code, _, err = run_cli(["optimize", tiny_classifier, "--recipe", bad, "-o", out], capsys)
    assert_input_error(code, err, f"{bad}:3: broken YAML")
    assert not out.exists()


def test_invalid_recipe_option(tiny_classifier, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("passes:\n  - export:\n      opset: seventeen\n")
    out = tmp_path / "out"
    code, _, err = run_cli(["optimize", tiny_classifier, "--recipe", bad, "-o", out], capsys)
    assert_input_error(code, err, f"{bad}:3:", "passes.0.export.opset")
    assert not out.exists()


def test_wrong_label_column(tiny_classifier, heldout_file, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = run_cli(
        ["optimize", tiny_classifier, "--data", heldout_file, "--label-column", "sentiment", "-o", out], capsys
    )
    assert_input_error(code, err, "column 'sentiment' not found", "--label-column")
    assert not out.exists()


def test_existing_output_without_force(tiny_classifier, tmp_path, capsys, isolated_cache):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, err = run_cli(["optimize", tiny_classifier, "-o", out], capsys)
    assert_input_error(code, err, "already exists", "--force")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "mine"
    assert not (isolated_cache / "passes").exists()


def test_corrupt_model_onnx_given_to_fuse(exported_classifier, tmp_path, capsys):
    stage = tmp_path / "stage"
    shutil.copytree(exported_classifier[0], stage)
    (stage / "model.onnx").write_bytes(b"\x08\x07this is not a protobuf \xff\xfe\x00" * 64)
    out = tmp_path / "f"
    code, _, err = run_cli(["fuse", stage, "-o", out], capsys)
    assert_input_error(code, err, "is not a valid ONNX model", "re-export")
    assert not out.exists()


def test_fuse_of_a_torch_directory(tiny_classifier, tmp_path, capsys):
    out = tmp_path / "f"
    code, _, err = run_cli(["fuse", tiny_classifier, "-o", out], capsys)
    assert_input_error(code, err, "has no model.onnx", "xformopt export")
    assert not out.exists()


def test_quantize_missing_input(tmp_path, capsys):
    code, _, err = run_cli(["quantize", tmp_path / "missing", "-o", tmp_path / "q"], capsys)
    assert_input_error(code, err, "input not found")
    assert not (tmp_path / "q").exists()


def test_export_missing_model(tmp_path, capsys):
    code, _, err = run_cli(["export", tmp_path / "missing", "-o", tmp_path / "e"], capsys)
    assert_input_error(code, err, "not found")
    assert not (tmp_path / "e").exists()


def test_bad_fuse_select_value(exported_classifier, tmp_path, capsys):
    code, _, err = run_cli(["fuse", exported_classifier[0], "-o", tmp_path / "f", "--select", "most"], capsys)
    assert_input_error(code, err, "select")
    assert not (tmp_path / "f").exists()


def test_unknown_option_is_usage_error(capsys):
    code, _, err = run_cli(["optimize", "--frobnicate"], capsys)
    assert code == 2
    assert "--frobnicate" in err


# --------------------------------------------------------------------------- version, help, listings


def test_version(capsys):
    code, out, _ = run_cli(["--version"], capsys)
    assert code == 0
    assert out.strip() == f"xformopt {__version__}"


@pytest.mark.parametrize(
    "command",
    [[], ["optimize"], ["export"], ["fuse"], ["quantize"], ["recipes"], ["recipes", "list"], ["recipes", "show"],
     ["targets"], ["targets", "list"], ["targets", "detect"], ["passes"], ["passes", "list"], ["prune"],
     ["bench"], ["report"]],
    ids=lambda c: " ".join(c) or "xformopt",
)
def test_help_has_an_example(command, capsys):
    code, out, _ = run_cli([*command, "--help"], capsys)
    assert code == 0
    assert "Example" in out
    assert "Usage" in out


def test_recipes_list_json(capsys):
    code, out, _ = run_cli(["recipes", "list", "--json"], capsys)
    assert code == 0
    rows = json.loads(out)
    names = [r["name"] for r in rows]
    assert names[:2] == ["default", "fp32-fused"] and "prune-int8" in names
    assert rows[0]["passes"] == ["export", "fuse", "quantize"]
    assert rows[1]["passes"] == ["export", "fuse"]
    assert all(r["description"] for r in rows)


def test_recipes_show_prints_the_file(capsys):
    code, out, _ = run_cli(["recipes", "show", "default"], capsys)
    assert code == 0
    assert out == (RECIPES_DIR / "default.yaml").read_text()


def test_recipes_show_resolved(capsys):
    code, out, _ = run_cli(["recipes", "show", "default", "--resolved"], capsys)
    assert code == 0
    assert "timing_rounds: 40" in out and "min_agreement: null" in out  # null: the task decides (0.99 embeddings)


def test_recipes_show_unknown(capsys):
    code, _, err = run_cli(["recipes", "show", "nope"], capsys)
    assert_input_error(code, err, "recipe not found: nope")


def test_targets_list_json(capsys):
    code, out, _ = run_cli(["targets", "list", "--json"], capsys)
    assert code == 0
    rows = json.loads(out)
    assert [r["name"] for r in rows] == list(PROFILES)
    assert all(isinstance(r["host_supports"], bool) for r in rows)
    assert {r["name"]: r["quant"]["reduce_range"] for r in rows}["avx2"] is True


def test_targets_detect_json(capsys):
    from xformopt.measure.host import cpu_flags
    from xformopt.targets import DETECTION_ORDER, host_supports

    expected = next((n for n in DETECTION_ORDER if host_supports(PROFILES[n], cpu_flags())), None)
    code, out, err = run_cli(["targets", "detect", "--json"], capsys)
    if expected is None:  # a host none of the profiles fits
        assert_input_error(code, err, "could not detect a supported target")
    else:
        assert code == 0
        assert json.loads(out)["target"] == expected


# --------------------------------------------------------------------------- pass commands, chained


def unweighted_matmuls(path: Path) -> int:
    """MatMul nodes of a graph with no initializer among their inputs (attention's Q.K and P.V)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    weights = {init.name for init in graph.initializer}
    return sum(1 for n in graph.node if n.op_type == "MatMul" and not weights & set(n.input))


@pytest.mark.host_sensitive
def test_export_fuse_quantize_chain(tiny_classifier, heldout_file, tmp_path, capsys):
    e, f, q = tmp_path / "e", tmp_path / "f", tmp_path / "q"

    code, out, err = run_cli(["export", tiny_classifier, "-o", e, "--data", heldout_file], capsys)
    assert code == 0, err
    assert out.startswith("export: opset 18, parity max|diff|")
    assert f"wrote {e}" in out
    manifest = json.loads((e / "manifest.json").read_text())
    assert [p["pass"] for p in manifest["passes"]] == ["export"]
    assert manifest["input"]["path"] == str(tiny_classifier.resolve())

    code, out, err = run_cli(["fuse", e, "-o", f, "--data", heldout_file, "--json"], capsys)
    assert code == 0, err
    entry = json.loads(out)
    assert entry["pass"] == "fuse"
    assert entry["record"]["fused_possible"]["Attention"] == LAYERS
    manifest_f = json.loads((f / "manifest.json").read_text())
    assert [p["pass"] for p in manifest_f["passes"]] == ["export", "fuse"]
    assert manifest_f["input"] == manifest["input"]  # the original model, not the stage folder
    assert onnx_op_counts(f / "model.onnx")["Attention"] == entry["record"]["fused_kept"]["Attention"]

    code, out, err = run_cli(["quantize", f, "-o", q, "--target", "avx512_vnni", "--data", heldout_file], capsys)
    assert code == 0, err
    assert out.startswith("quantize: ")
    manifest_q = json.loads((q / "manifest.json").read_text())
    assert [p["pass"] for p in manifest_q["passes"]] == ["export", "fuse", "quantize"]
    assert manifest_q["target"]["name"] == "avx512_vnni"
    coverage = manifest_q["passes"][-1]["record"]["coverage"]
    assert coverage["int8"] == coverage["weighted_gemms"] > 0
    counts = onnx_op_counts(q / "model.onnx")
    # every weighted MatMul runs in INT8, whichever fusion candidate won fuse's timing: what stays float
    # is exactly the activation-by-activation MatMuls of attention left unfused
    assert counts["MatMulInteger"] > 0 and counts["MatMul"] == unweighted_matmuls(f / "model.onnx")
    assert (unweighted_matmuls(f / "model.onnx") == 0) is (entry["record"]["fused_kept"]["Attention"] == LAYERS)
    assert (q / "tokenizer.json").is_file() and (q / "config.json").is_file()
    assert tmp_leftovers(tmp_path) == []

    # the fuse record's option reached the pass
    code, out, err = run_cli(["fuse", e, "-o", tmp_path / "f-all", "--select", "all", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["record"]["kept"] == "all"

    # existing stage output without --force, then with it
    code, _, err = run_cli(["quantize", f, "-o", q], capsys)
    assert_input_error(code, err, "already exists")
    code, _, err = run_cli(["quantize", f, "-o", q, "--force", "--target", "avx2"], capsys)
    assert code == 0, err
    assert json.loads((q / "manifest.json").read_text())["target"]["name"] == "avx2"


# --------------------------------------------------------------------------- optimize end to end


def test_optimize_json_and_reuse(tiny_classifier, tiny_recipe_file, tmp_path, capsys):
    out = tmp_path / "out"
    code, stdout, err = run_cli(["optimize", tiny_classifier, "--recipe", tiny_recipe_file, "-o", out, "--json"], capsys)
    assert code == 0, err
    report = json.loads(stdout)
    assert [s["name"] for s in report["stages"]] == ["pytorch", "export", "fuse", "quantize"]
    assert report["settings"]["heldout"]["rows"] == 12
    assert json.loads((out / "report.json").read_text()) == report
    assert "[1/3] export: running" in err

    # --force on the same output: every pass comes from the cache, and the log says so
    code, stdout, err = run_cli(["optimize", tiny_classifier, "--recipe", tiny_recipe_file, "-o", out, "--force"], capsys)
    assert code == 0, err
    for i, name in enumerate(["export", "fuse", "quantize"], start=1):
        assert f"[{i}/3] {name}: reused from cache" in err
    assert f"artifact: {out}" in stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert [p["reused"] for p in manifest["passes"]] == [True, True, True]
    assert tmp_leftovers(tmp_path) == []


def test_optimize_flags_override_recipe(tiny_classifier, tiny_recipe_file, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = run_cli(["-q", "optimize", tiny_classifier, "--recipe", tiny_recipe_file, "-o", out,
                            "--target", "avx2", "--limit", "6"], capsys)
    assert code == 0, err
    assert err.strip() == ""  # --quiet: no log lines
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"]["name"] == "avx2"
    assert manifest["recipe"]["evaluation"]["limit"] == 6
    assert manifest["heldout"]["rows"] == 6


def test_failed_pass_exit_3_leaves_nothing(tiny_classifier, tiny_recipe_file, tmp_path, capsys, monkeypatch,
                                           isolated_cache):
    from xformopt.errors import PassFailed
    from xformopt.passes.fuse.run import FusePass

    def broken(self, ctx, src, dst, options):
        (dst / "model.onnx").write_bytes(b"partial")
        (dst / ".candidates").mkdir()
        raise PassFailed("fusion went wrong on purpose")

    monkeypatch.setattr(FusePass, "run", broken)
    out = tmp_path / "out"
    code, _, err = run_cli(["optimize", tiny_classifier, "--recipe", tiny_recipe_file, "-o", out], capsys)
    assert code == 3
    lines = error_lines(err)
    assert lines[-1] == "error: fusion went wrong on purpose"
    assert sum(line.startswith("error:") for line in lines) == 1
    assert not out.exists()
    assert tmp_leftovers(tmp_path) == []
    entries = [p.name for p in (isolated_cache / "passes").iterdir()]
    assert len(entries) == 1 and not entries[0].startswith(".")  # only the finished export


def test_failed_pass_command_exit_3(exported_classifier, tmp_path, capsys, monkeypatch):
    from xformopt.errors import PassFailed
    from xformopt.passes.quantize.run import QuantizePass

    def broken(self, ctx, src, dst, options):
        (dst / "model.onnx").write_bytes(b"partial")
        raise PassFailed("quantize went wrong on purpose")

    monkeypatch.setattr(QuantizePass, "run", broken)
    out = tmp_path / "q"
    code, _, err = run_cli(["quantize", exported_classifier[0], "-o", out], capsys)
    assert code == 3
    assert error_lines(err)[-1] == "error: quantize went wrong on purpose"
    assert not out.exists()
    assert tmp_leftovers(tmp_path) == []


# --------------------------------------------------------------------------- ordering contract across commands


@pytest.fixture
def quantized_stage(fused_classifier, tmp_path, capsys) -> Path:
    q = tmp_path / "q"
    code, _, err = run_cli(["quantize", fused_classifier[0], "-o", q], capsys)
    assert code == 0, err
    assert [p["pass"] for p in json.loads((q / "manifest.json").read_text())["passes"]] == ["quantize"]
    return q


def test_fuse_after_quantize_command_is_input_error(quantized_stage, tmp_path, capsys):
    code, _, err = run_cli(["fuse", quantized_stage, "-o", tmp_path / "f2", "--select", "all"], capsys)
    assert_input_error(code, err, "cannot run after 'quantize'")
    assert not (tmp_path / "f2").exists()


def test_quantize_twice_command_is_input_error(quantized_stage, tmp_path, capsys):
    code, _, err = run_cli(["quantize", quantized_stage, "-o", tmp_path / "q2"], capsys)
    assert_input_error(code, err, "already quantized")
    assert not (tmp_path / "q2").exists()


def test_export_of_an_onnx_stage_is_input_error(exported_classifier, tmp_path, capsys):
    code, _, err = run_cli(["export", exported_classifier[0], "-o", tmp_path / "e2"], capsys)
    assert_input_error(code, err)
    assert not (tmp_path / "e2").exists()


def test_a_pass_command_never_carries_its_input_reports(tiny_classifier, heldout_file, tmp_path, capsys):
    """`quantize a/ -o q/` of an optimize artifact must not pass off a's report as q's."""
    e, q = tmp_path / "e", tmp_path / "q"
    code, _, err = run_cli(["export", tiny_classifier, "-o", e, "--data", heldout_file], capsys)
    assert code == 0, err
    for name in ("report.json", "report.md", "accuracy_latency.png"):
        (e / name).write_text("from an earlier run")
    (e / "reference").mkdir()
    code, _, err = run_cli(["quantize", e, "-o", q, "--data", heldout_file], capsys)
    assert code == 0, err
    assert sorted(p.name for p in q.iterdir() if p.name.startswith(("report", "accuracy", "reference"))) == []
    assert (q / "tokenizer.json").is_file() and (q / "config.json").is_file()


def test_a_chain_keeps_the_task_its_first_command_chose(tiny_classifier, heldout_file, tmp_path, capsys):
    e, f = tmp_path / "e", tmp_path / "f"
    code, _, err = run_cli(["export", tiny_classifier, "-o", e, "--task", "feature-extraction", "--data", heldout_file], capsys)
    assert code == 0, err
    code, out, err = run_cli(["fuse", e, "-o", f, "--select", "all", "--data", heldout_file, "--json"], capsys)
    assert code == 0, err
    assert json.loads((f / "manifest.json").read_text())["input"]["task"] == "feature-extraction"
    from xformopt import tasks

    assert tasks.detect(json.loads((tiny_classifier / "config.json").read_text()), decoder=False).name == "text-classification"


def test_passes_list_shows_each_registered_pass(capsys):
    from xformopt.passes import REGISTRY

    code, out, err = run_cli(["passes", "list", "--json"], capsys)
    assert code == 0, err
    rows = {row["name"]: row for row in json.loads(out)}
    assert set(rows) == set(REGISTRY)
    assert rows["export"]["consumes"] == "hf" and rows["export"]["produces"] == "onnx"
    assert rows["fuse"]["must_not_follow"] == {"quantize": "fusions match float subgraphs; put fuse before quantize",
                                               "int4": "fusions match float subgraphs; put fuse before int4"}
    assert all(row["summary"] and row["needs"] for row in rows.values())
    # each pass declares the optimize flags it reads: --train-data feeds prune's data and distill's train_data
    assert rows["prune"]["flags"] == {"--train-data": "data"} and rows["distill"]["flags"]["--train-data"] == "train_data"
    assert rows["quantize"]["data_options"] == ["calibration_data", "budget_data"] and rows["export"]["flags"] == {}
