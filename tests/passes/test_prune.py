"""prune: structured pruning on tiny BERT-family models -- importance, rounding, a checkpoint xformopt's
loader reloads (transformers 5 has no head pruning: xformopt/models/pruned_heads.py), export + full fusion,
determinism, bad input and the ordering contract."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    LABELS,
    TINY,
    make_ctx,
    onnx_op_counts,
    run_cli,
    run_pass,
)
from tiny_students import byte_bpe_tokenizer

from xformopt.errors import InputError
from xformopt.passes import get_pass, surgery
from xformopt.passes.prune import flops as prune_flops
from xformopt.passes.prune import importance as prune_importance
from xformopt.passes.prune import importance_cache
from xformopt.passes.prune import plans as prune_plans
from xformopt.passes.prune import run as P

HEAD_DIM = TINY["hidden"] // TINY["heads"]
FAST = dict(measure_latency=False, samples=32, eval_samples=32, batch_size=16)


def load(path: Path, cls: str = "AutoModelForSequenceClassification"):
    """A checkpoint, head-pruned or not, as the passes load it (xformopt.models.pruned_heads.from_pretrained)."""
    import transformers

    from xformopt.models import pruned_heads

    return pruned_heads.from_pretrained(getattr(transformers, cls), path).eval()


def batches_for(path: Path, texts, labels=None):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    return prune_importance.make_batches(tok, texts, None, labels, 8, 64, {"input_ids", "attention_mask", "token_type_ids"})


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
    heads, ffn = prune_importance.taylor_importance(model, surgery.arch_for("bert"), batches_for(tiny_classifier, sample_texts[:32], labels),
                                     "logits", seed=0)
    assert heads[0][2] == 0 and all(heads[0][h] > 0 for h in (0, 1, 3))
    assert set(np.argsort(ffn[0], kind="stable")[:2]) == {5, 17}
    assert prune_plans.top(heads[0], 3) == [0, 1, 3]


def test_feature_extraction_probe_importance_finds_dead_head(tiny_encoder, sample_texts):
    """No labels: the embedding-MSE proxy (its second-order term, via probes) still scores a dead head 0."""
    import torch

    model = load(tiny_encoder, "AutoModel")
    with torch.no_grad():
        model.encoder.layer[1].attention.output.dense.weight[:, :HEAD_DIM] = 0
    heads, ffn = prune_importance.taylor_importance(model, surgery.arch_for("bert"), batches_for(tiny_encoder, sample_texts[:16]),
                                     "embedding", seed=0)
    assert heads[1][0] == 0 and min(heads[1][1:]) > 0
    assert all((f > 0).all() for f in ffn)


def test_magnitude_ranks_scaled_head_first(tiny_classifier):
    import torch

    model = load(tiny_classifier)
    with torch.no_grad():
        model.bert.encoder.layer[1].attention.output.dense.weight[:, 3 * HEAD_DIM:] *= 10
    heads, _, _ = prune_importance.magnitude_importance(model, surgery.arch_for("bert"))
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
        if (tiny_classifier / name).exists():  # transformers 5 writes no special_tokens_map.json
            (src / name).write_bytes((tiny_classifier / name).read_bytes())
    record = run_pass("prune", make_ctx(src, sample_texts), src, tmp_path / "out", heads_per_layer=3, **FAST)
    assert record["pruned_heads"]["0"] == [1]
    assert record["importance"]["method"] == "taylor" and record["importance"]["samples"] == 32
    assert record["after"]["heads_per_layer"] == [3, 3]


def test_taylor_scores_are_reused_for_the_same_model_and_sample_only(tiny_classifier, sample_texts, tmp_path):
    """A shape search's later trials read the teacher's importance from disk (the same scores, so the same cut);
    another model, another sample or another seed misses the cache and is scored afresh."""
    import shutil

    import torch

    ctx = make_ctx(tiny_classifier, sample_texts)
    first = run_pass("prune", ctx, tiny_classifier, tmp_path / "a", heads_per_layer=3, **FAST)
    again = run_pass("prune", ctx, tiny_classifier, tmp_path / "b", heads_per_layer=3, ffn_dim=32, **FAST)
    assert first["importance"]["reused_from_disk"] is False and again["importance"]["reused_from_disk"] is True
    assert again["pruned_heads"] == first["pruned_heads"]
    assert run_pass("prune", ctx, tiny_classifier, tmp_path / "c", heads_per_layer=3, **FAST, seed=1)[
        "importance"]["reused_from_disk"] is False
    fewer = make_ctx(tiny_classifier, sample_texts)
    assert run_pass("prune", fewer, tiny_classifier, tmp_path / "d", heads_per_layer=3, **{**FAST, "samples": 16})[
        "importance"]["reused_from_disk"] is False

    changed = tmp_path / "changed"
    shutil.copytree(tiny_classifier, changed)
    model = load(changed)
    with torch.no_grad():
        model.bert.encoder.layer[0].attention.output.dense.weight.mul_(1.5)
    model.save_pretrained(changed)
    dead = importance_cache.folder() / ".abc.npz.tmp-999999999-1"  # what a run killed while saving leaves
    dead.write_bytes(b"half")
    record = run_pass("prune", make_ctx(changed, sample_texts), changed, tmp_path / "e", heads_per_layer=3, **FAST)
    assert record["importance"]["reused_from_disk"] is False
    assert not dead.exists() and all(p.suffix == ".npz" for p in importance_cache.folder().iterdir())


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
    assert prune_flops.head_step(24, 16) == 2 and prune_flops.head_step(64, 16) == 1 and prune_flops.head_step(32, 16) == 1
    assert prune_flops.round_multiple(3, 16, 1, 128) == 16  # never rounds to nothing


def test_flops_formula():
    shape = prune_flops.Shape(hidden=64, head_dim=16, heads=[4, 2], ffn=[128, 128])
    flops = prune_flops.encoder_flops(shape, 10)
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
    from xformopt.passes.fuse.run import reached  # a one-head layer fuses into MultiHeadAttention (onnxscript)

    assert reached(lat["pruned_fused"], "Attention") == after["layers"]


# --------------------------------------------------------------------------- checkpoint


def test_checkpoint_round_trip_in_fresh_process(tiny_classifier, sample_texts, tmp_path):
    """Non-uniform heads (config.pruned_heads), a narrower FFN and a dropped layer: xformopt's loader
    loads it in a new process and computes what the in-memory pruned model computed -- which is also
    what the unpruned model computes with the removed units masked."""
    import torch

    arch = surgery.arch_for("bert")
    texts = sample_texts[:6]
    cases = {}
    for name, keep_layers, fraction in (("width", [0, 1], 0.6), ("depth", [1], 0.33)):
        model = load(tiny_classifier)
        heads, ffn, _ = prune_importance.magnitude_importance(model, arch)
        shape0 = surgery.current_shape(model, arch)
        target = fraction * prune_flops.encoder_flops(shape0, 128)["total"]
        plan = prune_plans.width_plan(heads, ffn, keep_layers, 0.75, shape0, 8, target, 128)
        plan.heads[keep_layers[0]] = [0, 2, 3]  # make heads per layer differ
        batches = batches_for(tiny_classifier, texts)
        masks = prune_importance.Masks(model, arch)
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
        surgery.apply_plan(model, arch, plan)
        with torch.no_grad():
            in_memory = model(**batches.encoded[0]).logits.numpy()
        np.testing.assert_allclose(in_memory, masked, atol=1e-5)
        out = tmp_path / name
        model.save_pretrained(out)
        for item in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
            if (tiny_classifier / item).exists():  # transformers 5 writes no special_tokens_map.json
                (out / item).write_bytes((tiny_classifier / item).read_bytes())
        config = json.loads((out / "config.json").read_text())
        assert config["num_hidden_layers"] == len(keep_layers) and config["intermediate_size"] == plan.ffn_width
        cases[name] = (out, in_memory)
    script = textwrap.dedent("""
        import json, sys, torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
        from xformopt.models.pruned_heads import from_pretrained
        texts = json.loads(sys.argv[1])
        result = {}
        for path in sys.argv[2:]:
            model = from_pretrained(AutoModelForSequenceClassification, path).eval()
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


