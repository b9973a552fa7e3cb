"""prune's width pruning of the hidden size (xformopt/passes/prune/width.py), its relative targets
(prune/relative.py) and MPNet's heads (pruned the same in every layer, the shared position bias cut per
kept head), on tiny models built in code."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import TINY, make_ctx, onnx_op_counts, run_pass
from mpnet_helpers import tiny_mpnet

from xformopt.errors import InputError
from xformopt.passes import surgery
from xformopt.passes.prune import plans as prune_plans
from xformopt.passes.prune import relative, width
from xformopt.passes.prune.flops import Shape

HEAD_DIM = TINY["hidden"] // TINY["heads"]
FAST = dict(measure_latency=False, samples=32, eval_samples=32, batch_size=16)


@pytest.fixture(scope="module")
def mpnet_classifier(tmp_path_factory) -> Path:
    return tiny_mpnet(tmp_path_factory.mktemp("mpnet") / "cls", classifier=True)


def logits(model, path: Path, texts) -> np.ndarray:
    import inspect

    import torch
    from transformers import AutoTokenizer

    enc = AutoTokenizer.from_pretrained(path)(list(texts), padding=True, truncation=True, max_length=64,
                                              return_tensors="pt")
    accepts = set(inspect.signature(model.forward).parameters)
    with torch.no_grad():
        return model(**{k: v for k, v in enc.items() if k in accepts}).logits.numpy()


def auto_load(path: Path):
    """Plain transformers, no xformopt loader: what a user's code does with the student."""
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(path).eval()


@pytest.mark.parametrize("which", ["bert", "mpnet"])
def test_width_pruning_with_nothing_pruned_leaves_outputs_identical(which, tiny_classifier, mpnet_classifier,
                                                                    sample_texts):
    """Every channel kept: the rebuilt model (a new model of the class, every tensor copied through the
    slicing rule) computes exactly the teacher's logits."""
    path = tiny_classifier if which == "bert" else mpnet_classifier
    model = auto_load(path)
    arch = surgery.arch_for(model.config.model_type)
    same = width.shrink_hidden(model, arch, list(range(TINY["hidden"])))
    assert same is not model and same.config.hidden_size == TINY["hidden"]
    np.testing.assert_array_equal(logits(same, path, sample_texts[:8]), logits(model, path, sample_texts[:8]))


def test_channel_importance_ranks_a_dead_channel_last(tiny_classifier, sample_texts):
    """A channel that every residual LayerNorm writes as 0 (weight and bias 0) carries nothing: score 0, cut first."""
    import inspect

    import torch
    from transformers import AutoTokenizer

    from xformopt.passes.prune.importance import make_batches

    model = auto_load(tiny_classifier)
    arch = surgery.arch_for("bert")
    norms = width.residual_norms(model, TINY["hidden"])
    assert len(norms) == 1 + 2 * TINY["layers"]  # the embeddings' norm and two per layer
    with torch.no_grad():
        for norm in norms:
            norm.weight[7] = 0
            norm.bias[7] = 0
    tok = AutoTokenizer.from_pretrained(tiny_classifier)
    batches = make_batches(tok, sample_texts[:16], None, None, 8, 64, set(inspect.signature(model.forward).parameters))
    scores = width.channel_importance(model, arch, batches)
    assert scores.shape == (TINY["hidden"],) and scores[7] == 0 and (np.delete(scores, 7) > 0).all()
    assert 7 not in width.kept_channels(scores, TINY["hidden"] - 1)


