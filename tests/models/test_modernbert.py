"""The modernbert family on tiny ModernBERT models (global and sliding-window layers): exported by the
dynamo exporter (the family's), fused by onnxscript's rewriter in ``fuse`` (counted per layer),
quantized, parity to the unfused graph at several lengths and a padded batch, and a whole optimize run."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import LABELS, TINY, _vocab_size, make_ctx, onnx_op_counts, run_pass

from xformopt import pipeline, recipe
from xformopt.errors import PassFailed
from xformopt.families import FAMILIES

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
LAYERS = TINY["layers"]
WINDOW = 8  # local_attention: layer 1 sees 4 tokens each side, so texts longer than that test the window


def _modernbert_config(tokenizer_dir: Path, **extra):
    from transformers import ModernBertConfig

    return ModernBertConfig(
        vocab_size=_vocab_size(tokenizer_dir), hidden_size=TINY["hidden"], num_hidden_layers=LAYERS,
        num_attention_heads=TINY["heads"], intermediate_size=TINY["intermediate"], max_position_embeddings=128,
        global_attn_every_n_layers=2,  # layer 0 global, layer 1 local (sliding window)
        local_attention=WINDOW, pad_token_id=0, cls_token_id=2, sep_token_id=3, bos_token_id=2, eos_token_id=3,
        **extra,
    )


def _save(model, tokenizer_dir: Path, directory: Path) -> Path:
    model.save_pretrained(directory)
    for item in tokenizer_dir.iterdir():
        shutil.copy2(item, directory / item.name)
    return directory


@pytest.fixture(scope="module")
def tiny_modernbert(tmp_path_factory, tokenizer_dir) -> Path:
    import torch
    from transformers import ModernBertForSequenceClassification

    torch.manual_seed(3)
    config = _modernbert_config(tokenizer_dir, num_labels=2, id2label=LABELS,
                                label2id={v: k for k, v in LABELS.items()})
    model = ModernBertForSequenceClassification(config).eval()
    return _save(model, tokenizer_dir, tmp_path_factory.mktemp("tiny-modernbert-cls"))


@pytest.fixture(scope="module")
def tiny_modernbert_encoder(tmp_path_factory, tokenizer_dir) -> Path:
    import torch
    from transformers import ModernBertModel

    torch.manual_seed(4)
    model = ModernBertModel(_modernbert_config(tokenizer_dir)).eval()
    return _save(model, tokenizer_dir, tmp_path_factory.mktemp("tiny-modernbert-enc"))


def export_and_fuse(root: Path, model_dir: Path, texts) -> tuple[Path, dict, Path, dict]:
    ctx = make_ctx(model_dir, texts)
    exported = run_pass("export", ctx, model_dir, root / "exported")
    fused = run_pass("fuse", ctx, root / "exported", root / "fused", select="all")
    return root / "exported", exported, root / "fused", fused


@pytest.fixture(scope="module")
def classifier_stages(tmp_path_factory, tiny_modernbert, sample_texts):
    return export_and_fuse(tmp_path_factory.mktemp("mb-cls"), tiny_modernbert, sample_texts)


@pytest.fixture(scope="module")
def encoder_stages(tmp_path_factory, tiny_modernbert_encoder, sample_texts):
    return export_and_fuse(tmp_path_factory.mktemp("mb-enc"), tiny_modernbert_encoder, sample_texts)


def test_family_row():
    family = FAMILIES["modernbert"]
    assert family.exporter == "dynamo" and not family.decoder and family.layout is None
    # rotary on q and k: xformopt's rule for transformers 5's graph (xformopt/fusions/rotary.py; families.py)
    assert family.fused_per_layer == {"MultiHeadAttention": 1, "SkipLayerNormalization": 2, "RotaryEmbedding": 2}
    assert family.positions({"max_position_embeddings": 8192}) == 8192  # rotary: no reserved positions


@pytest.mark.parametrize("stages", ["classifier_stages", "encoder_stages"])
def test_export_uses_the_family_exporter_with_parity(stages, request):
    exported, record, _, _ = request.getfixturevalue(stages)
    assert record["exporter"].startswith("torch.onnx.export (dynamo=True)")
    assert record["inputs"] == ["input_ids", "attention_mask"]  # ModernBERT takes no token_type_ids
    parity = record["parity"]
    assert parity["max_abs_diff"] <= 1e-3 and parity["min_cosine"] >= 0.9999
    assert max(parity["sequence_lengths"]) > WINDOW and 2 in parity["batch_sizes"]
    assert onnx_op_counts(exported / "model.onnx")["MultiHeadAttention"] == 0  # fused in `fuse`, not here


@pytest.mark.parametrize("stages", ["classifier_stages", "encoder_stages"])
def test_fuse_reaches_every_layer_global_and_local(stages, request):
    _, _, fused, record = request.getfixturevalue(stages)
    assert record["fusion_route"].startswith("onnxscript")
    assert record["expected"] == {"MultiHeadAttention": LAYERS, "SkipLayerNormalization": 2 * LAYERS,
                                  "RotaryEmbedding": 2 * LAYERS}
    assert all(v == 0 for k, v in record["fused_before"].items() if k != "LayerNormalization")
    counts = onnx_op_counts(fused / "model.onnx")
    # both layers fuse, the sliding-window one too (its window is in MultiHeadAttention's bias input)
    assert counts["MultiHeadAttention"] == LAYERS
    assert counts["SkipLayerNormalization"] == 2 * LAYERS
    # q and k of both layers (global and local rotary bases alike), and no rotate-half left behind
    assert counts["RotaryEmbedding"] == 2 * LAYERS and counts["Neg"] == 0


@pytest.mark.parametrize("stages,model", [("classifier_stages", "tiny_modernbert"),
                                          ("encoder_stages", "tiny_modernbert_encoder")])
def test_fused_matches_unfused_and_torch(stages, model, request, sample_texts):
    from xformopt.exporting import compare
    from xformopt.runtime.encoder import OrtPredictor, TorchPredictor
    from xformopt.sources import resolve

    exported, _, fused, _ = request.getfixturevalue(stages)
    model_dir = request.getfixturevalue(model)
    spec = resolve(str(model_dir))
    unfused_p, fused_p = OrtPredictor(spec, exported, threads=1), OrtPredictor(spec, fused, threads=1)
    torch_p = TorchPredictor(spec, model_dir, threads=1)
    by_length = sorted(sample_texts[:40], key=lambda t: len(fused_p.tokenizer(t)["input_ids"]))
    cases = [[by_length[0]], [by_length[len(by_length) // 2]], [by_length[-1]], [by_length[0], by_length[-1]]]
    lengths = []
    for batch in cases:  # several lengths at batch 1, then a padded batch
        encoded = fused_p.tokenize(batch)
        lengths.append(encoded["input_ids"].shape[1])
        mask = encoded["attention_mask"]
        for reference in (unfused_p.raw_outputs(encoded), torch_p.raw_outputs(encoded)):
            got = compare(reference, fused_p.raw_outputs(encoded), mask)
            assert got["max_abs_diff"] < 1e-4 and got["min_cosine"] > 0.99999, (batch, got)
    assert max(lengths) > WINDOW and len(set(lengths)) >= 3


def test_fused_quantizes(classifier_stages, tiny_modernbert, sample_texts, tmp_path):
    from xformopt.runtime.encoder import OrtPredictor
    from xformopt.sources import resolve

    _, _, fused, _ = classifier_stages
    run_pass("quantize", make_ctx(tiny_modernbert, sample_texts), fused, tmp_path / "q")
    counts = onnx_op_counts(tmp_path / "q" / "model.onnx")
    assert counts["MatMulInteger"] + counts["DynamicQuantizeMatMul"] >= 3 * LAYERS  # Wqkv, Wo, Wi, Wo per layer
    assert counts["MultiHeadAttention"] == LAYERS  # the fused attention itself stays float (no INT8 kernel)
    spec = resolve(str(tiny_modernbert))
    texts = sample_texts[:16]
    got = OrtPredictor(spec, tmp_path / "q", threads=1, tokenizer_dir=fused).predict(texts)
    want = OrtPredictor(spec, fused, threads=1).predict(texts)
    assert np.isfinite(got).all() and np.mean(got.argmax(-1) == want.argmax(-1)) >= 0.75


def test_torchscript_route_fuses_no_attention_and_fails_loudly(tiny_modernbert, sample_texts, tmp_path):
    """A recipe's exporter wins over the family's; the TorchScript graph of ModernBERT fuses no
    attention in ORT's optimizer, and ``expect_full`` says so instead of shipping it unfused."""
    ctx = make_ctx(tiny_modernbert, sample_texts)
    record = run_pass("export", ctx, tiny_modernbert, tmp_path / "e", exporter="torchscript")
    assert record["exporter"].startswith("torch.onnx.export (TorchScript")
    with pytest.raises(PassFailed, match="MultiHeadAttention 0/2"):
        run_pass("fuse", ctx, tmp_path / "e", tmp_path / "f", select="all")


