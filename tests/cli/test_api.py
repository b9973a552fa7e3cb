"""The Python API (xformopt.optimize / run_pass / load / bench / search) on the tiny models: what each
returns, that it is what the CLI prints, and that errors are the documented classes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import ANY_LATENCY_DRIFT, run_cli

import xformopt
from xformopt.errors import BudgetMissed, GateFailed, InputError, XformoptError

ROWS = 16


def tiny_recipe() -> dict:
    # select=all: which fusion candidate "fastest" keeps depends on timing; nothing here may
    return {"name": "tiny", "target": "auto", "passes": ["export", {"fuse": {"select": "all"}}, "quantize"],
            "evaluation": {"latency_rounds": 3, "warmup": 1, "repeats": 1}}


@pytest.fixture(scope="module")
def optimized(tmp_path_factory, tiny_classifier, heldout_file):
    root = tmp_path_factory.mktemp("api")
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XFORMOPT_CACHE_DIR", str(root / "cache"))
        result = xformopt.optimize(tiny_classifier, recipe=tiny_recipe(), data=heldout_file, output=root / "out",
                                   limit=ROWS, log=lines.append)
    return result, lines


def test_import_is_lazy_and_exports_the_api():
    code = ("import sys, xformopt; heavy = [m for m in ('torch', 'onnxruntime', 'transformers') if m in sys.modules]; "
            "print(heavy, sorted(xformopt.__all__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    heavy, names = out.split("] ", 1)
    assert heavy == "["  # none of them imported by `import xformopt`
    for name in ("optimize", "run_pass", "load", "bench", "search", "Result", "BenchResult", "XformoptError", "BudgetMissed"):
        assert name in names
    assert set(xformopt.__all__) == {"__version__", *xformopt._EXPORTS}
    assert xformopt.optimize is xformopt.api.optimize and xformopt.InputError is InputError


def test_the_command_line_starts_without_the_heavy_libraries():
    """`xformopt --help` and every command's parsing stay quick: the libraries a pass needs load when it runs."""
    code = ("import sys, xformopt.cli.app; "
            "print([m for m in ('torch', 'onnxruntime', 'transformers', 'onnxscript', 'onnx') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    with pytest.raises(AttributeError):
        xformopt.no_such_name  # noqa: B018


def test_bench_and_search_are_plain_functions_even_after_their_packages_load():
    import types

    import xformopt.benchmarking.measure
    import xformopt.recipe_search.space

    assert xformopt.bench is xformopt.api.bench and xformopt.search is xformopt.api.search
    assert not isinstance(xformopt.bench, types.ModuleType)
    with pytest.raises(InputError, match="artifact not found|no manifest|not found"):
        xformopt.bench("/nonexistent/artifact")  # the call is api.bench


def test_optimize_returns_the_artifact_manifest_report_and_figures(optimized):
    result, lines = optimized
    assert result.verdict == "pass" and result.passed and result.failure is None
    assert (result.artifact / "model.onnx").is_file()
    assert json.loads((result.artifact / "manifest.json").read_text()) == json.loads(json.dumps(result.manifest, default=str))
    assert json.loads((result.artifact / "report.json").read_text()) == json.loads(json.dumps(result.report, default=str))
    assert [p["pass"] for p in result.manifest["passes"]] == ["export", "fuse", "quantize"]
    assert result.manifest["recipe"]["evaluation"]["limit"] == ROWS  # the override reached the recipe
    f = result.figures
    stages = result.report["stages"]
    assert f["stage"] == "quantize" and f["metric"] == result.report["headline_metric"] == "accuracy"
    assert f["value"] == result.report["artifact"]["metrics"]["accuracy"]["value"]
    assert f["baseline_value"] == stages[0]["metrics"]["accuracy"]["value"]
    assert f["latency_ms"] == stages[-1]["latency"]["median_ms"] > 0
    assert f["baseline_latency_ms"] == stages[0]["latency"]["median_ms"] > 0
    assert f["solo_latency_ms"] == result.report["artifact"]["latency"]["median_ms"] > 0
    assert f["speedup"] == stages[-1]["speedup"] and f["size_mb"] == round(stages[-1]["size_bytes"] / 1e6, 2)
    text = str(result)
    assert text.startswith(f"pass: {result.artifact}") and "accuracy" in text and " ms " in text
    assert any("quantize" in line for line in lines)  # log= received the progress lines


def test_optimize_bad_input_is_an_input_error_and_writes_nothing(tiny_classifier, heldout_file, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(InputError, match="unknown setting.*no_such_flag"):
        xformopt.optimize(tiny_classifier, recipe=tiny_recipe(), output=out, no_such_flag=1)
    with pytest.raises(InputError, match="--calibration-data: no pass of recipe 'tiny' reads it"):
        xformopt.optimize(tiny_classifier, recipe=tiny_recipe(), output=out, calibration_data=heldout_file)
    with pytest.raises(InputError, match="data file not found"):
        xformopt.optimize(tiny_classifier, recipe=tiny_recipe(), output=out, data=tmp_path / "missing.csv")
    with pytest.raises(XformoptError):
        xformopt.optimize(tmp_path / "no-model", output=out)
    assert not out.exists()


def test_cli_optimize_goes_through_the_api(optimized, tiny_classifier, heldout_file, tmp_path, capsys, monkeypatch):
    """`xformopt optimize` is api.optimize plus rendering: the same recipe, the same passes."""
    calls = []
    real = xformopt.api.optimize

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(xformopt.api, "optimize", spy)
    (tmp_path / "r.yaml").write_text(json.dumps(tiny_recipe()))
    code, out, err = run_cli(["optimize", tiny_classifier, "-r", tmp_path / "r.yaml", "--data", heldout_file,
                              "--limit", ROWS, "-o", tmp_path / "cli", "--json"], capsys)
    assert code == 0, err
    assert len(calls) == 1 and calls[0]["limit"] == ROWS
    report = json.loads(out)
    assert [s["name"] for s in report["stages"]] == [s["name"] for s in optimized[0].report["stages"]]
    manifest = json.loads((tmp_path / "cli" / "manifest.json").read_text())
    assert manifest["recipe"] == optimized[0].manifest["recipe"]


def test_run_pass_chain_and_its_manifest(tiny_classifier, tmp_path):
    e = xformopt.run_pass("export", tiny_classifier, tmp_path / "e")
    f = xformopt.run_pass("fuse", e.path, tmp_path / "f", select="all")
    assert e.verdict == f.verdict == "pass" and (f.path / "model.onnx").is_file()
    manifest = json.loads((f.path / "manifest.json").read_text())
    assert [p["pass"] for p in manifest["passes"]] == ["export", "fuse"]
    assert manifest["passes"][-1] == json.loads(json.dumps(f.entry))
    assert manifest["input"]["source"] == str(tiny_classifier) and "host" not in manifest and "recipe" not in manifest
    assert f.summary and f.record == f.entry["record"]
    with pytest.raises(InputError, match="takes a PyTorch model directory"):
        xformopt.run_pass("export", f.path, tmp_path / "again")
    with pytest.raises(InputError):
        xformopt.run_pass("fuse", e.path, tmp_path / "bad", select="sometimes")
    with pytest.raises(InputError, match="no pass named 'fuzz'; choose prune, distill, export, fuse, quantize"):
        xformopt.run_pass("fuzz", e.path, tmp_path / "bad")
    assert not (tmp_path / "again").exists() and not (tmp_path / "bad").exists()


def _budget_always_missed(monkeypatch):
    """The float graph scores 90, every INT8 candidate 80: no candidate meets a 0.5-point budget."""
    import xformopt.passes.quantize.budget as q_mod

    scores = iter([90.0])
    monkeypatch.setattr(q_mod, "budget_evaluation", lambda *a, **k: (next(scores, 80.0), {}))


def test_budget_miss_is_distinguishable_and_carries_the_result(fused_classifier, tmp_path, monkeypatch):
    _budget_always_missed(monkeypatch)
    out = tmp_path / "q"
    with pytest.raises(BudgetMissed, match="accuracy budget not met") as caught:
        xformopt.run_pass("quantize", fused_classifier[0], out, mode="static", max_accuracy_drop=0.5)
    assert isinstance(caught.value, GateFailed) and not isinstance(caught.value, InputError)
    assert caught.value.exit_code == 1
    kept = caught.value.result
    assert kept.verdict == "budget-missed" and kept.record["budget_met"] is False and (out / "model.onnx").is_file()
    _budget_always_missed(monkeypatch)
    unchecked = xformopt.run_pass("quantize", fused_classifier[0], tmp_path / "q2", mode="static",
                                  max_accuracy_drop=0.5, check=False)
    assert unchecked.verdict == "budget-missed" and "accuracy budget not met" in unchecked.failure


def test_bench_result_informative_then_gated(optimized, tmp_path):
    result, _ = optimized
    informative = xformopt.bench(result.artifact, rounds=3, repeats=1, output=tmp_path / "b.json")
    assert informative.kind == "encoder" and not informative.gated and informative.verdict == "informative"
    assert json.loads((tmp_path / "b.json").read_text()) == json.loads(json.dumps(informative.doc, default=str))
    want = result.report["artifact"]["metrics"]["accuracy"]["value"]
    assert informative.doc["artifact"]["metrics"]["accuracy"]["value"] == pytest.approx(want, abs=1e-9)
    # Latency may drift any way on a shared machine: allow it, so only accuracy decides the verdict.
    gated = xformopt.bench(result.artifact, baseline=tmp_path / "b.json", rounds=3, repeats=1,
                           max_latency_regression=ANY_LATENCY_DRIFT, junit=tmp_path / "b.xml")
    checks = {c["name"]: c["verdict"] for c in gated.comparison["checks"]}
    assert gated.gated and checks["accuracy"] == "pass"  # the same rows through the same graph
    # the verdict follows the checks
    assert gated.verdict == ("regression" if "regression" in checks.values() else "pass") != "informative"
    assert (gated.failure is None) == (gated.verdict == "pass") == gated.comparison["passed"]
    assert "<testsuite" in (tmp_path / "b.xml").read_text()
    with pytest.raises(InputError, match="apply to text-generation artifacts only"):
        xformopt.bench(result.artifact, prompt_tokens=[16])


def test_bench_check_raises_gate_failed_on_a_regression(optimized, tmp_path):
    result, _ = optimized
    base = xformopt.bench(result.artifact, rounds=3, repeats=1).doc
    accuracy = base["artifact"]["metrics"]["accuracy"]
    assert accuracy["value"] <= 0.9  # a random tiny classifier
    accuracy["value"] += 0.1  # the baseline was 10 points better
    (tmp_path / "base.json").write_text(json.dumps(base, default=str))
    regressed = xformopt.bench(result.artifact, baseline=tmp_path / "base.json", rounds=3, repeats=1,
                               max_latency_regression=ANY_LATENCY_DRIFT)
    assert regressed.verdict == "regression" and "accuracy" in regressed.failure
    with pytest.raises(GateFailed, match="accuracy"):
        xformopt.bench(result.artifact, baseline=tmp_path / "base.json", rounds=3, repeats=1,
                       max_latency_regression=ANY_LATENCY_DRIFT, check=True)


def test_search_refuses_bad_settings_before_any_work(tiny_classifier, tmp_path):
    with pytest.raises(InputError, match="--objective"):
        xformopt.search(tiny_classifier, output=tmp_path / "s", objective="speed")
    with pytest.raises(InputError, match="--sampler"):
        xformopt.search(tiny_classifier, output=tmp_path / "s", sampler="random")
    assert not (tmp_path / "s").exists()


@pytest.fixture(scope="module")
def gpt2_artifact(tmp_path_factory):
    from toy_decoder import build_decoder

    root = tmp_path_factory.mktemp("api-gpt2")
    model = build_decoder(root / "model", "gpt2")
    return xformopt.run_pass("export", model, root / "e").path


def test_load_a_decoder_generates_as_the_generation_loop_does(gpt2_artifact):
    from xformopt.decoder.generate import generate
    from xformopt.models import load_tokenizer
    from xformopt.runtime.decoder import OrtDecoder

    generator = xformopt.load(gpt2_artifact, threads=1)
    assert generator.task == "text-generation"
    seen: list[int] = []
    out = generator.generate("the movie was", 6, stop_at_eos=False, on_token=seen.append)
    tokenizer = load_tokenizer(gpt2_artifact)
    want = generate(OrtDecoder(gpt2_artifact, threads=1), list(tokenizer("the movie was")["input_ids"]), 6).new_ids
    assert out.generation.new_ids == seen == want and len(want) == 6
    assert out.text == tokenizer.decode(want, skip_special_tokens=True) and out.decoding == "greedy"
    sampled = [generator.generate("the movie was", 6, top_k=20, seed=3, stop_at_eos=False).generation.new_ids for _ in range(2)]
    assert sampled[0] == sampled[1]  # a seed gives the same tokens
    assert out.to_dict()["new_ids"] == want
    with pytest.raises(InputError, match="it does not embed"):
        generator.embed(["a text"])
    with pytest.raises(InputError, match="the prompt is empty"):
        generator.generate("  ")


def test_load_an_encoder_artifact_is_the_runtime_predictor(optimized, tiny_encoder, tmp_path):
    from xformopt.runtime.predictor import Predictor, load_predictor

    result, _ = optimized
    predictor = xformopt.load(result.artifact, threads=1)
    assert isinstance(predictor, Predictor) and predictor.task == "text-classification"
    answers = predictor.predict(["a fine film", "a dull film", "a film"])  # (two strings would read as one pair)
    assert len(answers) == 3 and {a["label"] for a in answers[0]} == {"negative", "positive"}
    assert sum(a["score"] for a in answers[0]) == pytest.approx(1.0)
    with pytest.raises(InputError, match="needs a feature-extraction artifact"):
        predictor.embed(["a text"])
    exported = xformopt.run_pass("export", tiny_encoder, tmp_path / "e").path
    vectors = xformopt.load(exported).embed(["a text", "another text"])
    assert vectors.shape == (2, 64)
    assert (vectors == load_predictor(exported).embed(["a text", "another text"])).all()
    with pytest.raises(InputError, match="artifact not found"):
        xformopt.load(tmp_path / "nothing")
