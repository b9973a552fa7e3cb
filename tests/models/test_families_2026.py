"""Encoder families transformers 5 added (EuroBERT, GTE, NomicBERT, Jina-embeddings-v3), on tiny random
configs built here: each goes through `optimize` (export -> fuse -> dynamic INT8) with its attention
fused in every layer, counted; and a model type the family table does not know runs through the generic
path, its fuse record saying what fused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import TINY, _save, _vocab_size, onnx_op_counts, run_cli

from xformopt.families import FAMILIES, family_of

LAYERS = TINY["layers"]


def _config(model_type: str, tokenizer_dir: Path, **extra):
    from transformers import AutoConfig

    shape = dict(vocab_size=_vocab_size(tokenizer_dir), hidden_size=TINY["hidden"], num_hidden_layers=LAYERS,
                 num_attention_heads=TINY["heads"], intermediate_size=TINY["intermediate"],
                 max_position_embeddings=128, pad_token_id=0)
    return AutoConfig.for_model(model_type, **{**shape, **extra})


# model type -> config changes
NEW_FAMILIES = {"eurobert": {}, "gte": {}, "nomic_bert": {}, "jina_embeddings_v3": {}}


@pytest.fixture(scope="module", params=sorted(NEW_FAMILIES))
def tiny_family_model(request, tmp_path_factory, tokenizer_dir) -> tuple[str, Path]:
    import torch
    from transformers import AutoModel

    model_type = request.param
    torch.manual_seed(0)
    model = AutoModel.from_config(_config(model_type, tokenizer_dir, **NEW_FAMILIES[model_type])).eval()
    return model_type, _save(model, tokenizer_dir, tmp_path_factory.mktemp(f"tiny-{model_type}"))


RECIPE = """
name: tiny
target: auto
passes:
  - export
  - fuse: {select: all}
  - quantize
evaluation: {limit: 16, latency_rounds: 3, warmup: 1}
"""


def test_new_family_optimizes_with_attention_fused_in_every_layer(tiny_family_model, heldout_file, tmp_path, capsys):
    model_type, model_dir = tiny_family_model
    (tmp_path / "r.yaml").write_text(RECIPE)
    out = tmp_path / "out"
    code, _, err = run_cli(["optimize", model_dir, "-r", tmp_path / "r.yaml", "-o", out, "--data", heldout_file], capsys)
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    fuse = next(p["record"] for p in manifest["passes"] if p["pass"] == "fuse")
    assert not family_of(model_type).generic and fuse["expected"] == {
        op: n * LAYERS for op, n in FAMILIES[model_type].fused_per_layer.items()}
    assert fuse["expected"]["MultiHeadAttention"] == LAYERS  # attention fused in every layer (expect_full)
    for op, n in fuse["expected"].items():
        assert fuse["fused_possible"][op] >= n
    report = json.loads((out / "report.json").read_text())
    assert [s["name"] for s in report["stages"]] == ["pytorch", "export", "fuse", "quantize"]
    counts = onnx_op_counts(out / "model.onnx")
    assert counts.get("MatMulInteger", 0) + counts.get("DynamicQuantizeMatMul", 0) + counts.get("QAttention", 0) > 0


def test_a_model_type_without_a_row_runs_the_generic_path(tokenizer_dir, heldout_file, tmp_path, capsys):
    """ERNIE (BERT-like, no row in the family table): exported, fused with what the rewriter and ORT
    recognise, quantized; the record says what fused and that the row was generic (nothing expected)."""
    import torch
    from transformers import AutoModel

    assert "ernie" not in FAMILIES and family_of("ernie").generic and not family_of("ernie").decoder
    torch.manual_seed(0)
    model_dir = _save(AutoModel.from_config(_config("ernie", tokenizer_dir)).eval(), tokenizer_dir, tmp_path / "ernie")
    (tmp_path / "r.yaml").write_text(RECIPE)
    out = tmp_path / "out"
    code, _, err = run_cli(["optimize", model_dir, "-r", tmp_path / "r.yaml", "-o", out, "--data", heldout_file], capsys)
    assert code == 0, err
    fuse = next(p["record"] for p in json.loads((out / "manifest.json").read_text())["passes"] if p["pass"] == "fuse")
    assert fuse["expected"] == {}
    assert fuse["fused_possible"].get("Attention", 0) + fuse["fused_possible"].get("MultiHeadAttention", 0) == LAYERS
    assert "fuse" in (out / "report.md").read_text()


def test_a_non_text_model_is_refused_before_any_work(tmp_path, capsys):
    """A vision-language config (its images need a vision tower the exporter does not take): one line, exit 2."""
    from transformers import AutoConfig

    config = AutoConfig.for_model("qwen3_vl")
    config.save_pretrained(tmp_path / "vl")
    code, _, err = run_cli(["optimize", tmp_path / "vl", "-o", tmp_path / "out"], capsys)
    assert code == 2
    assert "not a text-only model" in err and not (tmp_path / "out").exists()


def test_custom_code_without_trust_is_refused_before_any_work(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(
        {"model_type": "acme_bert", "auto_map": {"AutoModel": "modeling_acme.AcmeModel"}, "hidden_size": 64,
         "num_attention_heads": 4, "num_hidden_layers": 2}))
    code, _, err = run_cli(["optimize", tmp_path / "m", "-o", tmp_path / "out"], capsys)
    assert code == 2
    assert "--trust-remote-code" in err and not (tmp_path / "out").exists()
