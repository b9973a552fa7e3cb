"""MPNet attention fusion (xformopt/fusions/mpnet.py): every layer into MultiHeadAttention with the
relative position bias as its attention bias, parity to the unfused graph, counted, and quantized."""

from __future__ import annotations

import re
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import LABELS, TINY, make_ctx, onnx_op_counts, read_jsonl, run_pass

from xformopt.errors import PassFailed
from xformopt.resources import vader_split_path

LAYERS = TINY["layers"]
# MPNetTokenizerFast's special tokens (its unk is "[UNK]").
SPECIAL = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]


@pytest.fixture(scope="module")
def mpnet_tokenizer_dir(tmp_path_factory) -> Path:
    from transformers import MPNetTokenizerFast

    words = Counter()
    for row in read_jsonl(vader_split_path("train")):
        words.update(re.findall(r"[a-z]+", row["text"].lower()))
    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    vocab = list(dict.fromkeys(SPECIAL + chars + list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
                               + [w for w, _ in words.most_common() if len(w) > 1][:300] + [f"##{c}" for c in chars]))
    directory = tmp_path_factory.mktemp("mpnet-tokenizer")
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    MPNetTokenizerFast(vocab=str(directory / "vocab.txt"), do_lower_case=True,
                       model_max_length=128).save_pretrained(directory)
    return directory


def _tiny_mpnet(kind: str, tokenizer_dir: Path, directory: Path) -> Path:
    import torch
    from transformers import MPNetConfig, MPNetForSequenceClassification, MPNetModel

    torch.manual_seed(3)
    vocab = len((tokenizer_dir / "vocab.txt").read_text().splitlines())
    config = MPNetConfig(vocab_size=vocab, hidden_size=TINY["hidden"], num_hidden_layers=LAYERS,
                         num_attention_heads=TINY["heads"], intermediate_size=TINY["intermediate"],
                         max_position_embeddings=130, num_labels=2, id2label=LABELS,
                         label2id={v: k for k, v in LABELS.items()})
    model = (MPNetForSequenceClassification(config) if kind == "cls" else MPNetModel(config)).eval()
    with torch.no_grad():  # non-zero biases and a strong position bias, so a misplaced one shows in parity
        for name, p in model.named_parameters():
            if name.endswith("bias") and "LayerNorm" not in name:
                p.normal_(0, 0.1)
        model.base_model.encoder.relative_attention_bias.weight.normal_(0, 2.0)
    model.save_pretrained(directory)
    for item in tokenizer_dir.iterdir():
        shutil.copy2(item, directory / item.name)
    return directory


@pytest.fixture(scope="module", params=["cls", "enc"])
def mpnet(request, tmp_path_factory, mpnet_tokenizer_dir, sample_texts):
    """(model dir, exported stage, fuse record, fused stage) for a tiny MPNet classifier / embedder."""
    model = _tiny_mpnet(request.param, mpnet_tokenizer_dir, tmp_path_factory.mktemp(f"mpnet-{request.param}"))
    stages = tmp_path_factory.mktemp("mpnet-stages")
    run_pass("export", make_ctx(model, sample_texts), model, stages / "exported")
    record = run_pass("fuse", make_ctx(model, sample_texts), stages / "exported", stages / "fused", select="all")
    return model, stages / "exported", record, stages / "fused"


def test_every_layer_fuses_into_multihead_attention(mpnet):
    _, _, record, fused = mpnet
    assert record["fused_before"]["MultiHeadAttention"] == 0
    assert record["fused_possible"]["MultiHeadAttention"] == LAYERS
    assert record["expected"] == {"MultiHeadAttention": LAYERS, "SkipLayerNormalization": 2 * LAYERS}
    counts = onnx_op_counts(fused / "model.onnx")
    assert counts["MultiHeadAttention"] == LAYERS and counts["Softmax"] == 0
    graph = onnx.load(str(fused / "model.onnx")).graph
    mha = [n for n in graph.node if n.op_type == "MultiHeadAttention"]
    # the position bias is computed once per forward and shared: one bucket->embedding Gather, one bias
    table = [n for n in graph.node if n.op_type == "Gather" and "relative_attention_bias" in n.input[0]]
    assert len(table) == 1
    assert len({n.input[5] for n in mha}) == 1 and all(n.input[5] for n in mha)
    assert all(n.input[3] for n in mha)  # Q/K/V biases packed into the bias input


@pytest.mark.parametrize("seq", [4, 23, 128])
def test_fused_matches_unfused_at_lengths(mpnet, sample_texts, seq):
    from xformopt.measure.modes import exact_length_inputs
    from xformopt.runtime.encoder import OrtPredictor
    from xformopt.sources import resolve

    model, exported, _, fused = mpnet
    spec = resolve(str(model))
    a, b = OrtPredictor(spec, fused, threads=1), OrtPredictor(spec, exported, threads=1)
    encoded = exact_length_inputs(a.tokenizer, sample_texts, 2, seq)
    np.testing.assert_allclose(a.raw_outputs(encoded), b.raw_outputs(encoded), atol=1e-4, rtol=1e-4)