def test_pruned_model_exports_and_fuses_fully(pruned_classifier, sample_texts, tmp_path, caplog):
    import torch

    pruned, record = pruned_classifier
    heads = record["after"]["heads_per_layer"]  # per layer: they may differ from layer to layer
    assert [layer.attention.self.num_attention_heads for layer in load(pruned).bert.encoder.layer] == heads
    ctx = make_ctx(pruned, sample_texts)
    assert ctx.spec.pruned == bool(record["pruned_heads"])
    assert min(heads) < max(record["before"]["heads_per_layer"])  # heads were pruned: attention is narrower
    run_pass("export", ctx, pruned, tmp_path / "e")
    with caplog.at_level(logging.WARNING):
        fused = run_pass("fuse", ctx, tmp_path / "e", tmp_path / "f", select="all")
    # narrower attention is what head pruning means: ORT's per-layer "Input hidden size ... is not same"
    # warning (which tells the user to fix an input that is right) is not shown
    assert not [r for r in caplog.records if "hidden size" in r.getMessage()]
    layers = record["after"]["layers"]
    assert fused["expected"] == {"Attention": layers, "SkipLayerNormalization": 2 * layers}
    counts = onnx_op_counts(tmp_path / "f" / "model.onnx")
    # a layer's attention fuses into Attention, or MultiHeadAttention where one head is left (onnxscript)
    assert counts["Attention"] + counts.get("MultiHeadAttention", 0) == layers
    assert counts["SkipLayerNormalization"] == 2 * layers
    import onnx

    graph = onnx.load(tmp_path / "f" / "model.onnx", load_external_data=False).graph
    fused_heads = [next(a.i for a in n.attribute if a.name == "num_heads") for n in graph.node
                   if n.op_type in ("Attention", "MultiHeadAttention")]
    assert fused_heads == heads  # each fused attention runs its own layer's head count
    from xformopt.runtime.encoder import OrtPredictor

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
    shape = prune_flops.Shape(hidden=64, head_dim=16, heads=[4, 4], ffn=[128, 128])
    full = prune_plans.Plan([0, 1], {0: [0, 1, 2, 3], 1: [0, 1, 2, 3]}, {0: list(range(128)), 1: list(range(128))}, 128)
    assert prune_plans.removes_nothing(full, shape)
    assert not prune_plans.removes_nothing(prune_plans.Plan([0], {0: [0, 1, 2, 3]}, {0: list(range(128))}, 128), shape)
    assert not prune_plans.removes_nothing(prune_plans.Plan([0, 1], {0: [0, 1, 2], 1: [0, 1, 2, 3]}, full.ffn, 128), shape)
    assert not prune_plans.removes_nothing(prune_plans.Plan([0, 1], full.heads, {0: list(range(64)), 1: list(range(64))}, 64), shape)
    for clipped in (dict(layers=99, ffn_dim=99999), dict(heads_per_layer=4), dict(layers=2), dict(ffn_dim=120)):
        with pytest.raises(InputError) as info:
            prune_plans.check_explicit_prunes(shape, P.PruneOptions(**clipped), 16)
        message = info.value.message
        assert message.startswith("nothing to prune: ") and "\n" not in message
        assert "2 layers, 4 heads per layer, FFN 128" in message
        assert message.endswith("ask for fewer heads/FFN/layers or sparsity > 0")
    assert "layers=99, ffn_dim=99999" in str(pytest.raises(
        InputError, prune_plans.check_explicit_prunes, shape, P.PruneOptions(layers=99, ffn_dim=99999), 16).value)
    for real in (dict(layers=1), dict(heads_per_layer=3), dict(ffn_dim=64), dict(layers=99, ffn_dim=64)):
        prune_plans.check_explicit_prunes(shape, P.PruneOptions(**real), 16)  # removes something: no error


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


