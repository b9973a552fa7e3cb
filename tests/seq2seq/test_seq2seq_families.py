"""Encoder-decoders beyond T5, BART and Marian: T5Gemma 2 (a family row; text-only use of a model with a
vision tower, nested configs, a decoder that merges self- and cross-attention) and two model types the
family table does not know (T5Gemma 1, Pegasus), which take the generic encoder-decoder route."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_seq2seq import _cut, _export, _hf_generate
from tiny_seq2seq import build_seq2seq, reverse_pairs

from xformopt import api
from xformopt.families import FAMILIES, SEQ2SEQ, custom_code_family, family_of
from xformopt.seq2seq.generate import GenerationSettings, generate
from xformopt.seq2seq.runner import OrtSeq2Seq

pytestmark = pytest.mark.filterwarnings("ignore")
QUICK = dict(limit=12, threads=1, latency_rounds=4, warmup=1, repeats=1)
PACKAGE = Path(__file__).resolve().parents[2] / "xformopt"


def _records(result) -> dict:
    return {p["pass"]: p["record"] for p in result.manifest["passes"]}


def _stages(result) -> dict:
    return {s["name"]: s for s in result.report["stages"]}


def test_an_unlisted_encoder_decoder_gets_a_generic_seq2seq_row(tmp_path):
    # nothing in the package names Pegasus: its route comes from transformers' auto classes alone
    assert not [p for p in PACKAGE.rglob("*.py") if "pegasus" in p.read_text(encoding="utf-8").lower()]
    for model_type in ("pegasus", "t5gemma"):
        row = family_of(model_type)
        assert model_type not in FAMILIES and row.generic and row.graph == SEQ2SEQ and not row.decoder
    assert not family_of("t5gemma2").generic and family_of("t5gemma2").graph == SEQ2SEQ
    trusted = custom_code_family("acme_s2s", {"AutoModelForSeq2SeqLM": "modeling_acme.AcmeForConditionalGeneration"})
    assert trusted.graph == SEQ2SEQ and trusted.generic


def test_t5gemma2_nested_config_is_read_and_checked(tmp_path):
    """T5Gemma 2 keeps its shape in encoder.text_config: read there, and a bad value there is named."""
    from xformopt.errors import InputError
    from xformopt.models.spec import describe

    src = build_seq2seq(tmp_path / "hf", "t5gemma2")
    spec = describe(src)
    assert (spec.task, spec.num_layers, spec.num_heads, spec.hidden_size) == ("translation", 2, 4, 64)
    config = json.loads((src / "config.json").read_text())
    config["encoder"]["text_config"]["num_attention_heads"] = 0
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="num_attention_heads must be a positive whole number"):
        describe(src)


def test_t5gemma2_goes_through_optimize(tmp_path):
    src = build_seq2seq(tmp_path / "hf", "t5gemma2")
    result = api.optimize(src, output=tmp_path / "out", use_cache=False, **QUICK)
    stages, records = _stages(result), _records(result)
    assert list(stages) == ["pytorch", "export", "fuse", "quantize"]
    assert stages["export"]["metrics"]["same_output_as_baseline"]["value"] == 1.0
    assert stages["fuse"]["metrics"]["same_output_as_baseline"]["value"] == 1.0
    assert records["export"]["parity"]["max_abs_diff"] < 1e-4
    fused = records["fuse"]["fused_by_graph"]
    # every encoder layer's self-attention, both the first step's decoder layers (merged self + cross), and
    # the cached step's decoder layers: one MultiHeadAttention each
    assert fused["encoder.onnx"]["MultiHeadAttention"] == 4 and fused["decoder.onnx"]["MultiHeadAttention"] == 2
    coverage = records["quantize"]["coverage"]
    assert coverage["int8"] == coverage["weighted_gemms"] > 0


@pytest.mark.parametrize("family", ["t5gemma", "pegasus"])
def test_generic_encoder_decoders_export_and_fuse_to_pytorchs_output(family, tmp_path):
    src = build_seq2seq(tmp_path / "hf", family)
    result = api.optimize(src, output=tmp_path / "out", use_cache=False, recipe="fp32-fused",
                          **QUICK)
    stages, records = _stages(result), _records(result)
    assert list(stages) == ["pytorch", "export", "fuse"]
    for stage in ("export", "fuse"):
        assert stages[stage]["metrics"]["same_output_as_baseline"]["value"] == 1.0
    assert records["fuse"]["expected"] == {}  # a generic row requires no fusion; the record says what fired
    assert set(records["fuse"]["fused_by_graph"]) == {"encoder.onnx", "decoder.onnx"}


def test_t5gemma2_greedy_and_beam_equal_transformers(tmp_path):
    from transformers import AutoTokenizer

    src = build_seq2seq(tmp_path / "hf", "t5gemma2", seed=3)
    onnx_dir = _export(src, tmp_path / "onnx")
    tokenizer = AutoTokenizer.from_pretrained(src)
    texts = [r["source"] for r in reverse_pairs(6, 11)]
    enc = {k: np.asarray(v) for k, v in tokenizer(texts, padding=True, return_tensors="np").items()}
    runner = OrtSeq2Seq(onnx_dir, threads=1)
    settings = GenerationSettings.from_model_dir(onnx_dir).with_(max_new_tokens=12)
    for beams in (1, 3):
        ours = generate(runner, enc["input_ids"], enc["attention_mask"], settings.with_(num_beams=beams))
        theirs = _hf_generate(src, enc, max_new_tokens=12, num_beams=beams)
        assert _cut(ours) == theirs, f"num_beams={beams}"


def test_flan_t5_small_shape_is_accepted_and_a_bad_head_width_named(tmp_path):
    """flan-t5-small (and mT5-small) put 6 heads of d_kv 64 in a 512-wide stream: T5's attention is
    num_heads x d_kv wide, not d_model split across heads, so the check reads d_kv (any config's head_dim)."""
    from tiny_seq2seq import FLAN_T5_SMALL, FLAN_T5_TINY, make_config
    from transformers import T5Config

    from xformopt.errors import InputError
    from xformopt.models.spec import describe
    from xformopt.models.validate import check_config

    full = make_config("t5", **FLAN_T5_SMALL).to_dict()
    assert full["d_model"] % full["num_heads"]  # the shape the old check refused
    check_config(full, tmp_path / "config.json", family_of("t5"))
    src = build_seq2seq(tmp_path / "hf", "t5", **FLAN_T5_TINY)
    spec = describe(src)
    assert (spec.task, spec.num_layers, spec.num_heads, spec.hidden_size) == ("translation", 2, 6, 64)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "d_kv": 0}))
    with pytest.raises(InputError, match="d_kv must be a positive whole number"):
        describe(src)
    # a config naming no head width is still held to hidden size = heads x width
    bare = {k: v for k, v in T5Config(d_model=512, num_heads=6).to_dict().items() if k != "d_kv"}
    with pytest.raises(InputError, match="not a multiple of the 6 attention heads"):
        check_config(bare, tmp_path / "config.json", family_of("t5"))