def test_fused_matches_unfused_on_padded_batch(mpnet, sample_texts):
    from xformopt.runtime.encoder import OrtPredictor
    from xformopt.sources import resolve

    model, exported, _, fused = mpnet
    spec = resolve(str(model))
    a, b = OrtPredictor(spec, fused, threads=1), OrtPredictor(spec, exported, threads=1)
    texts = sample_texts[:12]
    encoded = a.tokenize(texts)
    assert encoded["attention_mask"].min() == 0  # padded: real lengths differ
    np.testing.assert_allclose(a.run_encoded(encoded), b.run_encoded(encoded), atol=1e-4, rtol=1e-4)
    # and one text alone gives what it gives inside the padded batch (the mask is honoured)
    np.testing.assert_allclose(a(texts[:1]), a.run_encoded(encoded)[:1], atol=1e-4, rtol=1e-4)


def _break_one_layer(exported: Path, out: Path) -> Path:
    """A copy whose last layer scales its scores by Mul(1/sqrt(d)) instead of Div: same maths, not the pattern."""
    shutil.copytree(exported, out)
    model = onnx.load(str(out / "model.onnx"))
    divs = [n for n in model.graph.node if n.op_type == "Div" and "/attention/attn/" in n.name]
    div = divs[-1]
    constant = next((n for n in model.graph.node if div.input[1] in n.output), None)
    if constant is not None:  # the TorchScript export's Constant node
        value = onnx.numpy_helper.to_array(constant.attribute[0].t)
        constant.attribute[0].t.CopyFrom(onnx.numpy_helper.from_array((1.0 / value).astype(value.dtype)))
    else:  # the dynamo export's initializer: a new one, so no other node's divisor changes
        value = onnx.numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == div.input[1]))
        model.graph.initializer.append(onnx.numpy_helper.from_array((1.0 / value).astype(value.dtype),
                                                                    div.input[1] + "_inverse"))
        div.input[1] = div.input[1] + "_inverse"
    div.op_type = "Mul"
    onnx.save(model, str(out / "model.onnx"))
    return out


def test_expect_full_fails_loudly_when_a_layer_does_not_fuse(mpnet, tmp_path, sample_texts):
    model, exported, _, _ = mpnet
    broken = _break_one_layer(exported, tmp_path / "broken")
    with pytest.raises(PassFailed) as info:
        run_pass("fuse", make_ctx(model, sample_texts), broken, tmp_path / "f", select="all")
    assert "fusion fell short" in info.value.message
    assert f"MultiHeadAttention {LAYERS - 1}/{LAYERS}" in info.value.message


@pytest.mark.host_sensitive
def test_fastest_times_fused_against_unfused(mpnet, tmp_path, sample_texts):
    from xformopt.measure.host import cpu_flags

    model, exported, _, _ = mpnet
    ctx = make_ctx(model, sample_texts, target="avx2", host_flags=cpu_flags() | {"avx2"})
    record = run_pass("fuse", ctx, exported, tmp_path / "f", select="fastest", timing_rounds=3)
    assert set(record["timings_ms"]) == {"all", "all_split_norms", "no_attention", "no_attention_split_norms", "none"}
    assert record["fused_possible"]["MultiHeadAttention"] == LAYERS
    assert record["fused_kept"]["MultiHeadAttention"] == (LAYERS if record["kept"] == "all" else 0)
    assert onnx_op_counts(tmp_path / "f" / "model.onnx")["MultiHeadAttention"] == record["fused_kept"]["MultiHeadAttention"]


def test_dynamic_int8_on_fused_graph_agrees(mpnet, tmp_path, sample_texts):
    model, _, _, fused = mpnet
    record = run_pass("quantize", make_ctx(model, sample_texts, target="avx512_vnni"), fused, tmp_path / "q")
    counts = onnx_op_counts(tmp_path / "q" / "model.onnx")
    assert counts["MultiHeadAttention"] == LAYERS  # float attention on INT8 Q/K/V projections
    assert record["coverage"]["int8_ops"].get("MatMulInteger", 0) >= 6 * LAYERS
    assert record["agreement"]["mean_agreement"] >= 0.9


@pytest.mark.parametrize("disabled", [(), ("enable_attention",)])
def test_fusing_with_the_weights_on_disk_writes_the_same_graph(mpnet, tmp_path, sample_texts, disabled):
    """fuse keeps the weights on disk while ORT's optimizer runs (memory: issue 21); every weight there
    (threshold 0) must give byte for byte the graph an all-in-memory fusion writes."""
    from xformopt import models
    from xformopt.passes.fuse.run import build_fused

    model, exported, _, _ = mpnet
    ctx = make_ctx(model, sample_texts)
    ctx.spec = models.stage_spec(ctx.spec, exported)
    written = {}
    for threshold in (0, 2**62):  # everything on disk; nothing on disk
        out = tmp_path / str(threshold)
        out.mkdir()
        counts = build_fused(exported / "model.onnx", out / "model.onnx", ctx, disabled, weights_threshold=threshold)
        assert sorted(p.name for p in out.iterdir()) == ["model.onnx"]  # the scratch weights are gone
        written[threshold] = ((out / "model.onnx").read_bytes(), counts)
    assert written[0] == written[2**62]
    assert written[0][1]["MultiHeadAttention"] == (0 if disabled else LAYERS)
