"""`xformopt bench` on an encoder-decoder artifact (issue 55): it re-measures what `optimize` measured (the
report's metrics on the same rows, exactly; one sentence end to end alone in repeats; decoded tokens/s), its
document is the typed bench document, the gate against its own report passes and fails (exit 1) on a real
BLEU drop (the graphs of an untrained model). No latency value is asserted: the host is shared."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import ANY_LATENCY_DRIFT, check_bench_report_and_gate, run_cli
from tiny_seq2seq import build_seq2seq

from xformopt.benchmarking.types import bench_errors
from xformopt.seq2seq import DECODER_FILE, ENCODER_FILE

pytestmark = pytest.mark.filterwarnings("ignore")
QUICK = ["--rounds", "3", "--repeats", "2", "--max-latency-regression", ANY_LATENCY_DRIFT]


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, trained_bart_src):
    """The tiny BART trained on the reverse task (BLEU means something) through export -> quantize,
    evaluated on 16 held-out rows."""
    from xformopt import api

    out = tmp_path_factory.mktemp("s2s-bench") / "out"
    api.optimize(trained_bart_src, output=out, use_cache=False, limit=16, threads=1, latency_rounds=3, warmup=1,
                 repeats=2, recipe={"passes": [{"export": {}}, {"quantize": {}}]})
    return out


def test_bench_reproduces_the_report_and_gates_against_it(artifact, capsys):
    bench = check_bench_report_and_gate(artifact, capsys)  # the report's metrics exactly, the gate passes
    report = json.loads((artifact / "report.json").read_text())
    assert bench_errors(bench) == [] and bench["headline_metric"] == "bleu"
    assert bench["artifact"]["metrics"]["bleu"]["value"] > 50  # the trained model: a BLEU worth reproducing
    assert {"same_output_as_baseline", "next_token_agreement"} <= set(bench["artifact"]["metrics"])
    assert bench["artifact"]["generation"] == report["artifact"]["generation"]  # the report's beams and bound
    latency = bench["artifact"]["latency"]
    assert latency["unit"] == report["artifact"]["latency"]["unit"]  # the same timed call: like with like
    assert latency["repeats"] == 1 and len(latency["repeat_medians_ms"]) == 1 and latency["median_ms"] > 0
    assert bench["artifact"]["tokens_per_s"] > 0


def test_the_gate_writes_its_documents(artifact, tmp_path, capsys):
    code, out, err = run_cli(["bench", artifact, "--baseline", artifact / "report.json", *QUICK,
                              "-o", tmp_path / "bench.json", "--junit", tmp_path / "bench.xml"], capsys)
    assert code == 0 and "gate passed" in out and "decoded tokens/s" in out, (out, err)
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert bench_errors(doc) == [] and doc["comparison"]["gated"] and doc["comparison"]["passed"]
    assert {c["name"] for c in doc["comparison"]["checks"]} == {"latency_median_ms", "bleu"}
    assert "<testsuite" in (tmp_path / "bench.xml").read_text()


def test_the_gate_fails_when_the_graphs_lose_bleu(artifact, tmp_path, capsys):
    """The artifact's graphs swapped for an untrained BART's (same shapes and tokenizer): a real accuracy drop
    against the trained artifact's report is exit 1 naming BLEU, and a budget above the drop passes it."""
    from transformers import AutoModelForSeq2SeqLM

    from xformopt.seq2seq.export import export_seq2seq

    worse = tmp_path / "worse"
    shutil.copytree(artifact, worse)
    untrained = build_seq2seq(tmp_path / "untrained", "bart")
    for name in (ENCODER_FILE, DECODER_FILE):
        (worse / name).unlink()
    export_seq2seq(AutoModelForSeq2SeqLM.from_pretrained(untrained).eval(), worse, 18)
    code, out, err = run_cli(["bench", worse, "--baseline", artifact / "report.json", *QUICK, "--json"], capsys)
    assert code == 1, (out, err)
    checks = {c["name"]: c for c in json.loads(out)["comparison"]["checks"]}
    assert checks["bleu"]["verdict"] == "regression" and checks["bleu"]["change_points"] < -0.5
    assert checks["latency_median_ms"]["verdict"] == "pass"  # any drift allowed: the failure is the metric's
    assert "bleu regression" in err
    drop = -checks["bleu"]["change_points"]
    code, out, err = run_cli(["bench", worse, "--baseline", artifact / "report.json", *QUICK,
                              "--max-accuracy-drop", f"{drop + 1:.2f}"], capsys)
    assert code == 0 and "gate passed" in out, (out, err)  # BLEU is its own points: a budget above the drop


def test_a_missing_graph_is_one_line_and_exit_2(artifact, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(artifact, broken)
    (broken / DECODER_FILE).unlink()
    code, out, err = run_cli(["bench", broken, *QUICK], capsys)
    assert code == 2 and DECODER_FILE in err and len(err.strip().splitlines()) == 1, err
    assert (broken / ENCODER_FILE).is_file()
    code, out, err = run_cli(["bench", artifact, "--new-tokens", "8"], capsys)  # the decoder bench's own flag
    assert code == 2 and "text-generation artifacts only" in err, err


def test_a_single_pass_export_is_measured_with_what_it_has(trained_bart_src, tmp_path, capsys):
    """`xformopt export` output (no report, no reference/): bench measures it on the default rows, says what it
    skipped, and compares with nothing."""
    code, out, err = run_cli(["export", trained_bart_src, "-o", tmp_path / "chain"], capsys)
    assert code == 0, err
    code, out, err = run_cli(["bench", tmp_path / "chain", "--limit", "8", "--threads", "1", "--rounds", "3",
                              "--repeats", "1", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert bench_errors(doc) == [] and not doc["comparison"]["comparable"] and doc["artifact"]["stage"] == "export"
    assert "bleu" in doc["artifact"]["metrics"] and "same_output_as_baseline" not in doc["artifact"]["metrics"]
    assert any("same_output_as_baseline and next_token_agreement skipped" in n for n in doc["notes"])
