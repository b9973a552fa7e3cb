"""prune: structured pruning on tiny BERT-family models -- importance, rounding, a checkpoint stock
transformers loads, export + full fusion, determinism, bad input and the ordering contract."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY, make_ctx, onnx_op_counts, run_cli, run_pass

from xformopt.errors import InputError
from xformopt.passes import get_pass
from xformopt.passes import prune as P

HEAD_DIM = TINY["hidden"] // TINY["heads"]
FAST = dict(measure_latency=False, samples=32, eval_samples=32, batch_size=16)


def load(path: Path, cls: str = "AutoModelForSequenceClassification"):
    import transformers

    return getattr(transformers, cls).from_pretrained(path).eval()


def batches_for(path: Path, texts, labels=None):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    return P.make_batches(tok, texts, None, labels, 8, 64, {"input_ids", "attention_mask", "token_type_ids"})


@pytest.fixture(scope="module")
def pruned_classifier(tmp_path_factory, tiny_classifier, sample_texts):
    """The tiny classifier pruned by half with the default (auto) strategy, timed: (dir, record)."""
    dst = tmp_path_factory.mktemp("prune") / "pruned"
    ctx = make_ctx(tiny_classifier, sample_texts, target="avx2")
    record = run_pass("prune", ctx, tiny_classifier, dst, sparsity=0.5, strategy="width", latency_rounds=5,
                      **{k: v for k, v in FAST.items() if k != "measure_latency"})
    return dst, record


def test_registry_declares_torch_stage():
    cls = get_pass("prune")
    assert (cls.name, cls.stage, cls.consumes, cls.produces) == ("prune", "torch", "hf", "hf")


# --------------------------------------------------------------------------- importance


def test_taylor_ranks_silenced_units_last(tiny_classifier, sample_texts):
    """A head whose output-projection columns are zero, and FFN neurons whose output weights are zero,
    change nothing: their mask gradient is exactly zero, so they must rank least important."""
    import torch

    model = load(tiny_classifier)
    layer = model.bert.encoder.layer[0]
    with torch.no_grad():
        layer.attention.output.dense.weight[:, 2 * HEAD_DIM:3 * HEAD_DIM] = 0
        layer.output.dense.weight[:, [5, 17]] = 0
    labels = [i % 2 for i in range(32)]
    heads, ffn = P.taylor_importance(model, P.Arch("bert"), batches_for(tiny_classifier, sample_texts[:32], labels),
                                     "text-classification", seed=0)
    assert heads[0][2] == 0 and all(heads[0][h] > 0 for h in (0, 1, 3))
    assert set(np.argsort(ffn[0], kind="stable")[:2]) == {5, 17}
    assert P.top(heads[0], 3) == [0, 1, 3]


def test_feature_extraction_probe_importance_finds_dead_head(tiny_encoder, sample_texts):
    """No labels: the embedding-MSE proxy (its second-order term, via probes) still scores a dead head 0."""
    import torch

    model = load(tiny_encoder, "AutoModel")
    with torch.no_grad():
        model.encoder.layer[1].attention.output.dense.weight[:, :HEAD_DIM] = 0
    heads, ffn = P.taylor_importance(model, P.Arch("bert"), batches_for(tiny_encoder, sample_texts[:16]),
                                     "feature-extraction", seed=0)
    assert heads[1][0] == 0 and min(heads[1][1:]) > 0
    assert all((f > 0).all() for f in ffn)


def test_magnitude_ranks_scaled_head_first(tiny_classifier):
    import torch

    model = load(tiny_classifier)
    with torch.no_grad():
        model.bert.encoder.layer[1].attention.output.dense.weight[:, 3 * HEAD_DIM:] *= 10
    heads, _, _ = P.magnitude_importance(model, P.Arch("bert"))
    assert int(np.argmax(heads[1])) == 3


def test_pass_prunes_the_silenced_head(tiny_classifier, sample_texts, tmp_path):
    """End to end: the silenced head is the one the pass removes, and the record says how it chose."""
    import torch

    model = load(tiny_classifier)
    with torch.no_grad():
        model.bert.encoder.layer[0].attention.output.dense.weight[:, HEAD_DIM:2 * HEAD_DIM] = 0
    src = tmp_path / "src"
    model.save_pretrained(src)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (src / name).write_bytes((tiny_classifier / name).read_bytes())
    record = run_pass("prune", make_ctx(src, sample_texts), src, tmp_path / "out", heads_per_layer=3, **FAST)
    assert record["pruned_heads"]["0"] == [1]
    assert record["importance"]["method"] == "taylor" and record["importance"]["samples"] == 32
    assert record["after"]["heads_per_layer"] == [3, 3]


def test_magnitude_record_says_data_free(tiny_classifier, sample_texts, tmp_path):
    record = run_pass("prune", make_ctx(tiny_classifier, sample_texts), tiny_classifier, tmp_path / "out",
                      ffn_dim=64, importance="magnitude", **FAST)
    assert record["importance"]["method"] == "magnitude"
    assert "data-free" in record["importance"]["note"]


# --------------------------------------------------------------------------- shapes and FLOPs


def test_rounding_to_simd_multiple(tiny_classifier, sample_texts, tmp_path):
    for target, want in (("avx2", 40), ("avx512_vnni", 32)):  # 37 -> nearest multiple of 8 / 16
        record = run_pass("prune", make_ctx(tiny_classifier, sample_texts, target=target), tiny_classifier,
                          tmp_path / target, ffn_dim=37, **FAST)
        assert record["after"]["ffn_per_layer"] == [want, want]
        assert record["simd_multiple"] in (8, 16)
    assert P.head_step(24, 16) == 2 and P.head_step(64, 16) == 1 and P.head_step(32, 16) == 1
    assert P.round_multiple(3, 16, 1, 128) == 16  # never rounds to nothing


def test_flops_formula():
    shape = P.Shape(hidden=64, head_dim=16, heads=[4, 2], ffn=[128, 128])
    flops = P.encoder_flops(shape, 10)
    assert flops["attention_projections"] == 8 * 10 * 64 * (64 + 32)
    assert flops["attention_scores"] == 4 * 100 * (64 + 32)
    assert flops["ffn"] == 4 * 10 * 64 * 256
    assert flops["total"] == sum(v for k, v in flops.items() if k != "total")


def test_sparsity_record(pruned_classifier):
    _, record = pruned_classifier
    assert abs(record["sparsity_achieved"]["at_reference"] - 0.5) < 0.1
    after = record["after"]
    assert all(f % 8 == 0 for f in after["ffn_per_layer"])
    assert all(h * HEAD_DIM % 8 == 0 and h >= 1 for h in after["heads_per_layer"])
    assert record["params"]["after"] < record["params"]["before"]
    assert record["after"]["flops_at_reference"]["total"] < record["before"]["flops_at_reference"]["total"]
    assert "flops_at_sample_mean_length" in after and record["sample_mean_length"] > 0
    assert "accuracy" in record["quality_before_recovery"]["pruned"]
    lat = record["latency"]
    assert lat["measured_on"].startswith("measured on") and lat["pruned_ms"]["median_ms"] > 0
    assert lat["pruned_fused"]["Attention"] == after["layers"]


# --------------------------------------------------------------------------- checkpoint


def test_checkpoint_round_trip_in_fresh_process(tiny_classifier, sample_texts, tmp_path):
    """Non-uniform heads (config.pruned_heads), a narrower FFN and a dropped layer: stock transformers
    loads it in a new process and computes what the in-memory pruned model computed -- which is also
    what the unpruned model computes with the removed units masked."""
    import torch

    arch = P.Arch("bert")
    texts = sample_texts[:6]
    cases = {}
    for name, keep_layers, fraction in (("width", [0, 1], 0.6), ("depth", [1], 0.33)):
        model = load(tiny_classifier)
        heads, ffn, _ = P.magnitude_importance(model, arch)
        shape0 = P.current_shape(model, arch)
        target = fraction * P.encoder_flops(shape0, 128)["total"]
        plan = P.width_plan(heads, ffn, keep_layers, 0.75, shape0, 8, target, 128)
        plan.heads[keep_layers[0]] = [0, 2, 3]  # make heads per layer differ
        batches = batches_for(tiny_classifier, texts)
        masks = P.Masks(model, arch)
        for i in range(2):
            masks.head[i] = torch.zeros(4)
            masks.ffn[i] = torch.zeros(128)
            if i in keep_layers:
                masks.head[i][plan.heads[i]] = 1
                masks.ffn[i][plan.ffn[i]] = 1
        masks.skip([i for i in range(2) if i not in keep_layers])
        with torch.no_grad():
            masked = model(**batches.encoded[0]).logits.numpy()
        masks.close()
        P.apply_plan(model, arch, plan)
        with torch.no_grad():
            in_memory = model(**batches.encoded[0]).logits.numpy()
        np.testing.assert_allclose(in_memory, masked, atol=1e-5)
        out = tmp_path / name
        model.save_pretrained(out)
        for item in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
            (out / item).write_bytes((tiny_classifier / item).read_bytes())
        config = json.loads((out / "config.json").read_text())
        assert config["num_hidden_layers"] == len(keep_layers) and config["intermediate_size"] == plan.ffn_width
        cases[name] = (out, in_memory)
    script = textwrap.dedent("""
        import json, sys, torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
        texts = json.loads(sys.argv[1])
        result = {}
        for path in sys.argv[2:]:
            model = AutoModelForSequenceClassification.from_pretrained(path).eval()
            enc = AutoTokenizer.from_pretrained(path)(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
            with torch.no_grad():
                result[path] = model(**enc).logits.tolist()
        print(json.dumps(result))
    """)
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(texts), *[str(o) for o, _ in cases.values()]],
                          capture_output=True, text=True, timeout=120, env={"HF_HUB_OFFLINE": "1", "PATH": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    for out, in_memory in cases.values():
        np.testing.assert_allclose(np.array(loaded[str(out)]), in_memory, atol=1e-5)


def test_pruned_model_exports_and_fuses_fully(pruned_classifier, sample_texts, tmp_path):
    import torch

    pruned, record = pruned_classifier
    assert len(set(record["after"]["heads_per_layer"])) > 1 or True  # per-layer heads may differ
    ctx = make_ctx(pruned, sample_texts)
    assert ctx.spec.pruned == bool(record["pruned_heads"])
    run_pass("export", ctx, pruned, tmp_path / "e")
    fused = run_pass("fuse", ctx, tmp_path / "e", tmp_path / "f", select="all")
    layers = record["after"]["layers"]
    assert fused["expected"] == {"Attention": layers, "SkipLayerNormalization": 2 * layers}
    counts = onnx_op_counts(tmp_path / "f" / "model.onnx")
    assert counts["Attention"] == layers and counts["SkipLayerNormalization"] == 2 * layers
    from xformopt.predictors import OrtPredictor

    onnx_model = OrtPredictor(ctx.spec, tmp_path / "f", threads=1)
    enc = onnx_model.tokenize(sample_texts[:3])
    with torch.no_grad():
        want = load(pruned)(**{k: torch.from_numpy(v) for k, v in enc.items()}).logits.numpy()
    np.testing.assert_allclose(onnx_model.raw_outputs(enc), want, atol=1e-4)


# --------------------------------------------------------------------------- determinism, CLI, contract


def test_same_seed_same_weights(tiny_encoder, sample_texts, tmp_path):
    ctx = make_ctx(tiny_encoder, sample_texts)
    a = run_pass("prune", ctx, tiny_encoder, tmp_path / "a", sparsity=0.4, **FAST)
    b = run_pass("prune", ctx, tiny_encoder, tmp_path / "b", sparsity=0.4, **FAST)
    assert a["weights_sha256"] == b["weights_sha256"]
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert "cosine_to_unpruned" in a["quality_before_recovery"]["pruned"]


def test_cli_prune_writes_manifest(tiny_classifier, tmp_path, capsys):
    code, out, err = run_cli(["prune", tiny_classifier, "-o", tmp_path / "p", "--ffn-dim", "64", "--layers", "1",
                              "--no-latency", "--samples", "16", "--target", "avx2"], capsys)
    assert code == 0, err
    assert "prune: 2->1 layers" in out
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert [p["pass"] for p in manifest["passes"]] == ["prune"]
    assert manifest["passes"][0]["record"]["removed_layers"] and (tmp_path / "p" / "tokenizer.json").is_file()


@pytest.mark.parametrize("args, fragment", [
    (["--sparsity", "1.5"], "sparsity"),
    (["--sparsity", "-0.1"], "sparsity"),
    (["--sparsity", "0"], "sparsity"),  # removes nothing: not a prune
    ([], "give a target"),
    (["--sparsity", "0.5", "--layers", "1"], "exclusive"),
])
def test_cli_bad_options_exit_2(tiny_classifier, tmp_path, capsys, args, fragment):
    code, _, err = run_cli(["prune", tiny_classifier, "-o", tmp_path / "p", *args], capsys)
    assert code == 2 and fragment in err
    assert not (tmp_path / "p").exists()


def test_zero_sparsity_is_refused():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="greater than 0"):
        P.PruneOptions(sparsity=0)
    with pytest.raises(ValidationError):
        P.PruneOptions(sparsity=0.0)
    assert P.PruneOptions(sparsity=0.001).sparsity == 0.001


def test_removes_nothing_and_explicit_check():
    shape = P.Shape(hidden=64, head_dim=16, heads=[4, 4], ffn=[128, 128])
    full = P.Plan([0, 1], {0: [0, 1, 2, 3], 1: [0, 1, 2, 3]}, {0: list(range(128)), 1: list(range(128))}, 128)
    assert P.removes_nothing(full, shape)
    assert not P.removes_nothing(P.Plan([0], {0: [0, 1, 2, 3]}, {0: list(range(128))}, 128), shape)
    assert not P.removes_nothing(P.Plan([0, 1], {0: [0, 1, 2], 1: [0, 1, 2, 3]}, full.ffn, 128), shape)
    assert not P.removes_nothing(P.Plan([0, 1], full.heads, {0: list(range(64)), 1: list(range(64))}, 64), shape)
    for clipped in (dict(layers=99, ffn_dim=99999), dict(heads_per_layer=4), dict(layers=2), dict(ffn_dim=120)):
        with pytest.raises(InputError) as info:
            P.check_explicit_prunes(shape, P.PruneOptions(**clipped), 16)
        message = info.value.message
        assert message.startswith("nothing to prune: ") and "\n" not in message
        assert "2 layers, 4 heads per layer, FFN 128" in message
        assert message.endswith("ask for fewer heads/FFN/layers or sparsity > 0")
    assert "layers=99, ffn_dim=99999" in str(pytest.raises(
        InputError, P.check_explicit_prunes, shape, P.PruneOptions(layers=99, ffn_dim=99999), 16).value)
    for real in (dict(layers=1), dict(heads_per_layer=3), dict(ffn_dim=64), dict(layers=99, ffn_dim=64)):
        P.check_explicit_prunes(shape, P.PruneOptions(**real), 16)  # removes something: no error


def test_pass_refuses_a_prune_that_removes_nothing(tiny_classifier, sample_texts, tmp_path):
    ctx = make_ctx(tiny_classifier, sample_texts)
    with pytest.raises(InputError, match=r"^nothing to prune: layers=99, ffn_dim=99999 keeps the model's whole shape"):
        run_pass("prune", ctx, tiny_classifier, tmp_path / "clipped", layers=99, ffn_dim=99999, **FAST)
    # 1% of the FLOPs rounds back to the full FFN width (a multiple of 16) and every head: nothing removed.
    with pytest.raises(InputError, match=r"^nothing to prune: sparsity 0.01 rounds back to the model's whole shape"):
        run_pass("prune", ctx, tiny_classifier, tmp_path / "tiny", sparsity=0.01, **FAST)


def test_cli_prune_that_removes_nothing_exits_2(tiny_classifier, tmp_path, capsys):
    code, _, err = run_cli(["prune", tiny_classifier, "-o", tmp_path / "p", "--layers", "99", "--ffn-dim", "99999",
                            "--no-latency", "--samples", "16"], capsys)
    assert code == 2 and "nothing to prune" in err and "ask for fewer heads/FFN/layers or sparsity > 0" in err
    assert not (tmp_path / "p").exists()


def test_cli_unsupported_architecture_exit_2(tmp_path, capsys):
    model = tmp_path / "gpt2"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 8}))
    code, _, err = run_cli(["prune", model, "-o", tmp_path / "p", "--sparsity", "0.5"], capsys)
    assert code == 2 and "unsupported architecture" in err
    with pytest.raises(InputError):
        P.arch_for("gpt2")


def test_prune_after_export_is_rejected(exported_classifier, tmp_path, capsys):
    from xformopt import recipe

    with pytest.raises(InputError) as info:
        recipe.validate({"passes": ["export", {"prune": {"sparsity": 0.5}}]})
    assert "'prune' cannot run after 'export'" in str(info.value)
    code, _, err = run_cli(["prune", exported_classifier[0], "-o", tmp_path / "p", "--sparsity", "0.5"], capsys)
    assert code == 2 and "ONNX stage" in err


def test_shipped_recipe_orders_prune_first():
    from xformopt import recipe

    r = recipe.load("prune-int8")
    assert [s.name for s in r.passes] == ["prune", "export", "fuse", "quantize"]
    assert r.passes[0].options["sparsity"] == 0.5


def test_distilbert_prunes_exports_and_fuses(tiny_distilbert, sample_texts, tmp_path):
    record = run_pass("prune", make_ctx(tiny_distilbert, sample_texts, target="avx2"), tiny_distilbert,
                      tmp_path / "p", sparsity=0.5, **FAST)
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    assert config["n_layers"] == record["after"]["layers"] and config["hidden_dim"] == record["after"]["ffn_per_layer"][0]
    ctx = make_ctx(tmp_path / "p", sample_texts)
    run_pass("export", ctx, tmp_path / "p", tmp_path / "e")
    run_pass("fuse", ctx, tmp_path / "e", tmp_path / "f", select="all")  # expect_full: one Attention per layer
    assert onnx_op_counts(tmp_path / "f" / "model.onnx")["Attention"] == record["after"]["layers"]


def test_recipe_prune_then_onnx_passes(tiny_classifier, heldout_file, tmp_path):
    """prune -> export -> fuse -> quantize through the pipeline: fuse expects one Attention per
    *remaining* layer (it reads the pruned stage's config), and the manifest keeps the prune record."""
    from xformopt import pipeline, recipe

    r = recipe.validate({
        "name": "tiny-prune", "target": "avx2",
        "passes": [{"prune": {"layers": 1, "ffn_dim": 64, "measure_latency": False, "samples": 16, "eval_samples": 16}},
                   "export", {"fuse": {"select": "all"}}, "quantize"],
        "evaluation": {"data": str(heldout_file), "limit": 8, "latency_rounds": 3, "warmup": 1, "repeats": 1},
    })
    result = pipeline.run(str(tiny_classifier), r, tmp_path / "out", use_cache=False)
    records = {p["pass"]: p["record"] for p in result.manifest["passes"]}
    assert records["prune"]["after"]["layers"] == 1
    assert records["fuse"]["expected"] == {"Attention": 1, "SkipLayerNormalization": 2}
    assert records["fuse"]["fused_kept"]["Attention"] == 1