@pytest.mark.parametrize(("config", "said"), [
    ({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 8}, "unsupported architecture 'gpt2' for pass 'prune'"),
    ({"model_type": "t5", "d_model": 8, "num_layers": 1, "num_heads": 2}, "is an encoder-decoder (t5)"),
], ids=["gpt2", "t5"])
def test_cli_unsupported_architecture_exit_2(tmp_path, capsys, config, said):
    model = tmp_path / config["model_type"]
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    code, _, err = run_cli(["prune", model, "-o", tmp_path / "p", "--sparsity", "0.5"], capsys)
    assert code == 2 and said in err
    assert not (tmp_path / "p").exists()
    with pytest.raises(InputError):
        surgery.arch_for(config["model_type"])


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
    assert r.passes[0].options["sparsity"] == 0.5 and r.passes[0].options["prefer"] == "balanced"


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


# --------------------------------------------------------------------------- choosing among candidates


def fake_plan(layers: int, heads: int, loss: float, ms: float | None = None, note: str | None = None) -> prune_plans.Plan:
    keep = list(range(layers))
    return prune_plans.Plan(keep, {i: list(range(heads)) for i in keep}, {i: [0] for i in keep}, 1,
                  note=note or f"{layers} layers, {heads} heads", sample_loss=loss, median_ms=ms)


