"""distill: loss values by hand, the gap to the teacher shrinks, resume after an interruption, the time
budget (fake clock), seeded determinism, the recipe and the chain, bad input (exit 2)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from harden_helpers import assert_distill_refuses
from helpers import make_ctx, run_cli, run_pass, train_tiny_classifier

from xformopt.errors import InputError
from xformopt.passes import get_pass
from xformopt.passes.distill import data as D
from xformopt.passes.distill import losses as L
from xformopt.passes.distill import student as S
from xformopt.passes.distill import train as T

# Small and quick: 128 training rows, 32 evaluation rows, short inputs.
FAST = dict(train_samples=128, eval_samples=32, max_length=48, batch_size=16, patience=0, checkpoint_every=0, epochs=50)


def torch_():
    import torch

    return torch


@pytest.fixture(scope="module")
def teacher_classifier(tmp_path_factory, tiny_classifier) -> Path:
    """The tiny classifier trained for a few seconds on the vendored train split: its layers now matter
    (a random tiny model barely changes when a layer is dropped), so there is a real gap to close."""
    return train_tiny_classifier(tiny_classifier, tmp_path_factory.mktemp("teacher") / "teacher", 960)


@pytest.fixture(scope="module")
def teacher_encoder(tmp_path_factory, teacher_classifier) -> Path:
    """The trained tiny classifier's encoder alone: a feature-extraction model whose layers matter."""
    from transformers import BertModel

    out = tmp_path_factory.mktemp("teacher-enc") / "encoder"
    BertModel.from_pretrained(teacher_classifier, add_pooling_layer=False).save_pretrained(out)
    for item in teacher_classifier.iterdir():
        if not (out / item.name).exists() and item.name not in ("config.json", "model.safetensors"):
            shutil.copy2(item, out / item.name)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertModel"]
    return out


def distill(ctx, src, dst, **options) -> dict:
    return run_pass("distill", ctx, src, dst, **{**FAST, **options})


def weights_bytes(folder: Path) -> bytes:
    return (folder / "model.safetensors").read_bytes()


# --------------------------------------------------------------------------- losses, by hand


def test_soft_kl_matches_hand_computation():
    torch = torch_()
    s, t, temp = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]]), 2.0
    # softmax at T=2: student [e^.5, 1]/(e^.5 + 1), teacher [1, e^.5]/(1 + e^.5)
    z = math.exp(0.5) + 1
    ps, pt = [math.exp(0.5) / z, 1 / z], [1 / z, math.exp(0.5) / z]
    kl = sum(p * (math.log(p) - math.log(q)) for p, q in zip(pt, ps))
    assert float(L.soft_kl(s, t, temp)) == pytest.approx(temp ** 2 * kl, rel=1e-6)
    assert float(L.soft_kl(t, t, temp)) == pytest.approx(0.0, abs=1e-7)
    # mean over the batch: a second identical row leaves the value unchanged
    assert float(L.soft_kl(s.repeat(2, 1), t.repeat(2, 1), temp)) == pytest.approx(temp ** 2 * kl, rel=1e-6)


def test_hard_ce_mse_cosine_by_hand():
    torch = torch_()
    assert float(L.hard_ce(torch.tensor([[2.0, 0.0]]), torch.tensor([1]))) == pytest.approx(math.log(1 + math.e ** 2))
    assert float(L.embedding_mse(torch.tensor([[1.0, 2.0]]), torch.tensor([[0.0, 0.0]]))) == pytest.approx(2.5)
    assert float(L.embedding_cosine(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]]))) == pytest.approx(1.0)
    s, t = torch.tensor([[1.0, 1.0], [2.0, 0.0]]), torch.tensor([[1.0, 0.0], [3.0, 0.0]])
    assert float(L.embedding_cosine(s, t)) == pytest.approx(((1 - 1 / math.sqrt(2)) + 0.0) / 2)


def test_hidden_mse_masks_padding_and_averages_pairs():
    torch = torch_()
    mask = torch.tensor([[1, 0]])  # one real token, one pad
    s1 = torch.tensor([[[1.0, 1.0], [9.0, 9.0]]])  # the pad position differs wildly: must not count
    s2 = torch.tensor([[[2.0, 0.0], [5.0, 5.0]]])
    zero = torch.zeros(1, 2, 2)
    # pair 1: (1 + 1) / (1 token x 2 units) = 1; pair 2: (4 + 0) / 2 = 2; mean over pairs 1.5
    assert float(L.hidden_mse([s1, s2], [zero, zero], mask)) == pytest.approx(1.5)
    assert float(L.hidden_mse([s1], [s1.clone()], mask)) == 0.0