def test_flan_t5_shape_exports_and_generates_as_transformers(tmp_path):
    """The tiny flan-t5 shape (heads x d_kv != d_model, gated GELU, untied head): parity and greedy/beam tokens."""
    from tiny_seq2seq import FLAN_T5_TINY
    from transformers import AutoTokenizer

    from xformopt.seq2seq.parity import check_parity
    from xformopt.seq2seq.runner import TorchSeq2Seq

    src = build_seq2seq(tmp_path / "hf", "t5", seed=5, **FLAN_T5_TINY)
    onnx_dir = _export(src, tmp_path / "onnx")
    tokenizer = AutoTokenizer.from_pretrained(src)
    parity = check_parity(TorchSeq2Seq(src), OrtSeq2Seq(onnx_dir), tokenizer, [r["source"] for r in reverse_pairs(12, 1)])
    assert parity["max_abs_diff"] < 1e-4, parity
    enc = tokenizer([r["source"] for r in reverse_pairs(5, 3)], padding=True, return_tensors="np")
    settings = GenerationSettings.from_model_dir(onnx_dir).with_(max_new_tokens=10)
    for beams in (1, 4):
        ours = generate(OrtSeq2Seq(onnx_dir, threads=1), enc["input_ids"], enc["attention_mask"],
                        settings.with_(num_beams=beams))
        assert _cut(ours) == _hf_generate(src, enc, max_new_tokens=10, num_beams=beams), f"num_beams={beams}"
