"""DeBERTa-v2/v3 (model_type "deberta-v2"): export, xformopt's own attention fusion, INT8, end to end.

The tiny models are DeBERTa-v3-shaped (relative attention with c2p and p2c terms, log-bucketed
positions, shared attention keys, normalised relative embeddings, no absolute positions, no token
types), with weights drawn wide enough (initializer_range 0.3) that attention is far from uniform:
at the default 0.02 a wrong scale or a lost relative term would hide in the noise.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    LABELS,
    _save,
    _vocab_size,
    make_ctx,
    onnx_op_counts,
    run_cli,
    run_pass,
    write_tiny_recipe,
)

from xformopt import sources
from xformopt.passes.fuse.run import choose

V3 = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
          max_position_embeddings=128, relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=8,
          max_relative_positions=-1, position_biased_input=False, type_vocab_size=0, share_att_key=True,
          norm_rel_ebd="layer_norm", initializer_range=0.3)


def _config(tokenizer_dir: Path, **extra):
    from transformers import DebertaV2Config

    return DebertaV2Config(vocab_size=_vocab_size(tokenizer_dir), **{**V3, **extra})


@pytest.fixture(scope="module")
def tiny_deberta_cls(tmp_path_factory, tokenizer_dir) -> Path:
    import torch
    from transformers import DebertaV2ForSequenceClassification

    torch.manual_seed(3)
    config = _config(tokenizer_dir, num_labels=2, id2label=LABELS, label2id={v: k for k, v in LABELS.items()})
    return _save(DebertaV2ForSequenceClassification(config).eval(), tokenizer_dir, tmp_path_factory.mktemp("deb-cls"))


@pytest.fixture(scope="module")
def tiny_deberta_enc(tmp_path_factory, tokenizer_dir) -> Path:
    """DeBERTa-v2-shaped instead: separate position projections (share_att_key false), token types."""
    import torch
    from transformers import DebertaV2Model

    torch.manual_seed(4)
    config = _config(tokenizer_dir, share_att_key=False, type_vocab_size=2, norm_rel_ebd="none")
    return _save(DebertaV2Model(config).eval(), tokenizer_dir, tmp_path_factory.mktemp("deb-enc"))


@pytest.fixture(scope="module", params=["cls", "enc"])
def model_dir(request, tiny_deberta_cls, tiny_deberta_enc) -> Path:
    return {"cls": tiny_deberta_cls, "enc": tiny_deberta_enc}[request.param]


@pytest.fixture(scope="module", params=["dynamo", "torchscript"])
def exporter(request) -> str:
    """The family's default exporter (dynamo) and the TorchScript tracer it keeps as a fallback."""
    return request.param


@pytest.fixture(scope="module")
def exported(tmp_path_factory, model_dir, exporter, sample_texts) -> tuple[Path, dict]:
    dst = tmp_path_factory.mktemp("deb-stages") / "exported"
    return dst, run_pass("export", make_ctx(model_dir, sample_texts), model_dir, dst,
                         **({} if exporter == "dynamo" else {"exporter": exporter}))


@pytest.fixture(scope="module")
def fused(tmp_path_factory, model_dir, exported, sample_texts) -> tuple[Path, dict]:
    dst = tmp_path_factory.mktemp("deb-stages") / "fused"
    return dst, run_pass("fuse", make_ctx(model_dir, sample_texts), exported[0], dst, select="all")


def test_family_row_reads_a_deberta_v3_config(tiny_deberta_cls):
    from xformopt import models, sources
    from xformopt.families import family_of

    spec = sources.resolve(str(tiny_deberta_cls))
    assert (spec.model_type, spec.task, spec.num_layers, spec.num_heads, spec.hidden_size) == (
        "deberta-v2", "text-classification", 2, 4, 64)
    assert models.position_limit(tiny_deberta_cls) == 128  # relative positions, but the tokenizer is still bounded
    family = family_of("deberta-v2")
    assert family.own_fusion == "xformopt.fusions.deberta_v2:fuse"
    assert family.export_route() == "dynamo" and family.export_route("torchscript") == "torchscript"
    assert family.layout is None  # see families.py: transformers cannot prune DeBERTa heads


def test_export_parity_and_inputs(model_dir, exporter, exported):
    import onnx

    from xformopt.passes.export.dynamo import is_dynamo_graph

    dst, record = exported
    assert is_dynamo_graph(onnx.load(str(dst / "model.onnx"), load_external_data=False)) == (exporter == "dynamo")
    type_vocab = json.loads((model_dir / "config.json").read_text())["type_vocab_size"]
    # DeBERTa-v3 (type_vocab_size 0) takes no token_type_ids; the graph must not ask for them
    assert ("token_type_ids" in record["inputs"]) == (type_vocab > 0)
    assert record["parity"]["max_abs_diff"] < 1e-4 and record["parity"]["min_cosine"] > 0.9999
    assert len(set(record["parity"]["sequence_lengths"])) >= 3 and 2 in record["parity"]["batch_sizes"]


