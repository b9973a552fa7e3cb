"""pipeline.run on the tiny classifier: the artifact, the manifest, the report, the cache, atomicity."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from xformopt import pipeline, recipe, targets
from xformopt.artifact import MANIFEST_SCHEMA, hash_dir
from xformopt.errors import InputError, PassFailed
from xformopt.logs import forwarded_to
from xformopt.measure import host
from xformopt.report.schema import REPORT_SCHEMA

LAYERS = 2
ROWS = 16
ROUNDS = 3


def tiny_recipe(heldout: Path, **evaluation) -> recipe.Recipe:
    return recipe.validate({
        "name": "tiny",
        "target": "auto",  # the default users get: whatever this host is
        # select=all: which candidate "fastest" keeps depends on timing, and the figures below must not
        "passes": ["export", {"fuse": {"select": "all"}}, "quantize"],
        "evaluation": {"data": str(heldout), "limit": ROWS, "latency_rounds": ROUNDS, "warmup": 1, **evaluation},
    })


def tmp_leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in Path(directory).iterdir() if re.match(r"^\..*\.(tmp|old)-", p.name))


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, tiny_classifier, heldout_file):
    """One full run (export -> fuse -> quantize) with its own pass cache, shared by this module."""
    root = tmp_path_factory.mktemp("pipeline")
    cache_dir = root / "cache"
    messages: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XFORMOPT_CACHE_DIR", str(cache_dir))
        with forwarded_to(messages.append):
            result = pipeline.run(str(tiny_classifier), tiny_recipe(heldout_file), root / "out")
    return result, messages, cache_dir


def test_artifact_files(first_run):
    result, _, _ = first_run
    out = result.out
    names = {p.name for p in out.iterdir()}
    # (transformers 5 keeps the special tokens in tokenizer_config.json: no special_tokens_map.json)
    assert {"model.onnx", "config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
            "manifest.json", "report.json", "report.md"} <= names
    assert not any(name.startswith(".") for name in names)  # no .record.json, no .candidates
    assert tmp_leftovers(out.parent) == []
    assert json.loads((out / "manifest.json").read_text()) == json.loads(json.dumps(result.manifest, default=str))


def test_manifest_contents(first_run, tiny_classifier):
    result, _, _ = first_run
    manifest = json.loads((result.out / "manifest.json").read_text())
    assert manifest["schema"] == MANIFEST_SCHEMA
    assert manifest["recipe"] == tiny_recipe(Path(manifest["recipe"]["evaluation"]["data"])).to_dict()
    assert manifest["recipe"]["name"] == "tiny"
    assert set(manifest["versions"]) == set(host.LIBRARIES)
    import onnxruntime
    import torch

    assert manifest["versions"]["torch"] == torch.__version__ or torch.__version__.startswith(manifest["versions"]["torch"])
    assert manifest["versions"]["onnxruntime"] == onnxruntime.__version__
    assert manifest["target"]["name"] == targets.detect().name
    assert manifest["heldout"]["rows"] == ROWS

    sha = manifest["input"]["sha256"]
    assert re.fullmatch(r"[0-9a-f]{64}", sha)
    assert sha == hash_dir(tiny_classifier)
    # independent recomputation: relative name + file digest, sorted by path
    digest = hashlib.sha256()
    for f in sorted(p for p in tiny_classifier.rglob("*") if p.is_file() and not p.name.startswith(".")):
        digest.update(str(f.relative_to(tiny_classifier)).encode())
        digest.update(hashlib.sha256(f.read_bytes()).hexdigest().encode())
    assert sha == digest.hexdigest()
    assert manifest["input"]["model_type"] == "bert"
    assert manifest["input"]["task"] == "text-classification"

    passes = manifest["passes"]
    assert [p["pass"] for p in passes] == ["export", "fuse", "quantize"]
    assert all(p["reused"] is False for p in passes)
    assert all(re.fullmatch(r"[0-9a-f]{24}", p["cache_key"]) for p in passes)
    assert len({p["cache_key"] for p in passes}) == 3
    assert passes[0]["record"]["parity"]["max_abs_diff"] <= 1e-3
    assert passes[1]["record"]["fused_possible"]["Attention"] == LAYERS
    assert passes[2]["record"]["coverage"]["int8"] == passes[2]["record"]["coverage"]["weighted_gemms"] == 4 * LAYERS + 2
    assert passes[1]["options"]["select"] == "all"
    assert passes[1]["record"]["kept"] == "all"


def test_report_json(first_run):
    result, _, _ = first_run
    report = json.loads((result.out / "report.json").read_text())
    assert report == json.loads(json.dumps(result.report))
    assert report["schema"] == REPORT_SCHEMA
    assert report["headline_metric"] == "accuracy"
    assert report["target"] == targets.detect().name
    assert report["settings"]["rounds"] == ROUNDS and report["settings"]["warmup"] == 1
    assert report["settings"]["heldout"]["rows"] == ROWS
    stages = report["stages"]
    assert [s["name"] for s in stages] == ["pytorch", "export", "fuse", "quantize"]
    assert [s["kind"] for s in stages] == ["pytorch", "onnx", "onnx", "onnx"]
    for stage in stages:
        metrics = stage["metrics"]
        assert set(metrics) == {"accuracy", "macro_f1", "agreement_with_baseline"}
        assert metrics["accuracy"]["n"] == ROWS
        lo, hi = metrics["accuracy"]["ci95"]
        assert lo <= metrics["accuracy"]["value"] <= hi
        assert stage["latency"]["n"] == ROUNDS
        assert stage["latency"]["median_ms"] > 0
        assert stage["size_bytes"] > 0
    assert stages[0]["speedup"] == pytest.approx(1.0)
    assert stages[0]["delta_to_baseline"]["accuracy"] == 0
    # the exported graph computes the same logits: it agrees with PyTorch on every row
    assert stages[1]["metrics"]["agreement_with_baseline"]["value"] == 1.0
    assert stages[1]["metrics"]["accuracy"]["value"] == stages[0]["metrics"]["accuracy"]["value"]
    assert stages[2]["graph"]["fused_ops"]["Attention"] == LAYERS
    assert stages[3]["graph"]["int8_gemms"] == stages[3]["graph"]["weighted_gemms"] == 4 * LAYERS + 2
    assert stages[3]["graph"]["float_gemms"] == []
    # INT8 weights are smaller than float ones
    assert stages[3]["size_bytes"] < stages[2]["size_bytes"]


def _sane_memory(block: dict) -> None:
    assert 0 < block["start_rss_mb"] <= block["peak_rss_mb"] < 64 * 1024  # MB, not bytes or kB
    assert 0 < block["end_rss_mb"] <= block["peak_rss_mb"]
    assert block["peak_delta_mb"] == pytest.approx(block["peak_rss_mb"] - block["start_rss_mb"], abs=0.11)
    assert block["child_processes"] >= 0 and block["children_peak_rss_mb"] >= 0
    assert block["method"]


def test_peak_memory_per_pass_and_stage(first_run):
    result, _, _ = first_run
    manifest = json.loads((result.out / "manifest.json").read_text())
    report = json.loads((result.out / "report.json").read_text())
    for entry in manifest["passes"]:
        _sane_memory(entry["memory"])
    summary = report["memory"]
    assert manifest["memory"] == summary
    assert summary["passes"] == {p["pass"]: p["memory"]["peak_rss_mb"] for p in manifest["passes"]}
    _sane_memory(summary["evaluation"])
    blocks = {**summary["passes"], "evaluation": summary["evaluation"]["peak_rss_mb"]}
    assert summary["peak_in"] == max(blocks, key=blocks.get)
    # the process peak is the run's: at least every block's peak (they are all in this process)
    assert summary["peak_rss_mb"] >= max(blocks.values())
    for stage in report["stages"]:
        memory = stage["memory"]
        assert set(memory) == ({"load", "evaluate"} if stage["name"] == "pytorch" else {"pass", "load", "evaluate"})
        for block in memory.values():
            _sane_memory(block)
        # evaluation holds every stage at once, so each stage's scoring peak is inside the evaluation's
        assert memory["evaluate"]["peak_rss_mb"] <= summary["evaluation"]["peak_rss_mb"]
    md = (result.out / "report.md").read_text()
    assert f"{summary['peak_rss_mb']:,.0f} MB" in md


def test_report_md(first_run):
    result, _, _ = first_run
    text = (result.out / "report.md").read_text()
    assert text.startswith("### xformopt: ")
    assert "| Stage | Size (MB) | Accuracy |" in text
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| Stage"))
    rows = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start + 2:]))  # the headline table
    assert [r.split("|")[1].strip() for r in rows] == ["pytorch", "export", "fuse", "quantize"]
    assert f"{ROUNDS} interleaved rounds" in text


def test_log_says_what_ran(first_run):
    _, messages, _ = first_run
    assert "[1/3] export: running" in messages
    assert "[3/3] quantize: running" in messages
    assert not any("reused from cache" in m for m in messages)
    assert any(m.startswith(f"evaluating quantize on {ROWS} held-out rows") for m in messages)


def test_artifact_loads_in_plain_onnxruntime(first_run, tiny_classifier, sample_texts):
    import onnxruntime as ort
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = first_run[0].out
    tokenizer = AutoTokenizer.from_pretrained(out)
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    assert {i.name for i in session.get_inputs()} == {"input_ids", "attention_mask", "token_type_ids"}
    assert {n.op_type for n in __import__("onnx").load(str(out / "model.onnx")).graph.node} >= {"QAttention", "MatMulInteger"}
    texts = sample_texts[:8]
    encoded = tokenizer(texts, padding=True, return_tensors="np")
    logits = session.run(None, {k: v.astype(np.int64) for k, v in encoded.items()})[0]
    assert logits.shape == (8, 2)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_classifier).eval()
    with torch.inference_mode():
        reference = model(**{k: torch.from_numpy(v) for k, v in encoded.items()}).logits.numpy()
    cos = (logits * reference).sum() / (np.linalg.norm(logits) * np.linalg.norm(reference))
    assert cos > 0.99


def test_artifact_loads_in_a_transformers_pipeline(first_run, sample_texts):
    import onnxruntime as ort
    from transformers import AutoTokenizer

    from xformopt.clients.transformers_pipeline import OnnxPipelineModel

    out = first_run[0].out
    model = OnnxPipelineModel(out)
    assert model.config.id2label == {0: "negative", 1: "positive"}
    tokenizer = AutoTokenizer.from_pretrained(out)
    encoded = tokenizer(sample_texts[:4], padding=True, return_tensors="np")
    got = model(**encoded).logits
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    want = session.run(None, {k: v.astype(np.int64) for k, v in encoded.items()})[0]
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)
    # and in a transformers pipeline, which is how most applications call a classifier
    from transformers import pipeline as hf_pipeline

    classify = hf_pipeline("text-classification", model=model, tokenizer=tokenizer)
    labels = [r["label"] for r in classify(sample_texts[:4])]
    assert labels == [model.config.id2label[i] for i in np.asarray(want).argmax(-1)]


def test_second_identical_run_reuses_every_pass(first_run, tiny_classifier, heldout_file, tmp_path, monkeypatch):
    _, _, cache_dir = first_run
    monkeypatch.setenv("XFORMOPT_CACHE_DIR", str(cache_dir))
    messages: list[str] = []
    with forwarded_to(messages.append):
        result = pipeline.run(str(tiny_classifier), tiny_recipe(heldout_file), tmp_path / "again")
    passes = result.manifest["passes"]
    assert [p["reused"] for p in passes] == [True, True, True]
    assert [p["cache_key"] for p in passes] == [p["cache_key"] for p in first_run[0].manifest["passes"]]
    for i, name in enumerate(["export", "fuse", "quantize"], start=1):
        assert any(m.startswith(f"[{i}/3] {name}: reused from cache (") for m in messages), name
    assert not any(m.endswith(": running") for m in messages)
    assert (result.out / "model.onnx").read_bytes() == (first_run[0].out / "model.onnx").read_bytes()


def test_model_call_latency_mode(first_run, tiny_classifier, heldout_file, tmp_path, monkeypatch):
    """latency mode ``model``: every stage is also timed on texts tokenized beforehand, interleaved, and the
    report (JSON, markdown) carries it beside the end-to-end timing."""
    _, _, cache_dir = first_run
    monkeypatch.setenv("XFORMOPT_CACHE_DIR", str(cache_dir))
    messages: list[str] = []
    with forwarded_to(messages.append):
        result = pipeline.run(str(tiny_classifier), tiny_recipe(heldout_file, modes=["real", "model"]), tmp_path / "m")
    timed = result.report["model_call"]
    assert list(timed) == ["pytorch", "export", "fuse", "quantize"]
    assert all(t["n"] == ROUNDS and t["median_ms"] > 0 for t in timed.values())
    assert any(m.startswith("timing the model call alone") for m in messages)
    assert json.loads((result.out / "report.json").read_text())["model_call"] == timed
    md = (result.out / "report.md").read_text()
    assert "#### The model call alone" in md and "| Outside the model ms |" in md
    assert "model_call" not in first_run[0].report  # only when asked


def test_changed_option_misses_cache_from_there_on(first_run, tiny_classifier, heldout_file, tmp_path, monkeypatch):
    _, _, cache_dir = first_run
    monkeypatch.setenv("XFORMOPT_CACHE_DIR", str(cache_dir))
    r = tiny_recipe(heldout_file)
    changed = recipe.validate({**r.to_dict(), "passes": ["export", {"fuse": {"select": "all"}},
                                                           {"quantize": {"per_channel": False}}]})
    messages: list[str] = []
    with forwarded_to(messages.append):
        result = pipeline.run(str(tiny_classifier), changed, tmp_path / "changed")
    assert [p["reused"] for p in result.manifest["passes"]] == [True, True, False]
    assert result.manifest["passes"][2]["record"]["formats"]["per_channel"] is False


def test_no_cache_run_stores_nothing(tiny_classifier, heldout_file, tmp_path, isolated_cache, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    r = recipe.validate({**tiny_recipe(heldout_file).to_dict(), "passes": ["export"]})
    result = pipeline.run(str(tiny_classifier), r, tmp_path / "out", use_cache=False)
    assert [s["name"] for s in result.report["stages"]] == ["pytorch", "export"]
    assert (tmp_path / "out" / "model.onnx").is_file()
    assert not (isolated_cache / "passes").exists() or not any((isolated_cache / "passes").iterdir())
    assert list(scratch.iterdir()) == []  # the run's work directory is gone


def test_failed_pass_leaves_nothing(tiny_classifier, heldout_file, tmp_path, isolated_cache, monkeypatch):
    from xformopt.passes.quantize.run import QuantizePass

    def broken(self, ctx, src, dst, options):
        (dst / "model.onnx").write_bytes(b"half written")
        raise PassFailed("quantize exploded on purpose")

    monkeypatch.setattr(QuantizePass, "run", broken)
    out = tmp_path / "out"
    with pytest.raises(PassFailed, match="on purpose"):
        pipeline.run(str(tiny_classifier), tiny_recipe(heldout_file), out)
    assert not out.exists()
    assert tmp_leftovers(tmp_path) == []
    entries = sorted(p.name for p in (isolated_cache / "passes").iterdir())
    assert not any(name.startswith(".") for name in entries)  # no half-built cache entry
    assert len(entries) == 2  # export and fuse finished and are cached; quantize is not


def test_existing_output_is_refused_before_work(tiny_classifier, heldout_file, tmp_path, isolated_cache):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(InputError, match="already exists; pass --force"):
        pipeline.run(str(tiny_classifier), tiny_recipe(heldout_file), out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "mine"
    assert not (isolated_cache / "passes").exists()  # refused before any pass ran


def test_force_replaces_existing_output(first_run, tiny_classifier, heldout_file, tmp_path, monkeypatch):
    monkeypatch.setenv("XFORMOPT_CACHE_DIR", str(first_run[2]))
    out = tmp_path / "out"
    shutil.copytree(first_run[2].parent / "out", out)
    (out / "stale.txt").write_text("old")  # an earlier output, with a file the new run must not keep
    pipeline.run(str(tiny_classifier), tiny_recipe(heldout_file), out, force=True)
    names = {p.name for p in out.iterdir()}
    assert "stale.txt" not in names
    assert {"model.onnx", "manifest.json", "report.json"} <= names
    assert tmp_leftovers(tmp_path) == []


def test_bad_label_column_fails_before_work(tiny_classifier, heldout_file, tmp_path, isolated_cache):
    r = tiny_recipe(heldout_file, label_column="sentiment")
    with pytest.raises(InputError, match="column 'sentiment' not found"):
        pipeline.run(str(tiny_classifier), r, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not (isolated_cache / "passes").exists()


def test_feature_extraction_pipeline(tiny_encoder, heldout_file, tmp_path):
    r = recipe.validate({
        "target": "avx2",
        "passes": ["export", {"fuse": {"select": "all"}}, "quantize"],
        "evaluation": {"data": str(heldout_file), "limit": 8, "latency_rounds": 3, "warmup": 0},
    })
    result = pipeline.run(str(tiny_encoder), r, tmp_path / "out")
    report = result.report
    assert report["headline_metric"] == "cosine_to_baseline"
    assert [s["name"] for s in report["stages"]] == ["pytorch", "export", "fuse", "quantize"]
    cosines = [s["metrics"]["cosine_to_baseline"]["value"] for s in report["stages"]]
    assert cosines[0] == pytest.approx(1.0)
    assert cosines[1] > 0.9999 and cosines[2] > 0.9999
    assert cosines[3] > 0.99
    assert all(s["metrics"]["cosine_to_baseline"]["n"] == 8 for s in report["stages"])
    assert result.manifest["passes"][2]["record"]["formats"]["reduce_range"] is True  # avx2


def test_changed_family_exporter_misses_cache(first_run, tiny_classifier, heldout_file, tmp_path, monkeypatch):
    """A family row whose default exporter changed (a new release, or a recipe leaving ``exporter`` unset)
    re-runs the export instead of reusing the graph the old exporter wrote."""
    import dataclasses

    from xformopt import families
    from xformopt.passes.export.run import EXPORTER_NAMES

    _, _, cache_dir = first_run
    monkeypatch.setenv("XFORMOPT_CACHE_DIR", str(cache_dir))
    model_type = json.loads((tiny_classifier / "config.json").read_text())["model_type"]
    row = families.FAMILIES[model_type]
    other = "torchscript" if row.export_route() == "dynamo" else "dynamo"
    monkeypatch.setitem(families.FAMILIES, model_type, dataclasses.replace(row, exporter=other))
    r = recipe.validate({**tiny_recipe(heldout_file).to_dict(), "passes": ["export"]})
    result = pipeline.run(str(tiny_classifier), r, tmp_path / "other-exporter")
    export = result.manifest["passes"][0]
    assert export["reused"] is False
    assert export["cache_key"] != first_run[0].manifest["passes"][0]["cache_key"]
    assert export["record"]["exporter"] == EXPORTER_NAMES[other]


@pytest.mark.parametrize("evaluation, message", [
    ({"num_beams": 3}, "drop --num-beams"),  # an encoder classifier does not generate text
    ({"modes": ["real", "fixed"], "batch": [1], "seq": [4096]}, "longer than the model's"),  # past its positions
])
def test_evaluation_settings_the_model_cannot_take_are_refused_before_any_work(tiny_classifier, heldout_file,
                                                                               tmp_path, evaluation, message):
    """`prepare` checks the recipe's evaluation settings against the resolved model, with the other input
    checks: nothing is exported and no output folder appears."""
    r = recipe.validate({"name": "tiny", "target": "auto", "passes": ["export"],
                         "evaluation": {"data": str(heldout_file), "limit": 8, **evaluation}})
    with pytest.raises(InputError, match=message):
        pipeline.run(str(tiny_classifier), r, tmp_path / "out")
    assert not (tmp_path / "out").exists()
