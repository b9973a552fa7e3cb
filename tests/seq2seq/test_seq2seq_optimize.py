"""`xformopt optimize` end to end on tiny T5, BART and Marian models built in code: export -> fuse ->
dynamic INT8 (static on the single-pass chain), every stage scored (BLEU) and timed; the trained BART's INT8 keeps
BLEU within a point."""

from __future__ import annotations

import json

import pytest
from tiny_seq2seq import build_seq2seq

from xformopt import api
from xformopt.errors import InputError
from xformopt.seq2seq import DECODER_FILE, ENCODER_FILE

pytestmark = pytest.mark.filterwarnings("ignore")
QUICK = dict(limit=24, threads=1, latency_rounds=6, warmup=1, repeats=2)


def _stages(result) -> dict:
    return {s["name"]: s for s in result.report["stages"]}


@pytest.fixture(scope="module")
def trained_bart(trained_bart_src):
    return trained_bart_src


def test_trained_bart_int8_keeps_bleu_and_export_equals_pytorch(trained_bart, tmp_path):
    # the whole vendored test split (100 rows): on 24, one row's slip is already a 1.4-point BLEU swing
    result = api.optimize(trained_bart, output=tmp_path / "out", use_cache=False, max_accuracy_drop=1.0,
                          **{**QUICK, "limit": None})
    stages = _stages(result)
    assert list(stages) == ["pytorch", "export", "fuse", "quantize"]
    base = stages["pytorch"]["metrics"]["bleu"]["value"]
    assert base > 80  # the model learned the task: the BLEU comparison below means something
    assert stages["export"]["metrics"]["same_output_as_baseline"]["value"] == 1.0  # fp32 greedy == PyTorch's
    assert base - stages["quantize"]["metrics"]["bleu"]["value"] <= 1.0
    assert stages["quantize"]["metrics"]["bleu"]["ci95"][0] <= stages["quantize"]["metrics"]["bleu"]["value"]  # any host: an interval's low end
    records = {p["pass"]: p["record"] for p in result.manifest["passes"]}
    assert records["quantize"]["budget"]["budget_met"] and records["quantize"]["coverage"]["int8"] > 0
    assert records["export"]["parity"]["max_abs_diff"] < 1e-4
    assert records["fuse"]["fused_possible"].get("MultiHeadAttention", 0) >= 4  # self + cross, 2 decoder layers
    artifact = result.report["artifact"]
    assert artifact["tokens_per_s"] > 0 and len(artifact["step_cost_ms"]) >= 2
    out = tmp_path / "out"
    assert (out / ENCODER_FILE).is_file() and (out / DECODER_FILE).is_file() and (out / "report.md").is_file()
    assert json.loads((out / "manifest.json").read_text())["input"]["task"] == "translation"


@pytest.mark.parametrize("family", ["t5", "marian"])
def test_random_families_go_through_optimize(family, tmp_path):
    src = build_seq2seq(tmp_path / "hf", family)
    result = api.optimize(src, output=tmp_path / "out", use_cache=False, **QUICK)
    stages = _stages(result)
    assert list(stages) == ["pytorch", "export", "fuse", "quantize"]
    assert stages["export"]["metrics"]["same_output_as_baseline"]["value"] == 1.0
    assert {"bleu", "chrf", "next_token_agreement"} <= set(stages["quantize"]["metrics"])


def test_summarization_scores_rouge(trained_bart, tmp_path):
    result = api.optimize(trained_bart, output=tmp_path / "out", use_cache=False, task="summarization",
                          recipe={"passes": [{"export": {}}]}, **QUICK)
    metrics = _stages(result)["export"]["metrics"]
    assert {"rouge1", "rouge2", "rougeL"} <= set(metrics) and result.report["headline_metric"] == "rougeL"


def test_beam_width_from_the_flags_is_what_every_stage_generates_with(trained_bart, tmp_path, capsys):
    from helpers import run_cli

    code, out, err = run_cli(["optimize", trained_bart, "-o", tmp_path / "out", "--no-cache", "--num-beams", "3",
                              "--limit", "12", "--threads", "1", "--json", "--recipe", str(_export_only(tmp_path))],
                             capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["artifact"]["generation"]["num_beams"] == 3 and "3 beam(s)" in err
    export = {s["name"]: s for s in report["stages"]}["export"]
    assert export["metrics"]["same_output_as_baseline"]["value"] == 1.0  # beams too: the artifact's are PyTorch's
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["recipe"]["evaluation"]["num_beams"] == 3


def _export_only(tmp_path):
    path = tmp_path / "export-only.yaml"
    path.write_text("name: export-only\npasses:\n  - export: {}\nevaluation:\n  latency_rounds: 4\n  warmup: 1\n"
                    "  repeats: 2\n")
    return path


def test_a_beam_width_for_a_model_that_does_not_generate_text_is_refused(tiny_classifier, tmp_path, capsys):
    from helpers import run_cli

    code, _, err = run_cli(["optimize", tiny_classifier, "-o", tmp_path / "out", "--num-beams", "2"], capsys)
    assert code == 2 and "--num-beams" in err and "text-classification" in err and not (tmp_path / "out").exists()


def test_refusals_before_any_work(trained_bart, tmp_path):
    with pytest.raises(InputError, match="encoder-decoder"):
        api.optimize(trained_bart, output=tmp_path / "b", task="text-classification")
    assert not (tmp_path / "b").exists()


def test_single_pass_commands_chain(tmp_path, capsys):
    from helpers import run_cli

    src = build_seq2seq(tmp_path / "hf", "t5")
    code, out, err = run_cli(["export", src, "-o", tmp_path / "a"], capsys)
    assert code == 0 and "parity max|diff|" in out + err, err
    code, _, err = run_cli(["quantize", tmp_path / "a", "-o", tmp_path / "b"], capsys)
    assert code == 0, err
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert [p["pass"] for p in manifest["passes"]] == ["export", "quantize"]
    assert manifest["passes"][1]["record"]["coverage"]["int8"] > 0
    # static INT8 takes the same stage: each graph calibrated on the feeds recorded while the float graphs generate
    code, out, err = run_cli(["quantize", tmp_path / "a", "-o", tmp_path / "s", "--mode", "static"], capsys)
    assert code == 0, err
    record = json.loads((tmp_path / "s" / "manifest.json").read_text())["passes"][1]["record"]
    assert record["mode"] == "static" and record["coverage"]["int8"] == record["coverage"]["weighted_gemms"]
    assert record["calibration"]["encoder_feeds"] > 0 and record["calibration"]["decoder_feeds"] > 0
    assert "quantize: static QOperator" in out + err
    code, _, err = run_cli(["export", tmp_path / "a", "-o", tmp_path / "c"], capsys)
    assert code == 2 and "ONNX stage" in err