def test_attention_mse_head_average_and_mask():
    torch = torch_()
    mask = torch.tensor([[1, 1, 0]])
    s = torch.zeros(1, 2, 3, 3)
    s[0, 0, 0, 0] = 1.0  # head 0 only: head average 0.5 at (0, 0)
    s[0, :, 2, 2] = 7.0  # a padded position: ignored
    t = torch.zeros(1, 4, 3, 3)  # another head count: compared through the head average
    # one differing entry of 0.5 among 2 x 2 real (query, key) pairs: 0.25 / 4
    assert float(L.attention_mse([s], [t], mask)) == pytest.approx(0.25 / 4)


def test_weights_and_combination():
    torch = torch_()
    w = L.weights_for("logits", True, alpha=0.7, mse_weight=1, cosine_weight=1, hidden_weight=0,
                      attention_weight=0)
    assert w == pytest.approx({"soft_kl": 0.7, "hard_ce": 0.3})
    assert L.weights_for("logits", False, alpha=0.7, mse_weight=1, cosine_weight=1, hidden_weight=2,
                         attention_weight=0) == {"soft_kl": 1.0, "hidden_mse": 2.0}
    assert L.weights_for("embedding", False, alpha=0.5, mse_weight=0, cosine_weight=1, hidden_weight=0,
                         attention_weight=0) == {"embedding_cosine": 1.0}
    total = L.combine({"soft_kl": torch.tensor(2.0), "hard_ce": torch.tensor(4.0)}, w)
    assert float(total) == pytest.approx(0.7 * 2 + 0.3 * 4)


# --------------------------------------------------------------------------- layers, batches, schedule


def test_layer_choice_and_default_map():
    assert S.evenly_spaced(6, 3) == [0, 2, 5] and S.evenly_spaced(6, 2) == [0, 5] and S.evenly_spaced(6, 1) == [5]
    assert S.choose_layers(6, None, None, default_half=True) == [0, 2, 5]
    assert S.choose_layers(6, None, None, default_half=False) is None
    assert S.choose_layers(6, None, [4, 1], default_half=False) == [1, 4]
    with pytest.raises(InputError):
        S.choose_layers(6, None, [6], default_half=False)
    assert S.default_layer_map([0, 2, 5], 3, 6) == [1, 3, 6]  # where each student layer came from
    assert S.default_layer_map(None, 3, 6) == [2, 4, 6]  # unknown origins: uniform


def test_epoch_batches_seeded_and_complete():
    lengths = np.random.default_rng(0).integers(3, 40, size=1000)
    a, b = D.epoch_batches(lengths, 32, 0, 1), D.epoch_batches(lengths, 32, 0, 1)
    assert all((x == y).all() for x, y in zip(a, b))
    assert sorted(np.concatenate(a).tolist()) == list(range(1000))
    assert len(a) == D.steps_per_epoch(1000, 32)
    assert not all((x == y).all() for x, y in zip(a, D.epoch_batches(lengths, 32, 0, 2)))
    spread = np.mean([np.ptp(lengths[x]) for x in a])
    assert spread < np.ptp(lengths) / 4  # length-bucketed: little padding


def test_lr_schedule():
    assert T.lr_at(0, 1.0, 4, 20) == pytest.approx(0.25)
    assert T.lr_at(3, 1.0, 4, 20) == pytest.approx(1.0)
    assert T.lr_at(12, 1.0, 4, 20) == pytest.approx(0.5)
    assert T.lr_at(20, 1.0, 4, 20) == 0.0


# --------------------------------------------------------------------------- it learns