def sentiment_like() -> list[prune_plans.Plan]:
    """Losses and latencies shaped like the MiniLM sentiment classifier's candidates at sparsity 0.5 (unpruned
    sample loss 0.33): every dropped layer is faster at equal FLOPs, and the deepest cut loses most."""
    return [fake_plan(6, 12, 0.4725, 3.97, "A"), fake_plan(6, 9, 0.4792, 3.96, "B"), fake_plan(5, 10, 0.4904, 3.77, "C"),
            fake_plan(4, 8, 0.4964, 3.58, "D"), fake_plan(3, 6, 0.5568, 3.25, "E")]


def test_loss_limit():
    assert prune_plans.loss_limit(0.33, 0.47, 0.25) == pytest.approx(0.33 + 1.25 * 0.14)
    assert prune_plans.loss_limit(0.33, 0.47, 0.0) == pytest.approx(0.47 * 1.02)  # never tighter than the 2% tie
    assert prune_plans.loss_limit(0.0, 0.01, 1.0) == pytest.approx(0.02)  # feature extraction: the unpruned MSE is 0
    assert prune_plans.loss_limit(0.5, 0.4, 0.25) == pytest.approx(0.408)  # a candidate better than unpruned: 2% of it


def test_balanced_takes_the_fastest_within_the_loss_limit():
    plans = sentiment_like()
    chosen, info = prune_plans.select_plan(plans, "balanced", base_loss=0.33, loss_tolerance=0.25, speed_tolerance=0.03)
    assert chosen.note == "D"  # E is faster still, but its loss is outside 0.33 + 1.25 x 0.1425
    assert info["qualified"] == ["A", "B", "C", "D"] and info["loss_limit"] == pytest.approx(0.508125)
    assert [p.qualified for p in plans] == [True, True, True, True, False]
    assert info["reason"].startswith("balanced: 4 of 5 candidates within the loss limit 0.5081")
    assert "fastest (3.580 ms)" in info["reason"]
    # A tighter tolerance leaves A and B, 0.3% apart in speed: a tie, which the lower loss wins.
    chosen, info = prune_plans.select_plan(plans, "balanced", base_loss=0.33, loss_tolerance=0.1, speed_tolerance=0.03)
    assert chosen.note == "A"
    assert "lowest sample loss (0.4725) among those within 3% of the fastest (B: 3.960 ms" in info["reason"]
    # No speed tolerance: B, the strictly fastest of the two.
    assert prune_plans.select_plan(plans, "balanced", 0.33, 0.1, 0.0)[0].note == "B"


def test_speed_and_accuracy_preferences():
    plans = sentiment_like()
    assert prune_plans.select_plan(plans, "speed", 0.33, 0.25, 0.03)[0].note == "E"
    plans[3].median_ms = 3.3  # D within 3% of E: the tie goes to the lower loss
    chosen, info = prune_plans.select_plan(plans, "speed", 0.33, 0.25, 0.03)
    assert chosen.note == "D" and info["qualified"] == list("ABCDE")
    chosen, info = prune_plans.select_plan(plans, "accuracy", 0.33, 0.25, 0.03)
    assert chosen.note == "A" and info["reason"] == "lowest sample loss 0.4725"
    # accuracy keeps the old rule: within 2% of the best loss, fewer layers first, whatever the timings say.
    near = [fake_plan(6, 12, 0.500, 1.0, "wide"), fake_plan(5, 12, 0.505, 9.0, "shallow")]
    chosen, info = prune_plans.select_plan(near, "accuracy", 0.3, 0.25, 0.03)
    assert chosen.note == "shallow" and "within 2% of the lowest sample loss" in info["reason"]