def test_width_pruned_student_loads_with_automodel_exports_and_fuses(tiny_classifier, sample_texts, tmp_path):
    """The pass with hidden_size: a stock checkpoint of the same family (no pruned_heads; heads follow the width)
    that AutoModel loads with the pass's own held-out quality, whose export keeps parity and fuses every layer."""
    import inspect

    import torch
    from transformers import AutoTokenizer

    from xformopt.passes.prune.importance import make_batches, quality
    from xformopt.runtime.encoder import OrtPredictor

    out = tmp_path / "p"
    record = run_pass("prune", make_ctx(tiny_classifier, sample_texts), tiny_classifier, out, hidden_size=32,
                      ffn_fraction=0.5, **FAST)
    assert record["before"]["hidden_size"] == 64 and record["after"]["hidden_size"] == 32
    assert record["after"]["heads_per_layer"] == [2, 2] and record["after"]["ffn_per_layer"] == [64, 64]
    assert record["target"] == {"hidden_size": 32, "ffn_dim": 64, "ffn_fraction": 0.5}
    assert "hidden" in record["importance"] and not record["pruned_heads"]
    from xformopt.passes.prune.run import PrunePass

    assert "2->2 layers, heads [2, 2], FFN 64, hidden 64->32;" in PrunePass.summarize(record)
    student = auto_load(out)
    assert (student.config.hidden_size, student.config.num_attention_heads) == (32, 2)
    assert not getattr(student.config, "pruned_heads", None)
    assert student.bert.embeddings.word_embeddings.weight.shape[1] == 32 and student.classifier.in_features == 32
    ctx = make_ctx(tiny_classifier, sample_texts)
    from xformopt.passes.prune.run import PruneOptions, load_sets

    _, held = load_sets(ctx, PruneOptions(hidden_size=32, **FAST), True)
    tok = AutoTokenizer.from_pretrained(out)
    batches = make_batches(tok, held.texts, None, held.labels, 16, 128, set(inspect.signature(student.forward).parameters))
    assert quality(student, batches, "logits", None) == record["quality_before_recovery"]["pruned"]

    ctx = make_ctx(out, sample_texts)
    run_pass("export", ctx, out, tmp_path / "e")
    fused = run_pass("fuse", ctx, tmp_path / "e", tmp_path / "f", select="all")
    assert fused["expected"] == {"Attention": 2, "SkipLayerNormalization": 4}
    counts = onnx_op_counts(tmp_path / "f" / "model.onnx")
    assert counts["Attention"] == 2 and counts["SkipLayerNormalization"] == 4
    onnx_model = OrtPredictor(ctx.spec, tmp_path / "f", threads=1)
    enc = onnx_model.tokenize(sample_texts[:3])
    with torch.no_grad():
        want = student(**{k: torch.from_numpy(v) for k, v in enc.items()}).logits.numpy()
    np.testing.assert_allclose(onnx_model.raw_outputs(enc), want, atol=1e-4)


def test_mpnet_width_pruned_loads_with_automodel(mpnet_classifier, sample_texts, tmp_path):
    """MPNet narrower: the shared relative-position bias keeps one column per kept head (the same heads in every
    layer), and AutoModel loads the student."""
    record = run_pass("prune", make_ctx(mpnet_classifier, sample_texts), mpnet_classifier, tmp_path / "p",
                      hidden_fraction=0.5, layers=1, **FAST)
    assert record["after"]["hidden_size"] == 32 and record["after"]["heads_per_layer"] == [2]
    student = auto_load(tmp_path / "p")
    assert student.mpnet.encoder.relative_attention_bias.weight.shape[1] == 2
    assert np.isfinite(logits(student, tmp_path / "p", sample_texts[:4])).all()


def test_mpnet_head_pruning_is_shared_and_reloads(mpnet_classifier, sample_texts, tmp_path):
    """MPNet heads (refused before): the same heads go from every layer, the bias keeps their columns, the
    checkpoint reloads through xformopt's loader with the in-memory logits, and export + fuse keep parity."""
    import torch

    from xformopt.models import pruned_heads
    from xformopt.runtime.encoder import OrtPredictor

    out = tmp_path / "p"
    record = run_pass("prune", make_ctx(mpnet_classifier, sample_texts), mpnet_classifier, out, heads_per_layer=3,
                      **FAST)
    gone = record["pruned_heads"]
    assert set(gone) == {"0", "1"} and gone["0"] == gone["1"] and len(gone["0"]) == 1
    assert "heads_shared" in record["importance"]
    import transformers

    model = pruned_heads.from_pretrained(transformers.AutoModelForSequenceClassification, out).eval()
    assert model.mpnet.encoder.relative_attention_bias.weight.shape[1] == 3
    ctx = make_ctx(out, sample_texts)
    run_pass("export", ctx, out, tmp_path / "e")
    run_pass("fuse", ctx, tmp_path / "e", tmp_path / "f", select="all")
    assert onnx_op_counts(tmp_path / "f" / "model.onnx")["MultiHeadAttention"] == 2
    onnx_model = OrtPredictor(ctx.spec, tmp_path / "f", threads=1)
    enc = onnx_model.tokenize(sample_texts[:3])
    with torch.no_grad():
        want = model(**{k: torch.from_numpy(v) for k, v in enc.items()}).logits.numpy()
    np.testing.assert_allclose(onnx_model.raw_outputs(enc), want, atol=1e-4)


