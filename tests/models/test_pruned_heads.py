"""xformopt's own attention-head pruning (transformers 5 removed prune_heads): numeric equivalence with the
heads masked out, per family and attention implementation; per-layer head counts; the save -> load round
trip; checkpoints pruned by transformers 4.57 (xformopt 0.1); strict loading; the meta-device check."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from xformopt.errors import InputError
from xformopt.families import Layout, layout_of
from xformopt.models import pruned_heads, validate

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pruned_tf457"
HEADS = {0: [1], 1: [0, 2, 3]}  # per-layer head counts differ: 3 and 1 of 4


def tiny(model_type: str, cls: str = "AutoModel", **extra):
    """A tiny random model of MODEL_TYPE with non-zero biases (a bias row sliced wrongly would show)."""
    import torch
    import transformers

    torch.manual_seed(0)
    shape = (dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64) if model_type == "distilbert" else
             dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64))
    if model_type == "electra":
        shape["embedding_size"] = 16  # ELECTRA's embedding projection
    config = transformers.AutoConfig.for_model(model_type, vocab_size=50, max_position_embeddings=40, **shape, **extra)
    model = getattr(transformers, cls).from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def inputs():
    import torch

    ids = torch.tensor([[3, 7, 9, 11, 30, 4, 1, 1], [3, 5, 6, 8, 12, 19, 25, 4]])
    return {"input_ids": ids, "attention_mask": (ids != 1).long()}


def masked_copy(model, heads: dict[int, list[int]]):
    """The unpruned model with HEADS silenced: their columns of the attention output projection zeroed."""
    import torch

    masked = copy.deepcopy(model)
    layout = layout_of(model.config.model_type, "prune")
    for index, ids in heads.items():
        layer = Layout.get(masked.base_model, layout.layers)[index]
        size = Layout.get(layer, layout.head_dim)
        with torch.no_grad():
            for h in ids:
                Layout.get(layer, layout.attn_out).weight[:, h * size:(h + 1) * size] = 0
    return masked


def hidden(model):
    import torch

    with torch.no_grad():
        return model(**inputs()).last_hidden_state.numpy()


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("model_type", ["bert", "roberta", "xlm-roberta", "camembert", "electra", "distilbert"])
def test_pruning_equals_masking(model_type, attn):
    """Slicing the heads' rows and columns computes what the unpruned model computes with those heads'
    output columns zeroed, and the shapes, head counts and config record say what was removed."""
    model = tiny(model_type, attn_implementation=attn)
    want = hidden(masked_copy(model, HEADS))
    assert not np.allclose(hidden(model), want, atol=1e-4)  # the masked heads do contribute
    pruned_heads.prune_heads(model, HEADS)
    np.testing.assert_allclose(hidden(model), want, atol=1e-5)
    layout = layout_of(model_type, "prune")
    layers = Layout.get(model.base_model, layout.layers)
    for index, left in ((0, 3), (1, 1)):
        layer = layers[index]
        assert Layout.get(layer, layout.heads) == left
        width = left * Layout.get(layer, layout.head_dim)
        for path in (layout.attn_query, layout.attn_key, layout.attn_value):
            assert Layout.get(layer, path).out_features == width
        assert Layout.get(layer, layout.attn_out).in_features == width
        attention = Layout.get(layer, layout.heads.rpartition(".")[0])
        assert getattr(attention, "all_head_size", width) == width
    assert model.config.pruned_heads == HEADS


def test_pruning_again_counts_original_ids():
    """A second call names heads by their original ids, as transformers 4's prune_heads did; the record
    is their union and the model equals the one with all of them masked."""
    model = tiny("bert")
    want = hidden(masked_copy(model, {0: [0, 1, 3]}))
    pruned_heads.prune_heads(model, {0: [1]})
    assert pruned_heads.current_head_ids(model, 0) == [0, 2, 3]
    pruned_heads.prune_heads(model, {0: [0, 3, 1]})  # 1 is gone already: ignored
    assert model.config.pruned_heads == {0: [0, 1, 3]}
    assert pruned_heads.current_head_ids(model, 0) == [2]
    np.testing.assert_allclose(hidden(model), want, atol=1e-5)


def test_refuses_what_it_cannot_prune():
    model = tiny("bert")
    with pytest.raises(InputError, match="would leave no attention head"):
        pruned_heads.prune_heads(model, {1: [0, 1, 2, 3]})
    assert pruned_heads.recorded(model.config) == {}  # nothing half-done
    # MPNet's layers share one per-head position bias: a head goes from every layer or from none
    with pytest.raises(InputError, match="prune the same heads in every layer"):
        pruned_heads.prune_heads(tiny("mpnet"), {0: [1]})


@pytest.mark.parametrize("model_type", ["bert", "distilbert", "roberta"])
def test_save_load_round_trip(model_type, tmp_path):
    """Per-layer head counts saved with save_pretrained: config.json records the original ids under the
    key and JSON shape transformers 4 wrote, and the loader rebuilds the same tensors and outputs, in a
    task model too (the classifier head loads as well)."""
    import torch
    import transformers

    model = tiny(model_type, cls="AutoModelForSequenceClassification", num_labels=3)
    pruned_heads.prune_heads(model, HEADS)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["pruned_heads"] == {"0": [1], "1": [0, 2, 3]}
    loaded = pruned_heads.from_pretrained(transformers.AutoModelForSequenceClassification, tmp_path).eval()
    assert pruned_heads.recorded(loaded.config) == HEADS
    want, got = model.state_dict(), loaded.state_dict()
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    with torch.no_grad():
        np.testing.assert_array_equal(loaded(**inputs()).logits.numpy(), model(**inputs()).logits.numpy())
    # saved again from the loaded model: the same record (no double counting)
    loaded.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text())["pruned_heads"] == {"0": [1], "1": [0, 2, 3]}
    # the base model loads from the task checkpoint, as from_pretrained would (its head dropped)
    base = pruned_heads.from_pretrained(transformers.AutoModel, tmp_path, attn_implementation="eager")
    assert base.config._attn_implementation == "eager"
    np.testing.assert_allclose(hidden(base.eval()), hidden(model.base_model), atol=1e-5)  # eager vs sdpa rounding


def test_unpruned_checkpoint_has_no_key(tmp_path):
    """A model with nothing pruned (or a plan that keeps every head) saves no pruned_heads key, as before."""
    model = tiny("bert")
    pruned_heads.store(model.config, {0: [], 1: []})
    model.save_pretrained(tmp_path)
    assert "pruned_heads" not in json.loads((tmp_path / "config.json").read_text())


@pytest.mark.parametrize("name", ["bert", "distilbert"])
def test_checkpoint_pruned_by_transformers_4_loads(name):
    """Checkpoints transformers 4.57's prune_heads + save_pretrained wrote (tests/fixtures/pruned_tf457/make.py):
    the same config key and tensor names load, and compute the logits 4.57 computed."""
    import torch
    import transformers

    folder = FIXTURES / name
    expected = np.load(folder / "expected.npz")
    model = pruned_heads.from_pretrained(transformers.AutoModelForSequenceClassification, folder).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(expected["input_ids"]),
                       attention_mask=torch.from_numpy(expected["attention_mask"])).logits.numpy()
    np.testing.assert_allclose(logits, expected["logits"], atol=1e-5)
    recorded = json.loads((folder / "config.json").read_text())["pruned_heads"]
    assert {str(k): v for k, v in pruned_heads.recorded(model.config).items()} == recorded


def test_loading_is_strict(tmp_path):
    """A config.json whose pruned_heads does not match the tensors, or a checkpoint lacking a tensor,
    is refused in one line (from_pretrained would re-initialise such tensors at random)."""
    import transformers
    from safetensors.torch import load_file, save_file

    model = tiny("bert", cls="AutoModelForSequenceClassification")
    pruned_heads.prune_heads(model, HEADS)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["pruned_heads"] = {"0": [1, 2], "1": [0, 2, 3]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    cls = transformers.AutoModelForSequenceClassification
    with pytest.raises(InputError, match=r"does not match its config.json .*shape differs.*attention.self.key.weight \[24, 32\] \(model \[16, 32\]\)"):
        pruned_heads.from_pretrained(cls, tmp_path)
    with pytest.raises(InputError, match="does not match the weights"):  # the meta-device check, before any pass
        validate.check_config_matches_weights(tmp_path, "text-classification", validate.check_weights(tmp_path))
    config["pruned_heads"] = {"0": [1], "1": [0, 2, 3]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    validate.check_config_matches_weights(tmp_path, "text-classification", validate.check_weights(tmp_path))
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["bert.encoder.layer.1.attention.self.key.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(InputError, match="lacks 1 tensor.*layer.1.attention.self.key.weight"):
        pruned_heads.from_pretrained(cls, tmp_path)