def test_untimed_balanced_counts_fewer_layers_as_faster():
    plans = [fake_plan(len(p.keep_layers), p.kept_heads, p.sample_loss, None, p.note) for p in sentiment_like()]
    chosen, info = prune_plans.select_plan(plans, "balanced", 0.33, 0.25, 0.03)
    assert chosen.note == "D" and info["speed_tolerance"] is None and "fewer layers" in info["speed_order"]
    plans.append(fake_plan(4, 6, 0.4950, None, "D2"))  # same depth as D: the lower loss wins
    assert prune_plans.select_plan(plans, "balanced", 0.33, 0.25, 0.03)[0].note == "D2"


def test_distinct_drops_repeated_plans():
    a, b, c = fake_plan(2, 4, 0.1), fake_plan(2, 4, 0.2), fake_plan(1, 4, 0.1)
    kept = prune_plans.distinct([a, b, c])
    assert len(kept) == 2 and kept[0] is a and kept[1] is c


@pytest.mark.parametrize("prefer", ["balanced", "speed"])
def test_pass_chooses_by_injected_latency(tiny_classifier, sample_texts, tmp_path, monkeypatch, prefer):
    """The pass records every candidate's loss and (here: fake) latency, and its choice is what the rule gives
    on those figures. The plan with the most layers and heads is made 'fastest' by far."""
    calls = []

    def fake_time_plans(ctx, model, arch, plans, tokenizer_dir, rounds):
        calls.append((len(plans), rounds, Path(tokenizer_dir)))
        for plan in plans:  # more heads kept = faster, 1 ms per head: far outside any speed tolerance
            plan.median_ms, plan.p90_ms, plan.fused_attention = 10.0 - plan.kept_heads, 9.9, len(plan.keep_layers)
        return {"unpruned_ms": {"median_ms": 20.0, "p90_ms": 25.0}, "what": "fake"}

    monkeypatch.setattr(P, "time_plans", fake_time_plans)
    record = run_pass("prune", make_ctx(tiny_classifier, sample_texts, target="avx2"), tiny_classifier, tmp_path / "p",
                      sparsity=0.5, prefer=prefer, time_candidates=True, candidate_rounds=7, **FAST)
    assert calls == [(len(record["candidates"]), 7, tiny_classifier)] and len(record["candidates"]) >= 3
    selection = record["selection"]
    assert selection["timed"] and selection["prefer"] == prefer and selection["timing"]["what"] == "fake"
    for c in record["candidates"]:
        assert {"plan", "layers", "heads", "ffn", "sample_loss", "loss_increase", "loss_se_vs_best", "qualified",
                "median_ms", "speedup_vs_unpruned"} <= set(c)
        assert c["speedup_vs_unpruned"] == round(20.0 / c["median_ms"], 3)
    plans = [fake_plan(c["layers"], 1, c["sample_loss"], c["median_ms"], c["plan"]) for c in record["candidates"]]
    defaults = P.PruneOptions(sparsity=0.5)
    want, _ = prune_plans.select_plan(plans, prefer, selection["unpruned_sample_loss"], defaults.loss_tolerance,
                            defaults.speed_tolerance)
    assert record["chosen"] == want.note and selection["reason"]
    if prefer == "speed":
        chosen = next(c for c in record["candidates"] if c["plan"] == record["chosen"])
        assert chosen["heads"] == max(c["heads"] for c in record["candidates"])
    assert [c["plan"] for c in record["candidates"] if c["qualified"]] == selection["qualified"]


def test_pass_without_timing_is_deterministic_and_says_so(tiny_classifier, sample_texts, tmp_path, monkeypatch):
    """measure_latency off (what --no-latency gives) and time_candidates unset: nothing is exported for the
    choice; a timing failure falls back the same way and records the error."""
    monkeypatch.setattr(P, "time_plans", lambda *a, **k: pytest.fail("timed: time_candidates follows measure_latency"))
    ctx = make_ctx(tiny_classifier, sample_texts, target="avx2")
    record = run_pass("prune", ctx, tiny_classifier, tmp_path / "a", sparsity=0.5, **FAST)
    assert record["selection"]["timed"] is False and "fewer layers" in record["selection"]["speed_order"]
    assert all("median_ms" not in c for c in record["candidates"])

    def broken(*args, **kwargs):
        raise RuntimeError("exporter exploded")

    monkeypatch.setattr(P, "time_plans", broken)
    failed = run_pass("prune", ctx, tiny_classifier, tmp_path / "b", sparsity=0.5, time_candidates=True, **FAST)
    assert failed["selection"]["timing"] == {"error": "RuntimeError: exporter exploded"}
    assert failed["chosen"] == record["chosen"] and failed["weights_sha256"] == record["weights_sha256"]