def test_mpnet_heads_differing_between_layers_are_refused(mpnet_classifier):
    from xformopt.models import pruned_heads

    model = auto_load(mpnet_classifier)
    with pytest.raises(InputError, match="same heads in every layer"):
        pruned_heads.prune_heads(model, {0: [1], 1: [2]})
    assert model.mpnet.encoder.relative_attention_bias.weight.shape[1] == TINY["heads"]  # nothing cut
    pruned_heads.prune_heads(model, {0: [1], 1: [1]})
    assert model.mpnet.encoder.relative_attention_bias.weight.shape[1] == TINY["heads"] - 1


def test_fractions_reproduce_minilm_absolute_shape_and_scale_to_base():
    """0.5 / 0.667 / 0.333 is MiniLM-L6's old shape (3 of 6 layers, 8 of 12 heads, FFN 512 of 1536); on BERT-base's
    shape the same fractions mean 6 layers, 8 heads, FFN 1024."""
    from xformopt.passes.prune.run import PruneOptions

    options = PruneOptions(layers_fraction=0.5, heads_fraction=0.667, ffn_fraction=0.333)
    for shape, want in ((Shape(384, 32, [12] * 6, [1536] * 6), (3, 8, 512)),
                        (Shape(768, 64, [12] * 12, [3072] * 12), (6, 8, 1024))):
        absolute = relative.resolve(options, shape)
        assert absolute.layers_fraction is None and absolute.ffn_dim in (want[2] - 1, want[2])
        n = shape.num_layers
        plan = prune_plans.explicit_plan([np.zeros(12)] * n, [np.zeros(shape.ffn[0])] * n, [0.0] * n, shape,
                                         absolute, 16)  # the plan rounds the FFN width to the SIMD multiple
        assert (len(plan.keep_layers), len(plan.heads[plan.keep_layers[0]]), plan.ffn_width) == want
    with pytest.raises(InputError, match="same dimension"):
        relative.resolve(PruneOptions(layers=3, layers_fraction=0.5), Shape(384, 32, [12] * 6, [1536] * 6))


def test_hidden_size_and_heads_must_agree(tiny_classifier, sample_texts, tmp_path):
    with pytest.raises(InputError, match="heads_per_layer 3 does not fit"):
        run_pass("prune", make_ctx(tiny_classifier, sample_texts), tiny_classifier, tmp_path / "p", hidden_size=32,
                 heads_per_layer=3, **FAST)


