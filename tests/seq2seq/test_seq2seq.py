"""Encoder-decoder export, runner and generation on tiny T5, BART and Marian models built in code."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tiny_seq2seq import FAMILIES, build_seq2seq, reverse_pairs

from xformopt.seq2seq import DECODER_FILE, ENCODER_FILE
from xformopt.seq2seq.export import export_seq2seq
from xformopt.seq2seq.generate import GenerationSettings, generate
from xformopt.seq2seq.parity import check_parity
from xformopt.seq2seq.runner import OrtSeq2Seq, TorchSeq2Seq
from xformopt.seq2seq.stage import copy_config_files

pytestmark = pytest.mark.filterwarnings("ignore")


def _export(src, dst):
    from transformers import AutoModelForSeq2SeqLM

    dst.mkdir()
    export_seq2seq(AutoModelForSeq2SeqLM.from_pretrained(src).eval(), dst, 18)
    copy_config_files(src, dst)
    return dst


@pytest.fixture(scope="module", params=FAMILIES)
def exported(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"s2s-{request.param}")
    src = build_seq2seq(root / "hf", request.param)
    return request.param, src, _export(src, root / "onnx")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, trained_bart_src):
    """The tiny BART trained to reverse word sequences (tests/seq2seq/conftest.py), exported."""
    root = tmp_path_factory.mktemp("s2s-trained")
    return trained_bart_src, _export(trained_bart_src, root / "onnx")


def _cut(rows, eos=1):
    """Token rows up to and including the first EOS (transformers pads finished rows)."""
    out = []
    for row in rows:
        row = list(row)
        out.append(row[:row.index(eos) + 1] if eos in row else row)
    return out


def _hf_generate(src, enc, **kwargs):
    import torch
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(src).eval()
    out = model.generate(input_ids=torch.from_numpy(enc["input_ids"]), attention_mask=torch.from_numpy(enc["attention_mask"]),
                         do_sample=False, **kwargs)
    return _cut([row[1:] for row in out.tolist()])


def test_graphs_have_cache_inputs_and_dynamic_axes(exported):
    import onnx

    family, src, onnx_dir = exported
    layers = json.loads((src / "config.json").read_text()).get("decoder_layers") or 2
    decoder = onnx.load(onnx_dir / DECODER_FILE).graph
    names = [i.name for i in decoder.input]
    assert names[:2] == ["decoder_input_ids", "encoder_attention_mask"]
    assert sum(n.startswith("past.") and ".decoder." in n for n in names) == 2 * layers  # self-attention, growing
    assert sum(n.startswith("past.") and ".encoder." in n for n in names) == 2 * layers  # cross-attention, fixed
    axes = {i.name: [d.dim_param for d in i.type.tensor_type.shape.dim] for i in decoder.input}
    assert axes["past.0.decoder.key"][0] and axes["past.0.decoder.key"][2]  # batch and past length are symbolic
    assert axes["decoder_input_ids"][1]  # new tokens per step are symbolic too (exported with 2)
    encoder = onnx.load(onnx_dir / ENCODER_FILE).graph
    assert [i.name for i in encoder.input] == ["input_ids", "attention_mask"]
    assert {"last_hidden_state", "logits", "present.0.encoder.key"} <= {o.name for o in encoder.output}


def test_parity_encoder_first_and_cached_steps(exported):
    from transformers import AutoTokenizer

    family, src, onnx_dir = exported
    texts = [r["source"] for r in reverse_pairs(40, 1)]
    result = check_parity(TorchSeq2Seq(src), OrtSeq2Seq(onnx_dir), AutoTokenizer.from_pretrained(src), texts)
    assert result["max_abs_diff"] < 1e-4, result
    assert result["min_cosine"] > 0.99999, result
    assert len(set(result["sequence_lengths"])) >= 3 and 2 in result["batch_sizes"]


@pytest.mark.parametrize("beams", [1, 3])
def test_generation_equals_transformers(exported, beams):
    """Greedy and beam search over the ONNX graphs give transformers' ``generate`` tokens, batched
    (padded sources), random weights (every family's start/forced tokens from its config)."""
    from transformers import AutoTokenizer

    family, src, onnx_dir = exported
    tokenizer = AutoTokenizer.from_pretrained(src)
    enc = tokenizer([r["source"] for r in reverse_pairs(5, 3)], padding=True, return_tensors="np")
    settings = GenerationSettings.from_model_dir(onnx_dir, max_new_tokens=10, num_beams=beams)
    got = _cut(generate(OrtSeq2Seq(onnx_dir), enc["input_ids"], enc["attention_mask"], settings))
    assert got == _hf_generate(src, enc, max_new_tokens=10, num_beams=beams)


def test_trained_model_greedy_equals_pytorch_and_reverses(trained):
    from transformers import AutoTokenizer

    src, onnx_dir = trained
    tokenizer = AutoTokenizer.from_pretrained(src)
    rows = reverse_pairs(24, 11)  # held out: another seed than training's
    enc = tokenizer([r["source"] for r in rows], padding=True, return_tensors="np")
    settings = GenerationSettings.from_model_dir(onnx_dir, max_new_tokens=16)
    got = generate(OrtSeq2Seq(onnx_dir), enc["input_ids"], enc["attention_mask"], settings)
    assert _cut(got) == _hf_generate(src, enc, max_new_tokens=16, num_beams=1)
    texts = tokenizer.batch_decode(got, skip_special_tokens=True)
    exact = np.mean([t == r["target"] for t, r in zip(texts, rows)])
    assert exact > 0.8, list(zip(texts, rows))[:3]  # the model learned the task: BLEU below is meaningful


def test_settings_from_generation_config(exported, tmp_path):
    family, src, onnx_dir = exported
    settings = GenerationSettings.from_model_dir(onnx_dir)
    assert settings.max_new_tokens == 23  # max_length 24 less the start token
    assert settings.forced_bos_token_id == (2 if family == "bart" else None)
    assert GenerationSettings.from_model_dir(onnx_dir, num_beams=4).num_beams == 4
    from xformopt.errors import InputError

    with pytest.raises(InputError, match="--num-beams"):
        settings.with_(num_beams=0)


@pytest.mark.parametrize("rules", [dict(num_beams=3, length_penalty=0.6, no_repeat_ngram_size=2),
                                   dict(num_beams=2, min_new_tokens=6, early_stopping=True),
                                   dict(num_beams=1, no_repeat_ngram_size=2, min_new_tokens=4)])
def test_generation_rules_equal_transformers(exported, rules):
    """Length penalty, early stopping, no-repeat n-grams and a minimum length as transformers applies them."""
    from transformers import AutoTokenizer

    family, src, onnx_dir = exported
    tokenizer = AutoTokenizer.from_pretrained(src)
    enc = tokenizer([r["source"] for r in reverse_pairs(4, 5)], padding=True, return_tensors="np")
    settings = GenerationSettings.from_model_dir(onnx_dir, max_new_tokens=9, **rules)
    got = _cut(generate(OrtSeq2Seq(onnx_dir), enc["input_ids"], enc["attention_mask"], settings))
    assert got == _hf_generate(src, enc, max_new_tokens=9, **rules)
