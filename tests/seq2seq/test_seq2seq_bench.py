"""`xformopt bench` on an encoder-decoder artifact (issue 55): it re-measures what `optimize` measured (the
report's metrics on the same rows, exactly; one sentence end to end alone in repeats; decoded tokens/s), its
document is the typed bench document, the gate against its own report passes and fails (exit 1) on an
injected BLEU drop. No latency value is asserted: the host is shared."""

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
def artifact(tmp_path_factory):
    """A tiny random BART through export -> quantize, evaluated on 12 held-out rows."""
    from xformopt import api

    root = tmp_path_factory.mktemp("s2s-bench")
    src = build_seq2seq(root / "hf", "bart")
    api.optimize(src, output=root / "out", use_cache=False, limit=12, threads=1, latency_rounds=3, warmup=1,
                 repeats=2, recipe={"passes": [{"export": {}}, {"quantize": {}}]})
    return root / "out"


def test_bench_reproduces_the_report_and_gates_against_it(artifact, capsys):
    bench = check_bench_report_and_gate(artifact, capsys)  # the report's metrics exactly, the gate passes
    report = json.loads((artifact / "report.json").read_text())
    assert bench_errors(bench) == [] and bench["headline_metric"] == "bleu"
    assert {"same_output_as_baseline", "next_token_agreement"} <= set(bench["artifact"]["metrics"])
    assert bench["artifact"]["generation"] == report["artifact"]["generation"]  # the report's beams and bound
    latency = bench["artifact"]["latency"]
    assert latency["unit"] == report["artifact"]["latency"]["unit"]  # the same timed call: like with like
    assert latency["repeats"] == 1 and len(latency["repeat_medians_ms"]) == 1 and latency["median_ms"] > 0
    assert bench["artifact"]["tokens_per_s"] > 0


def test_the_gate_writes_its_documents_and_fails_on_a_bleu_drop(artifact, tmp_path, capsys):
    code, out, err = run_cli(["bench", artifact, "--baseline", artifact / "report.json", *QUICK,
                              "-o", tmp_path / "bench.json", "--junit", tmp_path / "bench.xml"], capsys)
    assert code == 0 and "gate passed" in out and "decoded tokens/s" in out, (out, err)
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert bench_errors(doc) == [] and doc["comparison"]["gated"] and doc["comparison"]["passed"]
    assert {c["name"] for c in doc["comparison"]["checks"]} == {"latency_median_ms", "bleu"}
    assert "<testsuite" in (tmp_path / "bench.xml").read_text()

    # A baseline 2 BLEU above what the artifact scores: BLEU is its own points (0-100), so the default
    # 0.5-point budget fails it; an earlier bench document serves as the baseline as a report does.
    doctored = dict(doc)
    bleu = doc["artifact"]["metrics"]["bleu"]
    doctored["artifact"] = {**doc["artifact"], "metrics": {**doc["artifact"]["metrics"],
                                                            "bleu": {**bleu, "value": bleu["value"] + 2.0}}}
    (tmp_path / "doctored.json").write_text(json.dumps(doctored))
    code, out, err = run_cli(["bench", artifact, "--baseline", tmp_path / "doctored.json", *QUICK, "--json"], capsys)
    assert code == 1, (out, err)
    failed = [c for c in json.loads(out)["comparison"]["checks"] if c["verdict"] == "regression"]
    assert [c["name"] for c in failed] == ["bleu"] and failed[0]["change_points"] == pytest.approx(-2.0)
    assert "bleu regression" in err
    code, out, err = run_cli(["bench", artifact, "--baseline", tmp_path / "doctored.json", *QUICK,
                              "--max-accuracy-drop", "2.5"], capsys)
    assert code == 0 and "gate passed" in out, (out, err)  # within a 2.5-point budget


def test_a_missing_graph_is_one_line_and_exit_2(artifact, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(artifact, broken)
    (broken / DECODER_FILE).unlink()
    code, out, err = run_cli(["bench", broken, *QUICK], capsys)
    assert code == 2 and DECODER_FILE in err and len(err.strip().splitlines()) == 1, err
    assert (broken / ENCODER_FILE).is_file()