def test_optimize_end_to_end_loads_in_a_pipeline_model(tiny_modernbert, heldout_file, sample_texts, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from xformopt.clients.transformers_pipeline import OnnxPipelineModel

    monkeypatch.setenv("XFORMOPT_CACHE_DIR", str(tmp_path / "cache"))
    chosen = recipe.validate({
        "name": "tiny-modernbert", "target": "auto",
        "passes": ["export", {"fuse": {"select": "all"}}, "quantize"],
        "evaluation": {"data": str(heldout_file), "limit": 16, "latency_rounds": 3, "warmup": 1},
    })
    result = pipeline.run(str(tiny_modernbert), chosen, tmp_path / "out")
    out = result.out
    assert onnx_op_counts(out / "model.onnx")["MultiHeadAttention"] == LAYERS
    model = OnnxPipelineModel(out)
    assert model.config.model_type == "modernbert"
    tokenizer = AutoTokenizer.from_pretrained(out)
    encoded = tokenizer(sample_texts[:4], padding=True, return_tensors="np")
    encoded.pop("token_type_ids", None)
    logits = np.asarray(model(**encoded).logits)
    assert logits.shape == (4, 2) and np.isfinite(logits).all()


def test_embedder_stage_loads_in_a_pipeline_model(encoder_stages, sample_texts):
    from transformers import AutoTokenizer

    from xformopt.clients.transformers_pipeline import OnnxPipelineModel

    _, _, fused, _ = encoder_stages
    model = OnnxPipelineModel(fused)
    tokenizer = AutoTokenizer.from_pretrained(fused)
    encoded = tokenizer(sample_texts[:3], padding=True, return_tensors="np")
    encoded.pop("token_type_ids", None)
    states = np.asarray(model(**encoded).last_hidden_state)
    assert states.shape[:2] == encoded["input_ids"].shape and states.shape[2] == TINY["hidden"]


def test_rotary_rule_leaves_a_partial_rotation_alone(tiny_modernbert_encoder, sample_texts, tmp_path):
    """The rule fuses only a full rotation (x's last axis is 2 * len(inv_freq)): with the head's last quarter
    dropped from the frequencies (a partial rotation, as if rotary_embedding_dim were set) nothing fuses,
    and the graph still computes what it did."""
    import onnx_ir as ir
    import onnxruntime as ort
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    from xformopt.fusions import rotary

    ctx = make_ctx(tiny_modernbert_encoder, sample_texts)
    run_pass("export", ctx, tiny_modernbert_encoder, tmp_path / "e")
    model, _ = optimize_for_ort(ir.load(str(tmp_path / "e" / "model.onnx")))
    full = ir.from_proto(ir.to_proto(model))
    assert rotary.fuse(full) == 2 * LAYERS
    inv_freqs = [v for v in model.graph.initializers.values() if v.name.endswith("inv_freq")]
    assert inv_freqs
    for value in inv_freqs:  # half the frequencies: x's halves are now twice as wide as inv_freq
        array = value.const_value.numpy()
        value.const_value = ir.tensor(array[: array.shape[0] // 2].copy(), name=value.name)
        value.shape = ir.Shape([array.shape[0] // 2])
    assert rotary.fuse(model) == 0
    ir.save(full, str(tmp_path / "full.onnx"))
    ids = np.array([[2, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 3]] * 2, dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, -4:] = 0
    got, want = (ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"input_ids": ids, "attention_mask": mask})[0] for path in (tmp_path / "full.onnx", tmp_path / "e" / "model.onnx"))
    np.testing.assert_allclose(got[mask.astype(bool)], want[mask.astype(bool)], atol=1e-4)