def family_classifier(family: str, vocab: int):
    """A tiny random classifier of ``family`` (ELECTRA with an embedding size below its hidden size: its
    embeddings_project layer is where the residual stream starts)."""
    import torch
    import transformers

    torch.manual_seed(4)
    common = dict(num_labels=2, vocab_size=vocab)
    if family == "distilbert":
        config = transformers.DistilBertConfig(dim=TINY["hidden"], n_layers=2, n_heads=TINY["heads"],
                                               hidden_dim=TINY["intermediate"], max_position_embeddings=128, **common)
    else:
        cls = {"roberta": transformers.RobertaConfig, "xlm-roberta": transformers.XLMRobertaConfig,
               "electra": transformers.ElectraConfig}[family]
        extra = {"embedding_size": 16} if family == "electra" else {"pad_token_id": 1}
        config = cls(hidden_size=TINY["hidden"], num_hidden_layers=2, num_attention_heads=TINY["heads"],
                     intermediate_size=TINY["intermediate"], max_position_embeddings=130, **extra, **common)
    return transformers.AutoModelForSequenceClassification.from_config(config).eval()


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta", "electra", "distilbert"])
def test_width_pruning_reaches_every_bert_like_family(family, tmp_path):
    """Per family: every channel kept gives the same logits; half the channels (heads cut to match, one layer
    dropped by the plan) gives a stock checkpoint that AutoModel loads with the in-memory logits."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from xformopt.passes.prune.importance import magnitude_importance
    from xformopt.passes.surgery import apply_plan

    model = family_classifier(family, 120)
    arch = surgery.arch_for(model.config.model_type)
    ids = torch.randint(5, 120, (3, 12))
    with torch.no_grad():
        want = model(input_ids=ids).logits
        same = width.shrink_hidden(model, arch, list(range(TINY["hidden"])))
        np.testing.assert_array_equal(same(input_ids=ids).logits.numpy(), want.numpy())
    shape = surgery.current_shape(model, arch)
    heads, ffn, layers = magnitude_importance(model, arch)
    from xformopt.passes.prune.run import PruneOptions

    plan = prune_plans.explicit_plan(heads, ffn, layers, shape, PruneOptions(hidden_fraction=0.5, layers=1).model_copy(
        update={"hidden_size": 32, "hidden_fraction": None}), 8, width.magnitude_channels(model, arch))
    apply_plan(model, arch, plan)
    student = width.shrink_hidden(model, arch, plan.hidden)
    student.save_pretrained(tmp_path / "s")
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "s").eval()
    key = arch.layout.hidden_key
    assert getattr(loaded.config, key) == 32 and len(arch.layers(loaded)) == 1 and arch.heads(arch.layers(loaded)[0]) == 2
    with torch.no_grad():
        np.testing.assert_allclose(loaded(input_ids=ids).logits.numpy(), student(input_ids=ids).logits.numpy(), atol=1e-6)


def test_a_width_that_would_drop_a_module_is_refused():
    """ELECTRA builds embeddings_project only when embedding_size differs from hidden_size: cutting the hidden size
    to the embedding size would silently drop the projection, so it is refused."""
    from xformopt.errors import PassFailed

    model = family_classifier("electra", 120)
    model.config.embedding_size = 32  # an ELECTRA whose embeddings are 32 wide: hidden 32 would equal them
    arch = surgery.arch_for("electra")
    from xformopt.passes.surgery import apply_plan

    heads, ffn, layers = [np.arange(4.0)] * 2, [np.arange(128.0)] * 2, [0.0, 0.0]
    from xformopt.passes.prune.run import PruneOptions

    plan = prune_plans.explicit_plan(heads, ffn, layers, surgery.current_shape(model, arch),
                                     PruneOptions(hidden_size=32), 8, np.arange(64.0))
    apply_plan(model, arch, plan)
    with pytest.raises(PassFailed, match="would lose electra.embeddings_project"):
        width.shrink_hidden(model, arch, plan.hidden)


def test_untrained_mpnet_students_keep_the_same_heads_in_every_layer(mpnet_classifier):
    """students.cut_to (the shape search's untrained students, magnitude importance) on MPNet: head and hidden-size
    cuts keep one head set for every layer (found on all-mpnet-base-v2, whose per-layer rankings differ)."""
    import torch

    from xformopt.passes.prune.run import PruneOptions
    from xformopt.passes.prune.students import cut_to

    model = auto_load(mpnet_classifier)
    with torch.no_grad():  # make the layers' own magnitude rankings of the heads disagree
        for i, layer in enumerate(model.mpnet.encoder.layer):
            layer.attention.attn.o.weight[:, i * HEAD_DIM:(i + 1) * HEAD_DIM] *= 5
    arch = surgery.arch_for("mpnet")
    ids = torch.randint(5, 100, (2, 9))
    for options in (PruneOptions(heads_fraction=0.5), PruneOptions(hidden_fraction=0.5, layers=2)):
        student = cut_to(model, arch, options, 8)
        assert student.mpnet.encoder.relative_attention_bias.weight.shape[1] == 2
        with torch.no_grad():
            assert torch.isfinite(student(input_ids=ids).logits).all()
    assert model.mpnet.encoder.relative_attention_bias.weight.shape[1] == TINY["heads"]  # the teacher is untouched