def test_accuracy_preference_is_not_timed(tiny_classifier, sample_texts, tmp_path, monkeypatch):
    monkeypatch.setattr(P, "time_plans", lambda *a, **k: pytest.fail("prefer=accuracy must not time"))
    record = run_pass("prune", make_ctx(tiny_classifier, sample_texts, target="avx2"), tiny_classifier, tmp_path / "p",
                      sparsity=0.5, prefer="accuracy", time_candidates=True, **FAST)
    best = min(record["candidates"], key=lambda c: c["sample_loss"])
    assert record["selection"]["prefer"] == "accuracy" and not record["selection"]["timed"]
    assert record["chosen"] == best["plan"] or "within 2%" in record["selection"]["reason"]


def test_real_candidate_timing_record(pruned_classifier):
    """The module fixture times its candidates for real (measure_latency on): every one was exported and fused
    fully, and the record carries the medians (values not asserted: wall-clock)."""
    _, record = pruned_classifier
    selection = record["selection"]
    assert selection["timed"] and selection["prefer"] == "balanced"
    assert selection["timing"]["rounds"] == 128 and selection["timing"]["unpruned_fused_attention"] == TINY["layers"]
    for c in record["candidates"]:
        assert c["median_ms"] > 0 and c["fused_attention"] == c["layers"] and c["speedup_vs_unpruned"] > 0
    assert record["chosen"] in [c["plan"] for c in record["candidates"] if c["qualified"]]


@pytest.mark.parametrize("fixture", ["tiny_encoder", "tiny_distilbert"])
def test_real_candidate_timing_embeddings_and_distilbert(fixture, request, sample_texts, tmp_path):
    """Candidate timing for real on a feature-extraction model and on DistilBERT: every candidate (and the
    unpruned model) exports and fuses one Attention per layer, so none is timed unfused."""
    model = request.getfixturevalue(fixture)
    record = run_pass("prune", make_ctx(model, sample_texts, target="avx2"), model, tmp_path / "p", sparsity=0.5,
                      time_candidates=True, candidate_rounds=3, **FAST)
    selection = record["selection"]
    assert selection["timed"] and selection["timing"]["unpruned_fused_attention"] == TINY["layers"]
    assert len(record["candidates"]) > 1 and "latency" not in record
    for c in record["candidates"]:
        assert c["median_ms"] > 0 and c["fused_attention"] == c["layers"]


# --------------------------------------------------------------------------- other BERT-family encoders


@pytest.fixture(scope="module")
def bpe_tokenizer_dir(tmp_path_factory) -> Path:
    """A tiny byte-level BPE tokenizer of RoBERTa's kind (<s>=0, <pad>=1, </s>=2; no token_type_ids), trained on
    the vendored train split: no network (tests/tiny_students.py)."""
    directory = tmp_path_factory.mktemp("bpe")
    tokenizer = byte_bpe_tokenizer(directory)
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 0, 2)
    return directory


FAMILIES = ("roberta", "xlm-roberta", "camembert", "electra")