def test_distillation_reduces_the_gap(teacher_classifier, sample_texts, tmp_path):
    """Distill is the first torch pass: the student is the teacher with one of its two layers dropped.
    Its KL to the teacher on held-out rows falls and its agreement rises."""
    ctx = make_ctx(teacher_classifier, sample_texts)
    rec = distill(ctx, teacher_classifier, tmp_path / "d", label_column="", select="kl_to_teacher", max_steps=40,
                  eval_every=10, lr=1e-3)
    assert rec["student"]["source"].startswith("cut from the teacher") and rec["student"]["layers"] == 1
    before, after = rec["quality"]["before"], rec["quality"]["after"]
    assert after["kl_to_teacher"] < 0.5 * before["kl_to_teacher"]
    assert after["agreement"] >= before["agreement"]
    assert rec["losses"]["weights"] == {"soft_kl": 1.0}  # no labels: soft targets only
    assert [e["step"] for e in rec["evaluations"]] == [0, 10, 20, 30, 40]
    assert rec["training"]["stopped_because"] == "steps"
    assert (tmp_path / "d" / rec["curve"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and (tmp_path / "d" / "tokenizer.json").is_file()
    from xformopt.artifact import is_run_output

    assert is_run_output(rec["curve"])  # a later stage does not carry the plot along


def test_embedding_distillation_raises_cosine(teacher_encoder, sample_texts, tmp_path):
    """No labels at all: the layer-dropped student's embeddings move towards the teacher's."""
    ctx = make_ctx(teacher_encoder, sample_texts)
    rec = distill(ctx, teacher_encoder, tmp_path / "d", max_steps=30, eval_every=10, lr=2e-3, hidden_weight=1.0)
    assert rec["selection"]["metric"] == "cosine"
    before, after = rec["quality"]["before"], rec["quality"]["after"]
    assert 1 - after["cosine"] < 0.5 * (1 - before["cosine"]) and after["mse"] < before["mse"]
    assert set(rec["losses"]["weights"]) == {"embedding_mse", "embedding_cosine", "hidden_mse"}
    assert rec["losses"]["layer_map"] == [2]  # the student kept teacher layer 1 (0-based): hidden state 2
    assert rec["data"]["teacher_outputs"]["mode"] == "cached" and rec["data"]["train"]["labelled"] is False


def test_hidden_transfer_online_when_over_the_cache_budget(tiny_encoder, sample_texts, tmp_path):
    ctx = make_ctx(tiny_encoder, sample_texts)
    rec = distill(ctx, tiny_encoder, tmp_path / "d", max_steps=4, hidden_weight=1.0, attention_weight=1.0,
                  teacher_cache_mb=0)
    assert rec["data"]["teacher_outputs"]["mode"] == "online"
    assert rec["evaluations"][-1]["train_terms"].keys() >= {"hidden_mse", "attention_mse"}


# --------------------------------------------------------------------------- determinism, resume, time


def test_same_seed_same_weights(teacher_classifier, sample_texts, tmp_path):
    ctx = make_ctx(teacher_classifier, sample_texts)
    opts = dict(max_steps=12, eval_every=6, select="kl_to_teacher")
    a = distill(ctx, teacher_classifier, tmp_path / "a", **opts)
    b = distill(ctx, teacher_classifier, tmp_path / "b", **opts)
    c = distill(ctx, teacher_classifier, tmp_path / "c", **opts, seed=1)
    assert a["selection"]["best_step"] > 0 and b["data"]["teacher_outputs"]["reused_from_disk"]
    assert a["weights_sha256"] == b["weights_sha256"] != c["weights_sha256"]
    assert weights_bytes(tmp_path / "a") == weights_bytes(tmp_path / "b")
    assert [e.get("train_loss") for e in a["evaluations"]] == [e.get("train_loss") for e in b["evaluations"]]


@pytest.mark.parametrize("how", ["ctrl-c", "crash"])
def test_resume_after_interruption_reaches_the_same_weights(teacher_classifier, sample_texts, tmp_path,
                                                            monkeypatch, how):
    """Ctrl-C finishes the step and writes a checkpoint; a crash leaves the last periodic one. Rerunning
    resumes there and ends with exactly the weights of an uninterrupted run."""
    ctx = make_ctx(teacher_classifier, sample_texts)
    opts = dict(max_steps=16, eval_every=4, checkpoint_every=4, checkpoint_dir=str(tmp_path / "ckpt"),
                select="kl_to_teacher")
    full = distill(ctx, teacher_classifier, tmp_path / "full", **{**opts, "checkpoint_dir": str(tmp_path / "c0")})
    assert not (tmp_path / "c0").exists()  # removed when the pass finished

    def stop(step, trainer):
        if step == 7:
            if how == "ctrl-c":
                trainer.interrupt_requested = True  # what the SIGINT handler does
            else:
                raise RuntimeError("simulated crash")

    monkeypatch.setattr(T, "ON_STEP", stop)
    with pytest.raises(KeyboardInterrupt if how == "ctrl-c" else RuntimeError):
        distill(ctx, teacher_classifier, tmp_path / "first", **opts)
    state = json.loads((tmp_path / "ckpt" / "current" / "state.json").read_text())
    assert state["step"] == (7 if how == "ctrl-c" else 4)
    monkeypatch.setattr(T, "ON_STEP", None)
    resumed = distill(ctx, teacher_classifier, tmp_path / "second", **opts)
    assert resumed["training"]["resumed_from_step"] == state["step"]
    assert resumed["weights_sha256"] == full["weights_sha256"]
    assert weights_bytes(tmp_path / "second") == weights_bytes(tmp_path / "full")
    assert [e["step"] for e in resumed["evaluations"]] == [e["step"] for e in full["evaluations"]]


def test_checkpoint_of_another_run_is_ignored(teacher_classifier, sample_texts, tmp_path, monkeypatch):
    ctx = make_ctx(teacher_classifier, sample_texts)
    opts = dict(max_steps=8, eval_every=4, checkpoint_every=4, checkpoint_dir=str(tmp_path / "ckpt"))
    monkeypatch.setattr(T, "ON_STEP", lambda step, tr: setattr(tr, "interrupt_requested", step == 5))
    with pytest.raises(KeyboardInterrupt):
        distill(ctx, teacher_classifier, tmp_path / "a", **opts)
    monkeypatch.setattr(T, "ON_STEP", None)
    other = distill(ctx, teacher_classifier, tmp_path / "b", **{**opts, "temperature": 3.0})
    assert other["training"]["resumed_from_step"] is None
    fresh = distill(ctx, teacher_classifier, tmp_path / "c", **{**opts, "resume": False,
                                                                "checkpoint_dir": str(tmp_path / "c2")})
    assert fresh["training"]["resumed_from_step"] is None


def test_time_budget_stops_and_fits_the_schedule(teacher_classifier, sample_texts, tmp_path, monkeypatch):
    """A fake clock: every optimizer step costs 2 s and nothing else takes time. With one minute the
    horizon is re-planned to fit (the learning rate still decays to ~0) and the run stops on time."""
    now = [1000.0]
    monkeypatch.setattr(T, "CLOCK", lambda: now[0])
    monkeypatch.setattr(T, "ON_STEP", lambda step, tr: now.__setitem__(0, now[0] + 2.0))
    ctx = make_ctx(teacher_classifier, sample_texts)
    rec = distill(ctx, teacher_classifier, tmp_path / "d", epochs=20, max_minutes=1.0, eval_every=5)
    tr = rec["training"]
    assert tr["stopped_because"] == "time"
    assert tr["horizon"]["planned"] == 20 * tr["horizon"]["steps_per_epoch"]
    assert tr["horizon"]["replans"] and tr["horizon"]["final"] == tr["steps"]
    assert 25 <= tr["steps"] <= 30  # (60 s - 1 s reserve) / 2 s per step
    assert tr["seconds"]["total_with_teacher_pass"] <= 60.0


@pytest.mark.parametrize("in_budget", [True, False])
def test_the_teacher_pass_counts_in_the_budget_unless_told_not_to(teacher_classifier, sample_texts, tmp_path,
                                                                  monkeypatch, in_budget):
    """A fake clock: the teacher pass costs 30 s, every step 2 s. By default a one-minute budget leaves training
    about 30 s; with teacher_pass_in_budget off (a shape search: trials that read the teacher's outputs from disk
    train as long as the one that computed them) training gets the whole minute."""
    now = [1000.0]
    monkeypatch.setattr(T, "CLOCK", lambda: now[0])
    monkeypatch.setattr(T, "ON_STEP", lambda step, tr: now.__setitem__(0, now[0] + 2.0))
    real_pass = D.teacher_outputs

    def slow_teacher_pass(*args, **kwargs):
        now[0] += 15.0  # training rows and held-out rows: two calls, 30 s
        return real_pass(*args, **kwargs)

    monkeypatch.setattr(D, "teacher_outputs", slow_teacher_pass)
    ctx = make_ctx(teacher_classifier, sample_texts)
    rec = distill(ctx, teacher_classifier, tmp_path / "d", epochs=20, max_minutes=1.0, eval_every=5,
                  teacher_pass_in_budget=in_budget)
    tr = rec["training"]
    assert tr["stopped_because"] == "time"
    if in_budget:
        assert 10 <= tr["steps"] <= 15  # (60 s - 30 s - 1 s reserve) / 2 s per step
        assert tr["seconds"]["total_with_teacher_pass"] <= 60.0
    else:
        assert 25 <= tr["steps"] <= 30  # (60 s - 1 s reserve) / 2 s per step
        assert 80.0 <= tr["seconds"]["total_with_teacher_pass"] <= 90.0


def test_keep_last_returns_the_last_steps_weights_not_the_best(teacher_classifier, sample_texts, tmp_path):
    """A learning rate far too high makes the student worse than where it started: keep: best returns the
    step-0 student, keep: last the final one; each record's "after" is the evaluation of the weights saved."""
    ctx = make_ctx(teacher_classifier, sample_texts)
    opts = dict(max_steps=8, eval_every=4, select="kl_to_teacher", lr=0.5, label_column="")
    best = distill(ctx, teacher_classifier, tmp_path / "best", **opts)
    last = distill(ctx, teacher_classifier, tmp_path / "last", **opts, keep="last")
    assert [e["step"] for e in last["evaluations"]] == [0, 4, 8]
    assert best["selection"]["best_step"] == last["selection"]["best_step"] == 0  # the diverged steps are worse
    assert best["selection"]["kept_step"] == 0 and last["selection"]["kept_step"] == 8
    for rec in (best, last):
        kept = next(e for e in rec["evaluations"] if e["step"] == rec["selection"]["kept_step"])
        assert rec["quality"]["after"]["kl_to_teacher"] == kept["kl_to_teacher"]
        assert rec["reload_check"]["max_abs_diff"] < 1e-4  # the saved weights are the ones evaluated
    assert last["quality"]["after"]["kl_to_teacher"] > best["quality"]["after"]["kl_to_teacher"]
    assert weights_bytes(tmp_path / "best") != weights_bytes(tmp_path / "last")
    assert "kept the last step's weights" in get_pass("distill").summarize(last)


def test_early_stop_and_converged(teacher_classifier, sample_texts, tmp_path):
    ctx = make_ctx(teacher_classifier, sample_texts)
    common = dict(max_steps=12, eval_every=2, select="kl_to_teacher")
    early = distill(ctx, teacher_classifier, tmp_path / "a", **common, patience=1, min_delta=1.0)
    assert early["training"]["stopped_because"] == "early_stop" and early["training"]["steps"] == 2
    done = distill(ctx, teacher_classifier, tmp_path / "b", **common, stop_at=10.0)  # kl <= 10: reached at once
    assert done["training"]["stopped_because"] == "converged" and done["training"]["steps"] == 2


def test_time_budget_horizon_grows_back_after_a_slow_burst(teacher_classifier, sample_texts, tmp_path, monkeypatch):
    """The first 10 steps are slow (10 s each: another job on the machine), then 1 s each: the schedule is
    cut to fit, then restored to the full plan once the speed is back, and the run ends by its epochs."""
    now = [0.0]
    monkeypatch.setattr(T, "CLOCK", lambda: now[0])
    monkeypatch.setattr(T, "ON_STEP", lambda step, tr: now.__setitem__(0, now[0] + (10.0 if step <= 10 else 1.0)))
    ctx = make_ctx(teacher_classifier, sample_texts)
    rec = distill(ctx, teacher_classifier, tmp_path / "d", epochs=20, max_minutes=6.0, eval_every=40)
    tr = rec["training"]
    replans = tr["horizon"]["replans"]
    assert replans[0]["to"] < replans[0]["from"] and replans[-1]["to"] == tr["horizon"]["planned"]
    assert tr["stopped_because"] == "epochs" and tr["steps"] == tr["horizon"]["planned"]


# --------------------------------------------------------------------------- chains, recipe, CLI


def test_cli_prune_then_distill_finds_teacher_in_manifest(tiny_classifier, tmp_path, capsys):
    p, d = tmp_path / "p", tmp_path / "d"
    code, _, err = run_cli(["prune", tiny_classifier, "-o", p, "--layers", "1", "--ffn-dim", "64", "--no-latency",
                            "--samples", "16", "--target", "avx2"], capsys)
    assert code == 0, err
    code, out, err = run_cli(["distill", p, "-o", d, "--max-steps", "4", "--eval-every", "2", "--patience", "0",
                              "--keep", "last", "--select", "agreement"], capsys)
    assert code == 0, err
    assert out.startswith("distill: student 1 layers") and f"wrote {d}" in out
    manifest = json.loads((d / "manifest.json").read_text())
    assert [e["pass"] for e in manifest["passes"]] == ["prune", "distill"]
    rec = manifest["passes"][-1]["record"]
    assert rec["selection"]["keep"] == "last" and rec["selection"]["kept_step"] == 4
    assert manifest["passes"][-1]["options"]["select"] == "agreement"
    assert rec["teacher"]["path"] == str(tiny_classifier.resolve()) and "manifest.json" in rec["teacher"]["how"]
    kept = manifest["passes"][0]["record"]["kept_layers"]
    assert rec["student"]["origins"] == kept and rec["student"]["ffn_per_layer"] == [64]
    assert (d / "distill_curve.png").is_file()
    assert "xformopt: distill: eval at step 4" in err  # progress and evaluations go to stderr


def test_head_pruned_student_distills_with_attention_maps_and_drops_a_layer(tiny_classifier, sample_texts, tmp_path):
    """A head-pruned student (transformers 5 has no head pruning: xformopt.models.pruned_heads loads it) trains with
    the attention-map loss (eager attention, fewer heads than the teacher), drops a layer (config.pruned_heads
    re-keyed to the new numbering), and the saved folder reloads to the trained student (the pass checks)."""
    from xformopt.families import Layout
    from xformopt.models import pruned_heads

    ctx = make_ctx(tiny_classifier, sample_texts)
    pruned = run_pass("prune", ctx, tiny_classifier, tmp_path / "p", heads_per_layer=2, measure_latency=False,
                      samples=16, eval_samples=16)
    assert pruned["after"]["heads_per_layer"] == [2, 2] and set(pruned["pruned_heads"]) == {"0", "1"}
    rec = distill(ctx, tmp_path / "p", tmp_path / "d", teacher=str(tiny_classifier), keep_layers=[1], max_steps=4,
                  eval_every=2, hidden_weight=1.0, attention_weight=1.0)
    assert rec["evaluations"][-1]["train_terms"].keys() >= {"hidden_mse", "attention_mse"}
    assert rec["reload_check"]["max_abs_diff"] <= 1e-4
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["pruned_heads"] == {"0": pruned["pruned_heads"]["1"]}
    import transformers

    loaded = pruned_heads.from_pretrained(transformers.AutoModelForSequenceClassification, tmp_path / "d")
    assert [Layout.get(layer, "attention.self.num_attention_heads") for layer in loaded.bert.encoder.layer] == [2]


def test_recipe_prune_distill_export_chain(tiny_classifier, heldout_file, tmp_path):
    """prune -> distill -> export -> fuse through the pipeline: the teacher is the run's input model,
    the distilled stage exports, and the evaluation/training rows exclude the reported ones."""
    from xformopt import pipeline, recipe

    r = recipe.validate({
        "name": "tiny-prune-distill", "target": "avx2",
        "passes": [{"prune": {"layers": 1, "ffn_dim": 64, "measure_latency": False, "samples": 16, "eval_samples": 16}},
                   {"distill": {**FAST, "max_steps": 6, "eval_every": 3}}, "export", {"fuse": {"select": "all"}}],
        "evaluation": {"data": str(heldout_file), "limit": 8, "latency_rounds": 3, "warmup": 1, "repeats": 1},
    })
    result = pipeline.run(str(tiny_classifier), r, tmp_path / "out", use_cache=True)
    records = {p["pass"]: p["record"] for p in result.manifest["passes"]}
    assert records["distill"]["teacher"]["how"] == "the run's input model (recipe chain)"
    assert records["distill"]["student"]["origins"] == records["prune"]["kept_layers"]
    assert records["fuse"]["fused_kept"]["Attention"] == 1
    assert [s["name"] for s in result.report["stages"]] == ["pytorch", "prune", "distill", "export", "fuse"]
    assert not (tmp_path / "out" / "distill_curve.png").exists()  # plots stay with their stage


def test_shipped_recipe_prune_distill_int8():
    from xformopt import recipe

    r = recipe.load("prune-distill-int8")
    assert [s.name for s in r.passes] == ["prune", "distill", "export", "fuse", "quantize"]
    d = r.passes[1].options
    assert d["max_minutes"] and d["max_minutes"] <= 15
    assert set(d) == set(get_pass("distill").Options.model_fields)


def test_distill_after_export_is_rejected(exported_classifier, tmp_path, capsys):
    from xformopt import recipe

    with pytest.raises(InputError, match="'distill' cannot run after 'export'"):
        recipe.validate({"passes": ["export", "distill"]})
    code, _, err = run_cli(["distill", exported_classifier[0], "-o", tmp_path / "d"], capsys)
    assert code == 2 and "ONNX stage" in err


def test_registry_declares_torch_stage():
    cls = get_pass("distill")
    assert (cls.name, cls.stage, cls.consumes, cls.produces) == ("distill", "torch", "hf", "hf")


# --------------------------------------------------------------------------- bad input: one line, exit 2


@pytest.fixture(scope="module")
def other_vocab_teacher(tmp_path_factory, tokenizer_dir) -> Path:
    """A classifier whose tokenizer has another vocabulary (fewer word pieces)."""
    import torch
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        BertTokenizerFast,
    )

    directory = tmp_path_factory.mktemp("other-vocab")
    words = (tokenizer_dir / "vocab.txt").read_text().splitlines()[:200]
    (directory / "vocab.txt").write_text("\n".join(words) + "\n")
    BertTokenizerFast(vocab=str(directory / "vocab.txt"), do_lower_case=True).save_pretrained(directory)
    torch.manual_seed(3)
    config = BertConfig(vocab_size=len(words), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=128, num_labels=2,
                        id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    BertForSequenceClassification(config).save_pretrained(directory)
    return directory


def test_bad_input_exits_2(tiny_classifier, other_vocab_teacher, tiny_encoder, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"sentence": f"a fine film number {i}"}) + "\n" for i in range(40)))
    cases = [
        (["--teacher", tmp_path / "nope"], "teacher not found"),
        (["--teacher", other_vocab_teacher], "different vocabularies"),
        (["--teacher", tiny_encoder], "no sequence-classification head"),
        (["--train-data", texts, "--text-column", "review"], "column 'review' not found"),
        (["--train-data", empty], "has no rows"),
        (["--train-data", tmp_path / "missing.jsonl"], "data file not found"),
        (["--student-layers", "2"], "keep all 2 layers"),
    ]
    assert_distill_refuses(tiny_classifier, cases, tmp_path, capsys)


