"""The three passes on tiny random BERT-family models: export, fuse, quantize, each verifying itself."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import TINY, make_ctx, onnx_op_counts, run_pass
from onnx import numpy_helper

from xformopt.errors import InputError, PassFailed
from xformopt.exporting import compare, parity_texts
from xformopt.onnx_graph import INT8_GEMM_OPS, load_graph, weighted_gemms
from xformopt.passes import all_passes, get_pass
from xformopt.passes.fuse.run import FUSION_ORDER, choose

LAYERS = TINY["layers"]


def weighted_gemm_count(model_path: Path) -> int:
    """Independent count: MatMul/Gemm/Attention nodes whose second input is an initializer."""
    model = onnx.load(str(model_path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    return sum(1 for n in model.graph.node if n.op_type in ("MatMul", "Gemm", "Attention") and n.input[1] in inits)


# --------------------------------------------------------------------------- registry


def test_registry_declares_stages():
    declared = {cls.name: (cls.stage, cls.consumes, cls.produces) for cls in all_passes()}
    assert declared == {
        "prune": ("torch", "hf", "hf"),
        "distill": ("torch", "hf", "hf"),
        "export": ("torch", "hf", "onnx"),
        "fuse": ("onnx", "onnx", "onnx"),
        "quantize": ("onnx", "onnx", "onnx"),
        "int4": ("onnx", "onnx", "onnx"),
    }
    assert {"quantize", "int4"} <= set(get_pass("fuse").must_not_follow)
    assert {"quantize", "int4"} <= set(get_pass("quantize").must_not_follow) == set(get_pass("int4").must_not_follow)


# --------------------------------------------------------------------------- export


def test_export_writes_model_with_dynamic_axes(exported_classifier):
    stage, record = exported_classifier
    assert (stage / "model.onnx").is_file()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        assert (stage / name).is_file(), name
    graph = onnx.load(str(stage / "model.onnx")).graph
    assert [i.name for i in graph.input] == ["input_ids", "attention_mask", "token_type_ids"]
    for graph_input in graph.input:
        dims = graph_input.type.tensor_type.shape.dim
        assert len(dims) == 2
        batch, sequence = dims[0].dim_param, dims[1].dim_param
        assert batch and sequence and batch != sequence, (graph_input.name, batch, sequence)
        assert not dims[0].dim_value and not dims[1].dim_value
    assert record["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert record["outputs"] == ["logits"]
    assert record["opset"] == 18
    assert all(axes == ["batch_size", "sequence_length"] for axes in record["dynamic_axes"].values())
    opsets = {o.domain: o.version for o in onnx.load(str(stage / "model.onnx")).opset_import}
    assert opsets[""] == 18


def test_export_parity_within_thresholds_at_three_lengths(exported_classifier):
    parity = exported_classifier[1]["parity"]
    assert parity["max_abs_diff"] <= 1e-3
    assert parity["min_cosine"] >= 0.9999
    assert len(set(parity["sequence_lengths"])) >= 3
    assert parity["batch_sizes"][-1] == 2  # a padded batch of two is checked too
    assert len(parity["sequence_lengths"]) == len(parity["batch_sizes"])


def test_exported_graph_runs_at_other_batch_and_length(exported_classifier, tiny_classifier, sample_texts):
    """Dynamic axes are real: batch 3 at a length not used in the parity check matches PyTorch."""
    import onnxruntime as ort
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    stage = exported_classifier[0]
    tokenizer = AutoTokenizer.from_pretrained(stage)
    encoded = tokenizer(sample_texts[5:8], padding=True, return_tensors="np")
    session = ort.InferenceSession(str(stage / "model.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {k: v.astype(np.int64) for k, v in encoded.items()})[0]
    model = AutoModelForSequenceClassification.from_pretrained(tiny_classifier).eval()
    with torch.inference_mode():
        want = model(**{k: torch.from_numpy(v) for k, v in encoded.items()}).logits.numpy()
    assert got.shape == (3, 2)
    np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("fixture", ["tiny_encoder", "tiny_distilbert"])
def test_export_other_families(fixture, request, tmp_path, sample_texts):
    model_dir = request.getfixturevalue(fixture)
    ctx = make_ctx(model_dir, sample_texts)
    record = run_pass("export", ctx, model_dir, tmp_path / "e")
    expected_output = "last_hidden_state" if fixture == "tiny_encoder" else "logits"
    assert record["outputs"] == [expected_output]
    assert record["parity"]["max_abs_diff"] <= 1e-3
    assert len(set(record["parity"]["sequence_lengths"])) >= 3
    if fixture == "tiny_distilbert":  # DistilBERT has no segment embeddings
        assert record["inputs"] == ["input_ids", "attention_mask"]
    assert ctx.messages[0].startswith("exporting ")


def test_export_parity_failure_raises(tiny_encoder, tmp_path, sample_texts):
    ctx = make_ctx(tiny_encoder, sample_texts)
    with pytest.raises(PassFailed) as info:
        run_pass("export", ctx, tiny_encoder, tmp_path / "e", max_abs_diff=1e-12)
    message = info.value.message
    assert message.startswith("export parity failed")
    assert "limit 1e-12" in message
    assert info.value.exit_code == 3


def test_parity_texts_needs_three_lengths(tiny_classifier):
    from xformopt.models import load_tokenizer

    tokenizer = load_tokenizer(tiny_classifier)
    with pytest.raises(InputError, match="at least 3 different token lengths"):
        parity_texts(["good", "bad", "a good film"], tokenizer)
    texts = ["good", "a good film", "a good film , really", "a good film , really , truly and deeply"]
    picked = parity_texts(texts, tokenizer, count=4)
    lengths = [len(tokenizer(t)["input_ids"]) for t in picked]
    assert lengths == sorted(set(lengths)) and len(lengths) == 4


def test_timing_and_parity_feed_text_pairs_as_pairs(exported_classifier, tiny_classifier, monkeypatch):
    """Identical first texts, varied second texts (an NLI-style pair set): the candidates are timed on
    the encoded pairs, and parity spreads over the pair lengths, never refusing the set."""
    import xformopt.passes.timing as timing
    from xformopt.data import TextDataset
    from xformopt.models import load_tokenizer
    from xformopt.passes.export.run import ExportOptions, check_parity

    seconds = ["good", "a good film", "a good film , really", "a good film , really , truly and deeply"] * 3
    data = TextDataset(texts=["the film"] * len(seconds), text_pairs=seconds, labels=None, label_names=None,
                       source="pairs", row_ids=list(range(len(seconds))))
    ctx = make_ctx(tiny_classifier, data.texts)
    ctx.sample = data
    fed = []

    def once(calls, n, **_):  # each call once: what each timed request carries, not how long it takes
        for i in range(n):
            for call in calls.values():
                call(i)
        return {name: type("S", (), {"to_dict": lambda self: {"median_ms": 1.0}})() for name in calls}

    monkeypatch.setattr(timing, "run_interleaved", once)
    from xformopt.runtime import encoder

    original = encoder.OrtPredictor.run_encoded
    monkeypatch.setattr(encoder.OrtPredictor, "run_encoded",
                        lambda self, enc: fed.append(enc["input_ids"].shape[-1]) or original(self, enc))
    timing.time_stage_dirs(ctx, {"a": exported_classifier[0]}, rounds=1)
    tokenizer = load_tokenizer(tiny_classifier)
    assert fed == [len(tokenizer("the film", s)["input_ids"]) for s in seconds]
    parity = check_parity(ctx, tiny_classifier, exported_classifier[0], ExportOptions())
    assert [c for _, c in parity["pair_lengths"]] == [len(tokenizer(s, add_special_tokens=False)["input_ids"])
                                                      for s in seconds[:4]]


def test_compare_ignores_padding_positions():
    ref = np.ones((1, 4, 3), dtype=np.float32)
    cand = ref.copy()
    cand[0, 3] = 100.0  # a padded position: must not count
    mask = np.array([[1, 1, 1, 0]])
    assert compare(ref, cand, mask)["max_abs_diff"] == 0.0
    assert compare(ref, cand, None)["max_abs_diff"] == pytest.approx(99.0)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_default_torch_onnx_export_does_not_fuse_but_ours_does(tmp_path, tiny_classifier, exported_classifier,
                                                            fused_classifier):
    """PROOF of the claim in passes/export/dynamo.py.

    ``torch.onnx.export`` with today's defaults (dynamo=True, over transformers' default SDPA
    attention) gives a graph in which ORT's BERT optimizer alone fuses no Attention node; our export
    writes the same kind of graph, and our fuse pass (onnxscript's ORT rewriter, then ORT's optimizer)
    fuses one Attention per layer.
    """
    import torch
    from onnxruntime.transformers.optimizer import optimize_model
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    assert inspect.signature(torch.onnx.export).parameters["dynamo"].default is True
    model = AutoModelForSequenceClassification.from_pretrained(tiny_classifier).eval()
    assert model.config._attn_implementation == "sdpa"
    tokenizer = AutoTokenizer.from_pretrained(tiny_classifier)
    enc = tokenizer(["a good film", "a very bad film indeed"], padding=True, return_tensors="pt")
    path = tmp_path / "dynamo.onnx"
    torch.onnx.export(
        model,
        (enc["input_ids"], enc["attention_mask"]),
        str(path),
        input_names=["input_ids", "attention_mask"],
        output_names=["logits"],
        dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
        opset_version=17,
    )

    def fused_attention(model_path: Path) -> int:
        optimized = optimize_model(
            str(model_path), model_type="bert", num_heads=TINY["heads"], hidden_size=TINY["hidden"], opt_level=0
        )
        return sum(1 for n in optimized.model.graph.node if n.op_type == "Attention")

    assert fused_attention(path) == 0
    assert fused_attention(exported_classifier[0] / "model.onnx") == 0
    assert onnx_op_counts(fused_classifier[0] / "model.onnx")["Attention"] == LAYERS


# --------------------------------------------------------------------------- fuse


def test_fuse_all_reaches_full_fusion(fused_classifier):
    stage, record = fused_classifier
    assert record["fused_possible"]["Attention"] == LAYERS
    assert record["fused_possible"]["SkipLayerNormalization"] == 2 * LAYERS
    assert record["fused_before"]["Attention"] == 0
    assert record["expected"] == {"Attention": LAYERS, "SkipLayerNormalization": 2 * LAYERS}
    assert record["kept"] == "all"
    assert record["reason"] == "select=all"
    assert record["fused_kept"] == record["fused_possible"]
    assert record["timings_ms"] == {}
    counts = onnx_op_counts(stage / "model.onnx")
    assert counts["Attention"] == LAYERS
    assert counts["SkipLayerNormalization"] == 2 * LAYERS
    assert not (stage / ".candidates").exists()
    assert (stage / "tokenizer.json").is_file() and (stage / "config.json").is_file()
    # ORT fuses some of the unfused graph itself at load time: recorded, never Attention here
    assert record["ort_fuses_unfused_at_load"].get("Attention", 0) == 0


def test_fuse_with_the_weights_on_disk_writes_the_same_graph(exported_classifier, tiny_classifier, tmp_path, sample_texts):
    """ORT's Attention fusion reads the Q/K/V weights to pack them: from the scratch file when they are on
    disk (issue 21: memory). Every weight on disk must give the bytes an all-in-memory fusion writes."""
    from xformopt.passes.fuse.run import build_fused

    stage, _ = exported_classifier
    ctx = make_ctx(tiny_classifier, sample_texts)
    cwd = Path.cwd()
    written = []
    for threshold in (0, 2**62):
        out = tmp_path / str(threshold)
        out.mkdir()
        counts = build_fused(stage / "model.onnx", out / "model.onnx", ctx, (), weights_threshold=threshold)
        assert counts["Attention"] == LAYERS
        assert sorted(p.name for p in out.iterdir()) == ["model.onnx"]
        written.append((out / "model.onnx").read_bytes())
    assert written[0] == written[1]
    assert Path.cwd() == cwd  # the working directory the fusion ran in is given back


def test_fusion_finds_its_weights_without_changing_directory(exported_classifier, tiny_classifier, tmp_path,
                                                               sample_texts, monkeypatch):
    """The weights left on disk are found per thread, not by chdir (process-wide: unsafe for serve or a
    notebook): two fusions at once, every weight on disk, never a chdir, each packs every layer's
    Q/K/V into Attention and writes the same bytes."""
    import os
    import threading

    from xformopt.passes.fuse.run import build_fused

    def refuse(path):
        raise AssertionError(f"os.chdir({path!r}) while fusing")

    monkeypatch.setattr(os, "chdir", refuse)
    stage, _ = exported_classifier
    ctx = make_ctx(tiny_classifier, sample_texts)
    results, errors = {}, []

    def fuse(name: str) -> None:
        try:
            out = tmp_path / name
            out.mkdir()
            counts = build_fused(stage / "model.onnx", out / "model.onnx", ctx, (), weights_threshold=0)
            results[name] = (counts, (out / "model.onnx").read_bytes())
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=fuse, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert results["a"][0]["Attention"] == results["b"][0]["Attention"] == LAYERS
    assert results["a"][1] == results["b"][1]


def test_fused_graph_matches_unfused(fused_classifier, exported_classifier, tiny_classifier, sample_texts):
    from xformopt.runtime.encoder import OrtPredictor
    from xformopt.sources import resolve

    spec = resolve(str(tiny_classifier))
    texts = sample_texts[:8]
    fused = OrtPredictor(spec, fused_classifier[0], threads=1).predict(texts)
    unfused = OrtPredictor(spec, exported_classifier[0], threads=1).predict(texts)
    np.testing.assert_allclose(fused, unfused, atol=1e-4)


def test_fuse_expect_unreachable_fails_naming_op(exported_classifier, tiny_classifier, tmp_path, sample_texts):
    ctx = make_ctx(tiny_classifier, sample_texts)
    with pytest.raises(PassFailed) as info:
        run_pass("fuse", ctx, exported_classifier[0], tmp_path / "f", select="all", expect={"Attention": 99})
    assert "fusion fell short" in info.value.message
    assert f"Attention {LAYERS}/99" in info.value.message


def test_fuse_expect_reachable_passes(exported_classifier, tiny_classifier, tmp_path, sample_texts):
    ctx = make_ctx(tiny_classifier, sample_texts)
    record = run_pass("fuse", ctx, exported_classifier[0], tmp_path / "f", select="all",
                      expect={"Attention": LAYERS, "EmbedLayerNormalization": 1})
    assert record["expected"]["EmbedLayerNormalization"] == 1
    assert record["fused_possible"]["EmbedLayerNormalization"] == 1


def test_fuse_select_none_keeps_unfused_graph(exported_classifier, tiny_classifier, tmp_path, sample_texts):
    ctx = make_ctx(tiny_classifier, sample_texts)
    record = run_pass("fuse", ctx, exported_classifier[0], tmp_path / "f", select="none")
    assert record["kept"] == "none"
    assert record["fused_possible"]["Attention"] == LAYERS  # still built: it proves fusability
    assert record["fused_kept"]["Attention"] == 0
    assert onnx_op_counts(tmp_path / "f" / "model.onnx")["Attention"] == 0


@pytest.mark.host_sensitive
def test_fuse_fastest_times_candidates_on_host(exported_classifier, tiny_classifier, tmp_path, sample_texts):
    from xformopt.measure.host import cpu_flags

    flags = cpu_flags()
    ctx = make_ctx(tiny_classifier, sample_texts, target="avx2", host_flags=flags | {"avx2"})
    assert ctx.host_runs_target
    record = run_pass("fuse", ctx, exported_classifier[0], tmp_path / "f", select="fastest", timing_rounds=3)
    assert set(record["timings_ms"]) == set(FUSION_ORDER)  # the tiny BERT's norms split: both split candidates
    assert record["split_norms"] == {"all_split_norms": 2 * LAYERS, "no_attention_split_norms": 2 * LAYERS}
    assert all(t["n"] == 3 and t["median_ms"] > 0 for t in record["timings_ms"].values())
    assert record["kept"] in FUSION_ORDER
    # what was kept is on disk
    assert onnx_op_counts(tmp_path / "f" / "model.onnx")["Attention"] == record["fused_kept"]["Attention"]
    want, _ = choose(record["timings_ms"], 0.05)
    assert record["kept"] == want
    assert any(m.startswith("timing all, all_split_norms, no_attention, no_attention_split_norms, none")
               for m in ctx.messages)


@pytest.mark.host_sensitive
def test_fuse_fastest_on_foreign_host_keeps_full_fusion(exported_classifier, tiny_classifier, tmp_path, sample_texts):
    ctx = make_ctx(tiny_classifier, sample_texts, target="arm64", host_flags={"avx2"})
    record = run_pass("fuse", ctx, exported_classifier[0], tmp_path / "f", select="fastest")
    assert record["kept"] == "all"
    assert "host lacks target arm64" in record["reason"]
    assert record["timings_ms"] == {}


def test_fuse_distilbert_fully(tiny_distilbert, tmp_path, sample_texts):
    ctx = make_ctx(tiny_distilbert, sample_texts)
    run_pass("export", ctx, tiny_distilbert, tmp_path / "e")
    record = run_pass("fuse", ctx, tmp_path / "e", tmp_path / "f", select="all")
    assert record["fused_possible"]["Attention"] == LAYERS
    assert record["fused_possible"]["SkipLayerNormalization"] == 2 * LAYERS


def _t(median: float) -> dict:
    return {"median_ms": median, "p90_ms": median * 1.1, "n": 10}


def test_choose_fastest_when_clearly_faster():
    chosen, reason = choose({"all": _t(2.0), "no_attention": _t(1.5), "none": _t(1.0)}, 0.05)
    assert chosen == "none"
    assert reason.startswith("fastest median")


def test_choose_prefers_more_fused_within_tolerance():
    chosen, reason = choose({"all": _t(1.04), "no_attention": _t(1.02), "none": _t(1.0)}, 0.05)
    assert chosen == "all"
    assert reason.startswith("within 5% of the fastest")


def test_choose_tolerance_boundary():
    timings = {"all": _t(1.10), "no_attention": _t(1.04), "none": _t(1.0)}
    assert choose(timings, 0.05)[0] == "no_attention"
    assert choose(timings, 0.10)[0] == "all"  # exactly at the limit counts as within
    assert choose(timings, 0.0)[0] == "none"


def test_choose_fused_fastest_and_subset():
    chosen, reason = choose({"all": _t(1.0), "none": _t(3.0)}, 0.05)
    assert chosen == "all" and reason.startswith("fastest median")
    assert "all 1.00 ms, none 3.00 ms" in reason
    assert choose({"no_attention": _t(2.0), "none": _t(2.05)}, 0.05)[0] == "no_attention"


def test_preferred_within_tolerance_is_the_rule_fuse_and_quantize_share():
    from xformopt.passes.timing import preferred_within_tolerance

    medians = {0: 1.06, 2: 1.04, 4: 1.0}  # quantize: float-node counts, fewest preferred
    assert preferred_within_tolerance(medians, sorted(medians), 0.05) == 2
    assert preferred_within_tolerance(medians, sorted(medians), 0.10) == 0
    assert preferred_within_tolerance(medians, sorted(medians), 0.0) == 4
    assert preferred_within_tolerance({"none": 1.0}, ("all", "no_attention", "none"), 0.05) == "none"  # absent names skipped


def test_quantize_summary_says_when_the_budget_was_not_met():
    from xformopt.cli.passes import summary

    def entry(met: bool, drop: float) -> dict:
        budget = {"budget_met": met, "metric": "accuracy", "float_metric": 87.0, "metric_after": 87.0 - drop, "drop": drop,
                  "allowed_drop_points": 0.5, "kept_float": [], "search": [{}, {}]}
        record = {"coverage": {"int8": 12, "weighted_gemms": 12, "int8_ops": {"MatMulInteger": 12}, "kept_float": []},
                  "agreement": {"measure": "cosine", "mean_agreement": 0.99}, "budget": budget}
        return {"pass": "quantize", "record": record}

    met = summary(entry(True, 0.25))
    assert "budget met: accuracy 87.00 -> 86.75 (drop 0.25 <= 0.50)" in met and "NOT met" not in met
    missed = summary(entry(False, 1.5))
    assert "budget NOT met: accuracy 87.00 -> 85.50 (drop 1.50 > 0.50)" in missed and "<=" not in missed


# --------------------------------------------------------------------------- quantize


def test_quantize_fused_graph_covers_every_weighted_gemm(fused_classifier, tiny_classifier, tmp_path, sample_texts):
    ctx = make_ctx(tiny_classifier, sample_texts, target="avx512_vnni")
    record = run_pass("quantize", ctx, fused_classifier[0], tmp_path / "q")
    expected = weighted_gemm_count(fused_classifier[0] / "model.onnx")
    # fused: per layer one Attention + 3 MatMul, then pooler and classifier Gemm
    assert expected == 4 * LAYERS + 2
    coverage = record["coverage"]
    assert coverage["weighted_gemms"] == expected
    assert coverage["int8"] == expected
    assert coverage["kept_float"] == []
    assert coverage["int8_ops"] == {"MatMulInteger": 3 * LAYERS + 2, "QAttention": LAYERS}
    counts = onnx_op_counts(tmp_path / "q" / "model.onnx")
    assert counts["QAttention"] == LAYERS
    assert counts["MatMulInteger"] == 3 * LAYERS + 2
    assert counts["Attention"] == 0 and counts["MatMul"] == 0 and counts["Gemm"] == 0
    assert record["agreement"]["mean_agreement"] >= 0.9
    assert record["agreement"]["texts"] == 32
    for name in ("config.json", "tokenizer.json", "vocab.txt"):
        assert (tmp_path / "q" / name).is_file()


def test_quantize_unfused_graph_counts_activation_matmuls(exported_classifier, tiny_classifier, tmp_path, sample_texts):
    ctx = make_ctx(tiny_classifier, sample_texts)
    record = run_pass("quantize", ctx, exported_classifier[0], tmp_path / "q")
    coverage = record["coverage"]
    assert coverage["weighted_gemms"] == weighted_gemm_count(exported_classifier[0] / "model.onnx") == 6 * LAYERS + 2
    assert coverage["int8"] == 6 * LAYERS + 2
    assert coverage["activation_matmuls_float"] == 2 * LAYERS  # Q.K^T and probs.V have no weight
    assert set(coverage["int8_ops"]) <= set(INT8_GEMM_OPS)
    assert onnx_op_counts(tmp_path / "q" / "model.onnx")["MatMulInteger"] == 6 * LAYERS + 2


def test_quantize_exclude_nodes_kept_float(fused_classifier, tiny_classifier, tmp_path, sample_texts):
    ctx = make_ctx(tiny_classifier, sample_texts)
    names = [g["name"] for g in weighted_gemms(load_graph(fused_classifier[0] / "model.onnx")) if g["has_weight"]]
    excluded = next(n for n in names if n.endswith("intermediate/dense/MatMul"))
    record = run_pass("quantize", ctx, fused_classifier[0], tmp_path / "q", exclude_nodes=[excluded])
    coverage = record["coverage"]
    assert coverage["kept_float"] == [{"name": excluded, "op": "MatMul"}]
    assert coverage["int8"] == coverage["weighted_gemms"] - 1
    graph = load_graph(tmp_path / "q" / "model.onnx")
    assert excluded in {n.name for n in graph.graph.node if n.op_type == "MatMul"}


def test_quantize_nothing_quantizable_fails(fused_encoder, tiny_encoder, tmp_path, sample_texts):
    ctx = make_ctx(tiny_encoder, sample_texts)
    with pytest.raises(PassFailed) as info:
        run_pass("quantize", ctx, fused_encoder, tmp_path / "q", op_types=["Conv"])
    message = info.value.message
    assert message.startswith("quantize changed nothing")
    assert f"none of {4 * LAYERS} weighted" in message
    assert "Conv" in message
    assert info.value.exit_code == 3


def test_quantize_feature_extraction_coverage(fused_encoder, tiny_encoder, tmp_path, sample_texts):
    ctx = make_ctx(tiny_encoder, sample_texts)
    record = run_pass("quantize", ctx, fused_encoder, tmp_path / "q")
    assert record["coverage"]["weighted_gemms"] == weighted_gemm_count(fused_encoder / "model.onnx") == 4 * LAYERS
    assert record["coverage"]["int8_ops"] == {"MatMulInteger": 3 * LAYERS, "QAttention": LAYERS}
    assert record["agreement"]["mean_agreement"] >= 0.99


def test_quantize_nothing_quantizable_fails_with_gemm_head(fused_classifier, tiny_classifier, tmp_path, sample_texts):
    ctx = make_ctx(tiny_classifier, sample_texts)
    with pytest.raises(PassFailed) as info:
        run_pass("quantize", ctx, fused_classifier[0], tmp_path / "q", op_types=["Conv"])
    assert info.value.message.startswith("quantize changed nothing")


def test_quantize_exclude_gemm_node_kept_float(fused_classifier, tiny_classifier, tmp_path, sample_texts):
    ctx = make_ctx(tiny_classifier, sample_texts)
    record = run_pass("quantize", ctx, fused_classifier[0], tmp_path / "q", exclude_nodes=["/classifier/Gemm"])
    counts = onnx_op_counts(tmp_path / "q" / "model.onnx")
    # the head stays float: one MatMul or Gemm in the saved graph, and the record says so
    assert counts["MatMul"] + counts["Gemm"] == 1
    assert [g["name"] for g in record["coverage"]["kept_float"]] == ["/classifier/Gemm"]


def test_quantize_agreement_floor(fused_classifier, tiny_classifier, tmp_path, sample_texts, monkeypatch):
    import xformopt.passes.stage_runs as stage_runs

    monkeypatch.setattr(stage_runs, "output_agreement",
                        lambda ctx, a, b: {"measure": "cosine", "mean_agreement": 0.5, "min_agreement": 0.1, "texts": 32})
    ctx = make_ctx(tiny_classifier, sample_texts)
    record = run_pass("quantize", ctx, fused_classifier[0], tmp_path / "q")  # a failing verdict, not a failed pass
    assert record["verdict"]["passed"] is False and record["verdict"]["accept"] == {"min_agreement": 0.5}
    assert (tmp_path / "q" / "model.onnx").is_file()
    assert re.search(r"mean cosine 0\.500 < 0\.9", get_pass("quantize").budget_failure(record, tmp_path / "q"))


def _int8_weights(model_path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(model_path))
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer
            if i.data_type == onnx.TensorProto.INT8 and i.name.endswith("_quantized")}


def _zero_points(model_path: Path) -> list[np.ndarray]:
    model = onnx.load(str(model_path))
    return [numpy_helper.to_array(i) for i in model.graph.initializer if i.name.endswith("_zero_point")
            and i.data_type == onnx.TensorProto.INT8]


@pytest.mark.parametrize(
    ("target", "reduce_range", "per_channel"),
    [("avx2", True, True), ("avx512", True, True), ("avx512_vnni", False, True), ("arm64", False, True)],
)
def test_target_formats_reach_the_quantizer(
    target, reduce_range, per_channel, fused_classifier, tiny_classifier, tmp_path, sample_texts, monkeypatch
):
    import onnxruntime.quantization as ortq

    calls = []
    real = ortq.quantize_dynamic

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(ortq, "quantize_dynamic", spy)
    ctx = make_ctx(tiny_classifier, sample_texts, target=target)
    record = run_pass("quantize", ctx, fused_classifier[0], tmp_path / "q")
    assert record["formats"]["reduce_range"] is reduce_range
    assert record["formats"]["per_channel"] is per_channel
    assert record["formats"]["weight_type"] == "int8"
    (kwargs,) = calls
    assert kwargs["reduce_range"] is reduce_range
    assert kwargs["per_channel"] is per_channel
    assert kwargs["weight_type"] == ortq.QuantType.QInt8
    assert kwargs["op_types_to_quantize"] == ["MatMul", "Attention", "Gemm"]
    # and they are visible in the saved graph: 7-bit weights, per-channel zero points
    weights = _int8_weights(tmp_path / "q" / "model.onnx")
    assert weights
    peak = max(int(np.abs(w.astype(np.int32)).max()) for w in weights.values())
    assert (peak <= 64) if reduce_range else (peak == 127)
    zero_points = _zero_points(tmp_path / "q" / "model.onnx")
    assert zero_points
    assert all((zp.ndim == 1) is per_channel for zp in zero_points)


def test_quantize_options_override_target(fused_classifier, tiny_classifier, tmp_path, sample_texts):
    ctx = make_ctx(tiny_classifier, sample_texts, target="avx512_vnni")
    record = run_pass("quantize", ctx, fused_classifier[0], tmp_path / "q", reduce_range=True, per_channel=False)
    assert record["formats"]["reduce_range"] is True
    assert record["formats"]["per_channel"] is False
    peak = max(int(np.abs(w.astype(np.int32)).max()) for w in _int8_weights(tmp_path / "q" / "model.onnx").values())
    assert peak <= 64