@pytest.fixture(scope="module", params=FAMILIES)
def tiny_family(request, tmp_path_factory, tokenizer_dir, bpe_tokenizer_dir) -> Path:
    """A tiny random classifier of each remaining BERT-like family, saved with save_pretrained.

    RoBERTa-style models (roberta, xlm-roberta, camembert) count positions from pad_token_id + 1, so 128 tokens
    need 130 position embeddings, and take a BPE tokenizer whose pad id is 1. ELECTRA gets a smaller embedding
    size than its hidden size (its embeddings_project layer) and the WordPiece tokenizer."""
    import torch
    import transformers

    family = request.param
    torch.manual_seed(3)
    common = dict(hidden_size=TINY["hidden"], num_hidden_layers=TINY["layers"], num_attention_heads=TINY["heads"],
                  intermediate_size=TINY["intermediate"], num_labels=2, id2label=LABELS,
                  label2id={v: k for k, v in LABELS.items()})
    if family == "electra":
        tokenizer = transformers.ElectraTokenizerFast(vocab=str(tokenizer_dir / "vocab.txt"), do_lower_case=True,
                                                      model_max_length=128)
        config = transformers.ElectraConfig(vocab_size=len(tokenizer), embedding_size=32, max_position_embeddings=128,
                                            **common)
    else:
        tokenizer = transformers.RobertaTokenizerFast.from_pretrained(bpe_tokenizer_dir)
        config_class = {"roberta": transformers.RobertaConfig, "xlm-roberta": transformers.XLMRobertaConfig,
                        "camembert": transformers.CamembertConfig}[family]
        config = config_class(vocab_size=len(tokenizer), max_position_embeddings=128 + 2, type_vocab_size=1,
                              pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                              eos_token_id=tokenizer.eos_token_id, **common)
    model = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    assert model.config.model_type == family
    directory = tmp_path_factory.mktemp(f"tiny-{family}")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def logits_of(model, path: Path, texts) -> np.ndarray:
    import inspect

    import torch
    from transformers import AutoTokenizer

    enc = AutoTokenizer.from_pretrained(path)(list(texts), padding=True, truncation=True, max_length=64,
                                              return_tensors="pt")
    accepts = set(inspect.signature(model.forward).parameters)
    with torch.no_grad():
        return model(**{k: v for k, v in enc.items() if k in accepts}).logits.numpy()


def test_family_masked_pruned_and_reloaded_agree(tiny_family, sample_texts, tmp_path):
    """Per family: non-uniform heads, a narrower FFN and a dropped layer. The unpruned model with those units
    masked, the pruned model in memory, and the saved checkpoint loaded by xformopt's loader (which refuses
    missing, unexpected or resized weights) compute the same logits."""
    import torch

    model = load(tiny_family)
    arch = surgery.arch_for(model.config.model_type)
    heads, ffn, _ = prune_importance.magnitude_importance(model, arch)
    shape0 = surgery.current_shape(model, arch)
    assert (shape0.num_layers, shape0.heads, shape0.ffn) == (2, [4, 4], [128, 128])
    target = 0.33 * prune_flops.encoder_flops(shape0, 128)["total"]
    plan = prune_plans.width_plan(heads, ffn, [1], 0.75, shape0, 8, target, 128)
    plan.heads[1] = [0, 2, 3]
    texts = sample_texts[:6]
    masks = prune_importance.Masks(model, arch)
    for i in range(2):
        masks.head[i], masks.ffn[i] = torch.zeros(4), torch.zeros(128)
        if i in plan.keep_layers:
            masks.head[i][plan.heads[i]] = 1
            masks.ffn[i][plan.ffn[i]] = 1
    masks.skip([0])
    masked = logits_of(model, tiny_family, texts)
    masks.close()
    surgery.apply_plan(model, arch, plan)
    in_memory = logits_of(model, tiny_family, texts)
    np.testing.assert_allclose(in_memory, masked, atol=1e-5)
    out = tmp_path / "pruned"
    model.save_pretrained(out)
    for item in tiny_family.iterdir():
        if not (out / item.name).exists() and not item.name.endswith(".safetensors"):
            (out / item.name).write_bytes(item.read_bytes())
    loaded = load(out)
    assert loaded.config.num_hidden_layers == 1 and loaded.config.intermediate_size == plan.ffn_width
    assert loaded.config.pruned_heads == {"0": [1]} or loaded.config.pruned_heads == {0: [1]}
    np.testing.assert_allclose(logits_of(loaded.eval(), out, texts), in_memory, atol=1e-5)


def test_family_prune_pass_output_loads(tiny_family, sample_texts, tmp_path):
    """The pass end to end (Taylor, sparsity 0.5): the checkpoint loads (AutoModelForSequenceClassification
    through xformopt's loader) and scores the held-out rows exactly as the pass's in-memory model did."""
    from transformers import AutoTokenizer

    ctx = make_ctx(tiny_family, sample_texts, target="avx2")
    options = dict(sparsity=0.5, **FAST)
    record = run_pass("prune", ctx, tiny_family, tmp_path / "p", **options)
    assert abs(record["sparsity_achieved"]["at_reference"] - 0.5) < 0.1
    loaded = load(tmp_path / "p")
    assert loaded.config.model_type == ctx.spec.model_type
    assert loaded.config.num_hidden_layers == record["after"]["layers"]
    assert loaded.config.intermediate_size == record["after"]["ffn_per_layer"][0]
    arch = surgery.arch_for(loaded.config.model_type)
    assert surgery.current_shape(loaded, arch).heads == record["after"]["heads_per_layer"]
    _, held = P.load_sets(ctx, P.PruneOptions(**options), True)
    import inspect

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "p")
    batches = prune_importance.make_batches(tokenizer, held.texts, held.text_pairs, held.labels, 16, 128,
                             set(inspect.signature(loaded.forward).parameters))
    assert prune_importance.quality(loaded, batches, "logits", None) == record["quality_before_recovery"]["pruned"]