def test_unlabelled_text_file_trains_a_classifier_on_soft_targets(teacher_classifier, sample_texts, tmp_path):
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"sentence": t}) + "\n" for t in sample_texts[:48]))
    ctx = make_ctx(teacher_classifier, sample_texts[48:])
    rec = distill(ctx, teacher_classifier, tmp_path / "d", train_data=str(texts), max_steps=3)
    assert rec["data"]["train"]["labelled"] is False and rec["losses"]["weights"] == {"soft_kl": 1.0}
    assert rec["selection"]["metric"] == "agreement"  # no labels in the held-out part either
    assert rec["data"]["train"]["rows"] + rec["data"]["eval"]["rows"] == 48


def test_distilbert_student_cut_from_teacher_exports(tiny_distilbert, sample_texts, tmp_path):
    """DistilBERT names its layers differently (transformer.layer, n_layers): cut, trained, exported."""
    ctx = make_ctx(tiny_distilbert, sample_texts)
    rec = distill(ctx, tiny_distilbert, tmp_path / "d", max_steps=4, keep_layers=[0], hidden_weight=1.0)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["n_layers"] == 1 and rec["student"]["origins"] == [0] and rec["losses"]["layer_map"] == [1]
    export = run_pass("export", make_ctx(tmp_path / "d", sample_texts), tmp_path / "d", tmp_path / "e")
    assert export["parity"]["max_abs_diff"] < 1e-3


def test_help_has_an_example(capsys):
    code, out, _ = run_cli(["distill", "--help"], capsys)
    assert code == 0 and "Example" in out and "--max-minutes" in out
    code, out, _ = run_cli(["passes", "list", "--json"], capsys)
    row = next(r for r in json.loads(out) if r["name"] == "distill")
    assert row["stage"] == "torch" and "max_minutes" in row["options"] and "teacher" in row["options"]