def test_every_layer_attention_fuses_and_is_counted(fused):
    dst, record = fused
    assert record["expected"] == {"MultiHeadAttention": 2, "SkipLayerNormalization": 4}
    assert record["fused_possible"]["MultiHeadAttention"] == 2
    ops = onnx_op_counts(dst / "model.onnx")
    assert ops["MultiHeadAttention"] == 2 and ops["Softmax"] == 0
    # the disentangled terms stay in the graph (they feed attention_bias): c2p and p2c gathers per layer
    assert ops["GatherElements"] == 4


def test_fused_matches_unfused_at_several_lengths_and_a_padded_batch(model_dir, exported, fused, sample_texts):
    from xformopt.exporting import compare
    from xformopt.runtime.encoder import OrtPredictor

    spec = sources.resolve(str(model_dir))
    unfused, fused_model = OrtPredictor(spec, exported[0]), OrtPredictor(spec, fused[0])
    by_length = sorted(sample_texts, key=len)
    batches = [[by_length[0]], [by_length[len(by_length) // 2]], [by_length[-1]], by_length[::8]]
    lengths = set()
    for batch in batches:
        encoded = unfused.tokenize(batch)
        lengths.add(encoded["input_ids"].shape[1])
        got = compare(unfused.raw_outputs(encoded), fused_model.raw_outputs(encoded), encoded["attention_mask"])
        assert got["max_abs_diff"] < 1e-4 and got["min_cosine"] > 0.99999, (encoded["input_ids"].shape, got)
    assert len(lengths) == 4
    assert not encoded["attention_mask"].all()  # the last batch is padded


def test_expect_full_fails_loudly_when_a_layer_does_not_fuse(model_dir, exported, sample_texts, tmp_path):
    """Break layer 1's pattern (its scores Add becomes a Sub): fuse must fail, naming 1/2 fused."""
    import onnx

    from xformopt.errors import PassFailed

    broken = tmp_path / "broken"
    shutil.copytree(exported[0], broken)
    model = onnx.load(str(broken / "model.onnx"))
    # In the unfused graph Softmax <- Where <- Reshape <- Add(QK^T, rel): make layer 1's Add a Sub
    # (its values change, which does not matter here: only the pattern is tested).
    producer = {o: n for n in model.graph.node for o in n.output}
    softmax = [n for n in model.graph.node if n.op_type == "Softmax"][1]
    add = producer[producer[producer[softmax.input[0]].input[2]].input[0]]
    assert add.op_type == "Add"
    add.op_type = "Sub"
    onnx.save(model, str(broken / "model.onnx"))
    with pytest.raises(PassFailed, match=r"MultiHeadAttention 1/2"):
        run_pass("fuse", make_ctx(model_dir, sample_texts), broken, tmp_path / "fused", select="all")


def test_dynamic_int8_after_fusion(model_dir, fused, sample_texts, tmp_path):
    from xformopt.runtime.encoder import OrtPredictor

    ctx = make_ctx(model_dir, sample_texts)
    record = run_pass("quantize", ctx, fused[0], tmp_path / "int8")
    assert record["coverage"]["int8"] > 0
    ops = onnx_op_counts(tmp_path / "int8" / "model.onnx")
    assert ops["MultiHeadAttention"] == 2 and ops["MatMulInteger"] > 0
    spec = sources.resolve(str(model_dir))
    encoded = OrtPredictor(spec, fused[0]).tokenize(sample_texts[:4])
    a = OrtPredictor(spec, fused[0]).run_encoded(encoded)
    b = OrtPredictor(spec, tmp_path / "int8").run_encoded(encoded)
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
    assert cos.min() > 0.9  # random tiny weights: INT8 stays close, not exact


def _recipe(tmp_path: Path, heldout: Path | None) -> Path:
    return write_tiny_recipe(tmp_path / "tiny.yaml", heldout, limit=24)


@pytest.mark.host_sensitive
@pytest.mark.parametrize("kind", ["cls", "enc"])
def test_optimize_end_to_end_and_the_artifact_loads_in_a_pipeline_model(kind, tiny_deberta_cls, tiny_deberta_enc, heldout_file,
                                                                sample_texts, tmp_path, capsys):
    from transformers import AutoTokenizer

    model_dir = {"cls": tiny_deberta_cls, "enc": tiny_deberta_enc}[kind]
    out = tmp_path / "out"
    code, _, err = run_cli(["optimize", model_dir, "-r", _recipe(tmp_path, heldout_file if kind == "cls" else None),
                            "-o", out], capsys)
    assert code == 0, err
    report = json.loads((out / "report.json").read_text())
    assert [s["name"] for s in report["stages"]] == ["pytorch", "export", "fuse", "quantize"]
    fuse = json.loads((out / "manifest.json").read_text())["passes"][1]["record"]
    assert fuse["fused_possible"]["MultiHeadAttention"] == 2
    if fuse["timings_ms"]:  # the host runs the target: timed, and the kept graph is the timing's choice
        assert set(fuse["timings_ms"]) == {"all", "all_split_norms", "no_attention", "no_attention_split_norms", "none"}
        assert fuse["kept"] == choose(fuse["timings_ms"], 0.05)[0]
    else:
        assert fuse["kept"] == "all" and "host lacks target" in fuse["reason"]

    tokenizer = AutoTokenizer.from_pretrained(out)
    encoded = tokenizer(sample_texts[:1], return_tensors="np")
    if kind == "cls":
        from xformopt.clients.transformers_pipeline import OnnxPipelineModel

        model = OnnxPipelineModel(out)
        assert model(**encoded).logits.shape == (1, 2)
    else:
        from xformopt.clients.transformers_pipeline import OnnxPipelineModel

        model = OnnxPipelineModel(out)
        assert model(**encoded).last_hidden_state.shape == (1, encoded["input_ids"].shape[1], 64)


VARIANTS = {  # (transformers class, config changes): the other heads and attention settings the family has
    "no-relative-attention": ("DebertaV2Model", dict(relative_attention=False, position_biased_input=True)),
    "c2p-only": ("DebertaV2Model", dict(pos_att_type=["c2p"])),
    "token-classification": ("DebertaV2ForTokenClassification", {}),
    "question-answering": ("DebertaV2ForQuestionAnswering", {}),
    "multiple-choice": ("DebertaV2ForMultipleChoice", {}),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_other_heads_and_attention_settings_fuse_with_parity(variant, tokenizer_dir, sample_texts, tmp_path):
    import onnxruntime as ort
    import torch
    import transformers
    from transformers import AutoTokenizer

    cls, extra = VARIANTS[variant]
    torch.manual_seed(5)
    model_dir = _save(getattr(transformers, cls)(_config(tokenizer_dir, **extra)).eval(), tokenizer_dir, tmp_path / "m")
    ctx = make_ctx(model_dir, sample_texts)
    run_pass("export", ctx, model_dir, tmp_path / "e")
    record = run_pass("fuse", ctx, tmp_path / "e", tmp_path / "f", select="all")
    assert record["fused_possible"]["MultiHeadAttention"] == 2

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    sessions = [ort.InferenceSession(str(tmp_path / d / "model.onnx"), providers=["CPUExecutionProvider"])
                for d in ("e", "f")]
    names = {i.name for i in sessions[0].get_inputs()}
    by_length = sorted(sample_texts, key=len)
    for batch in ([by_length[0]], [by_length[-1]], by_length[::10]):
        enc = {k: v for k, v in tokenizer(batch, padding=True, truncation=True, max_length=128, return_tensors="np").items() if k in names}
        mask = enc["attention_mask"].astype(bool)
        if variant == "multiple-choice":  # [batch, choices, length]: two identical choices
            enc = {k: np.repeat(v[:, None], 2, axis=1) for k, v in enc.items()}
        for unfused, fused_out in zip(*(s.run(None, enc) for s in sessions)):
            if unfused.shape[:2] == mask.shape:  # per token: padded positions are not compared
                unfused, fused_out = unfused[mask], fused_out[mask]
            np.testing.assert_allclose(fused_out, unfused, atol=1e-4, err_msg=f"{variant} {unfused.shape}")


def test_prune_and_distill_refuse_deberta_in_one_line():
    from xformopt.errors import InputError
    from xformopt.passes.surgery import arch_for

    for name in ("prune", "distill"):
        with pytest.raises(InputError, match=rf"unsupported architecture 'deberta-v2' for pass '{name}'"):
            arch_for("deberta-v2", name)


def test_type_vocab_size_zero_is_deberta_only(tiny_deberta_cls, tiny_classifier, tmp_path):
    from xformopt.errors import InputError

    assert sources.resolve(str(tiny_deberta_cls)).model_type == "deberta-v2"  # v3 has type_vocab_size 0
    bert = tmp_path / "bert"
    shutil.copytree(tiny_classifier, bert)
    config = json.loads((bert / "config.json").read_text())
    (bert / "config.json").write_text(json.dumps({**config, "type_vocab_size": 0}))
    with pytest.raises(InputError, match="type_vocab_size is 0; it must be a positive whole number"):
        sources.resolve(str(bert))