@pytest.mark.parametrize("tiny_family", ["roberta", "electra"], indirect=True)
def test_family_pruned_exports_and_fuses_fully(tiny_family, sample_texts, tmp_path):
    """RoBERTa (position offset, no token_type_ids) and ELECTRA (embedding projection), pruned with per-layer
    head counts: the export pass's parity check holds and every remaining layer fuses."""
    import torch

    record = run_pass("prune", make_ctx(tiny_family, sample_texts, target="avx2"), tiny_family, tmp_path / "p",
                      heads_per_layer=3, ffn_dim=64, **FAST)
    assert record["after"]["heads_per_layer"] == [3, 3] and record["pruned_heads"]
    pruned = tmp_path / "p"
    ctx = make_ctx(pruned, sample_texts)
    assert ctx.spec.pruned
    run_pass("export", ctx, pruned, tmp_path / "e")
    fused = run_pass("fuse", ctx, tmp_path / "e", tmp_path / "f", select="all")
    assert fused["expected"] == {"Attention": 2, "SkipLayerNormalization": 4}
    counts = onnx_op_counts(tmp_path / "f" / "model.onnx")
    # two SkipLayerNorms per layer; where the embeddings do not become EmbedLayerNormalization (RoBERTa's one
    # token-type row is a folded constant, not a Gather), their sum and norm fuse as one more SkipLayerNorm
    assert counts["Attention"] == 2 and counts["SkipLayerNormalization"] == 4 + (counts["EmbedLayerNormalization"] == 0)
    from xformopt.runtime.encoder import OrtPredictor

    onnx_model = OrtPredictor(ctx.spec, tmp_path / "f", threads=1)
    enc = onnx_model.tokenize(sample_texts[:3])
    model = load(pruned)
    with torch.no_grad():
        want = model(**{k: torch.from_numpy(v) for k, v in enc.items()}).logits.numpy()
    np.testing.assert_allclose(onnx_model.raw_outputs(enc), want, atol=1e-4)


@pytest.mark.parametrize("model_type", ["gpt2", "t5", "llama"])
def test_pass_refuses_other_architectures(tiny_classifier, sample_texts, tmp_path, model_type):
    """Whatever resolves a model (decoders now resolve for export/fuse/quantize), prune itself refuses a
    non-BERT family first, with one line naming the supported ones."""
    import dataclasses

    ctx = make_ctx(tiny_classifier, sample_texts)
    ctx = dataclasses.replace(ctx, spec=dataclasses.replace(ctx.spec, model_type=model_type))
    with pytest.raises(InputError) as info:
        run_pass("prune", ctx, tiny_classifier, tmp_path / "p", sparsity=0.5, **FAST)
    message = info.value.message
    assert message == (f"unsupported architecture {model_type!r} for pass 'prune': it takes encoders whose modules "
                       "it knows (bert, electra, roberta, xlm-roberta, camembert, distilbert, mpnet)")
    assert not any((tmp_path / "p").iterdir())  # refused before any work


def test_a_head_pruned_stage_passes_the_model_folder_checks(tiny_classifier, tmp_path, capsys):
    """Found with issue 21: a config with pruned_heads could not be built on the meta device
    (torch.nonzero), so `distill`/`export` of a head-pruned folder was refused as a broken config."""
    from xformopt.models import validate

    code, _, err = run_cli(["prune", tiny_classifier, "-o", tmp_path / "p", "--heads-per-layer", "1", "--no-latency",
                            "--samples", "16", "--target", "avx2"], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "p" / "config.json").read_text())["pruned_heads"]
    validate.check_model_files(tmp_path / "p", task="text-classification")  # no InputError
