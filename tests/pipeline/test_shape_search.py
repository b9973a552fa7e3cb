"""The prune shape chosen per task: with --max-accuracy-drop a recipe's shape_search tries its shapes from
the fewest FLOPs up and keeps the first within the budget on the validation rows; the report lists what
was tried and why; without the flag the recipe's own shape runs; bad shape_search input exits 2."""

from __future__ import annotations

import json
import os

import pytest
from helpers import run_cli

from xformopt import api
from xformopt import recipe as recipes
from xformopt.errors import InputError
from xformopt.recipe_search import shapes

PRUNE = {"layers": 1, "ffn_dim": 32, "measure_latency": False, "samples": 16, "eval_samples": 16}
DISTILL = {"train_samples": 64, "eval_samples": 16, "max_length": 32, "batch_size": 16, "patience": 0,
           "checkpoint_every": 0, "max_steps": 2, "eval_every": 2, "label_column": "", "select": "agreement"}


def tiny_recipe(heldout_file, **search) -> dict:
    return {
        "name": "tiny-shapes", "target": "avx512_vnni",
        "passes": [{"prune": PRUNE}, {"distill": DISTILL}, "export", {"quantize": {"mode": "dynamic"}}],
        "evaluation": {"data": str(heldout_file), "limit": 8, "latency_rounds": 3, "warmup": 1, "repeats": 1},
        "shape_search": {"max_minutes": 30, "shapes": [{"layers": 2, "ffn_dim": 64}, {"layers": 1, "ffn_dim": 32}],
                         "order": "flops", **search},
    }


def test_flops_order():
    config = {"num_hidden_layers": 6, "num_attention_heads": 12, "hidden_size": 384, "intermediate_size": 1536}
    small = shapes.shape_flops(config, {"layers": 2, "heads_per_layer": 8, "ffn_dim": 512})
    big = shapes.shape_flops(config, {"layers": 3, "heads_per_layer": 12, "ffn_dim": 768})
    assert small < big < shapes.shape_flops(config, {})


def test_budget_keeps_the_cheapest_shape_within_it(tiny_classifier, heldout_file, tmp_path):
    """A budget every shape meets: the fewest-FLOPs shape is tried first and kept, the others are not run;
    the final artifact is that shape (its passes from the cache) and the report says why."""
    result = api.optimize(tiny_classifier, recipe=tiny_recipe(heldout_file), output=tmp_path / "out",
                          max_accuracy_drop=100, validation_data=str(heldout_file))
    searched = result.report["shape_search"]
    assert [t["shape"]["layers"] for t in searched["tried"]] == [1]
    assert searched["tried"][0]["kept"] and searched["kept"]["layers"] == 1
    assert "the first shape tried within" in searched["why"] and searched["validation"]["rows"] == 24
    lo, hi = searched["tried"][0]["drop_ci95"]  # paired over the 24 labelled rows, from the trial's own outputs
    assert lo <= searched["tried"][0]["drop_points"] <= hi
    assert "wider than the budget" not in searched["why"]  # a 100-point budget is resolved by any rows
    prune = next(p for p in result.manifest["passes"] if p["pass"] == "prune")
    assert prune["options"]["layers"] == 1 and prune["reused"]
    assert result.report["settings"]["rounds"] == 3  # the run's timing, not the tried shapes' short one
    assert "shape_search" not in (result.manifest.get("recipe") or {})
    assert "Prune shape chosen for this task" in (tmp_path / "out" / "report.md").read_text()
    from rich.console import Console

    from xformopt.report.console import console_table

    console = Console(width=200, record=True)
    console.print(console_table(result.report))
    assert "Prune shape 1 x all x 32 x all" in console.export_text()
    assert not (tmp_path / "out.shape-search").exists()


def test_a_folder_in_the_trials_place_that_the_search_did_not_write_is_refused(tiny_classifier, heldout_file,
                                                                              tmp_path):
    theirs = tmp_path / "out.shape-search"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="is not a shape search's trial folder"):
        api.optimize(tiny_classifier, recipe=tiny_recipe(heldout_file), output=tmp_path / "out", max_accuracy_drop=100,
                     validation_data=str(heldout_file))
    assert (theirs / "notes.txt").read_text() == "mine" and sorted(p.name for p in theirs.iterdir()) == ["notes.txt"]
    assert not (tmp_path / "out").exists()


def test_no_budget_runs_the_recipes_own_shape(tiny_classifier, heldout_file, tmp_path):
    result = api.optimize(tiny_classifier, recipe=tiny_recipe(heldout_file), output=tmp_path / "out")
    assert "shape_search" not in result.report
    prune = next(p for p in result.manifest["passes"] if p["pass"] == "prune")
    assert prune["options"]["layers"] == 1 and prune["options"]["ffn_dim"] == 32


def test_shipped_recipe_has_a_shape_search_with_its_fixed_shape():
    r = recipes.load("prune-distill-int8")
    prune = r.passes[0].options
    fixed = {k: prune[k] for k in ("layers_fraction", "heads_fraction", "ffn_fraction")}
    listed = [{k: v for k, v in s.model_dump().items() if v is not None and k != "distill_minutes"}
              for s in r.shape_search.shapes if s.student is None]  # the pruned shapes (a pretrained student follows)
    assert fixed in listed and r.shape_search.max_minutes <= 150 and r.shape_search.order == "measured"
    # relative to the model: MiniLM-L6's numbers as the recipe wrote them before, and BERT-base's
    minilm = {"num_hidden_layers": 6, "num_attention_heads": 12, "hidden_size": 384, "intermediate_size": 1536}
    s = shapes.absolute_shape(minilm, fixed)
    assert (s.num_layers, s.heads[0], s.ffn[0], s.hidden) == (3, 8, 512, 384)
    base = {"num_hidden_layers": 12, "num_attention_heads": 12, "hidden_size": 768, "intermediate_size": 3072}
    s = shapes.absolute_shape(base, listed[-2])
    assert (s.num_layers, s.heads[0], s.ffn[0], s.hidden) == (4, 8, 1024, 512)
    assert 0 < shapes.flops_share(base, listed[-2]) < shapes.flops_share(base, fixed) < 1


@pytest.mark.parametrize("change,fragment", [
    ({"shapes": []}, "shape_search.shapes"),
    ({"shapes": [{}]}, "give layers, heads_per_layer"),
    ({"shapes": [{"layers": 0}]}, "layers"),
    ({"max_minutes": 0}, "max_minutes"),
    ({"colour": "red"}, "colour"),
])
def test_bad_shape_search_exits_2(tiny_classifier, heldout_file, tmp_path, capsys, change, fragment):
    path = tmp_path / "r.yaml"
    raw = tiny_recipe(heldout_file)
    raw["shape_search"] = {**raw["shape_search"], **change}
    path.write_text(json.dumps(raw))
    code, _, err = run_cli(["optimize", tiny_classifier, "--recipe", path, "-o", tmp_path / "o",
                            "--max-accuracy-drop", "0.5"], capsys)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and fragment in err, err
    assert not (tmp_path / "o").exists()


def test_shape_search_needs_a_prune_pass(heldout_file):
    raw = tiny_recipe(heldout_file)
    raw["passes"] = raw["passes"][2:]
    with pytest.raises(InputError, match="no prune pass"):
        recipes.validate(raw)


def test_a_shape_that_misses_is_passed_over_and_the_next_kept(tiny_classifier, heldout_file, tmp_path, monkeypatch):
    """The fewest-FLOPs shape misses the budget on the validation rows, the next one meets it: the second
    is kept, the record lists both with their drops and says why; a shape that would not fit the time left
    is not started."""
    baseline = {}

    def fake_trial(job):
        layers = job.recipe.passes[0].options["layers"]
        import numpy as np

        from xformopt import sources
        from xformopt.recipe_search.trial import score_outputs, validation_set

        spec = sources.resolve(job.model)
        data = validation_set(spec, job.validation)
        outputs = np.load(job.validation["baseline"])
        baseline["metric"] = score_outputs(spec, outputs, data, outputs)
        metric = baseline["metric"] - (0.5 if layers == 1 else 0.0)
        return {"status": "complete", "metric": metric, "seconds": 1.0, "budget_met": True}

    monkeypatch.setattr(shapes, "run_trial", fake_trial)
    # the fake trials write no artifact; the kept one's interval is as 24 rows would leave a real one
    monkeypatch.setattr(shapes, "drop_interval", lambda *a: {"drop_ci95": [-3.0, 4.0]})
    raw = tiny_recipe(heldout_file, shapes=[{"layers": 2, "ffn_dim": 32}, {"layers": 1, "ffn_dim": 32},
                                            {"layers": 1, "ffn_dim": 48, "distill_minutes": 10_000}])
    result = api.optimize(tiny_classifier, recipe=raw, output=tmp_path / "out", max_accuracy_drop=1.0,
                          validation_data=str(heldout_file))
    tried = result.report["shape_search"]["tried"]
    assert [(t["shape"]["layers"], t["shape"]["ffn_dim"]) for t in tried] == [(1, 32), (1, 48), (2, 32)]
    assert tried[0]["drop_points"] == pytest.approx(50.0) and not tried[0]["within_budget"]
    assert tried[1]["status"] == "skipped" and "would not fit" in tried[1]["why"]
    assert tried[2]["kept"] and tried[2]["within_budget"]
    assert "2 shape(s) tried before it (faster or fewer FLOPs) missed" in result.report["shape_search"]["why"]
    # the budget holds on the point estimate; the record says the rows cannot resolve it
    assert "95% interval is -3.00 to +4.00 points, wider than the budget" in result.report["shape_search"]["why"]
    assert "+4.00" in (tmp_path / "out" / "report.md").read_text()
    prune = next(p for p in result.manifest["passes"] if p["pass"] == "prune")
    assert prune["options"]["layers"] == 2


def test_a_trial_scores_its_artifact_with_the_model_its_run_resolved(tiny_classifier, heldout_file, tmp_path,
                                                                     monkeypatch):
    """A trial scores its artifact against the model ``pipeline.run`` resolved (``RunResult.spec``): the model
    is resolved once per trial, not a second time after the run."""
    import numpy as np

    from xformopt import sources
    from xformopt.recipe_search.trial import TrialJob, run_trial

    for name, default in (("HF_HUB_OFFLINE", "1"), ("OMP_WAIT_POLICY", "PASSIVE")):  # run_trial sets them
        monkeypatch.setenv(name, os.environ.get(name, default))
    resolved, real = [], sources.resolve
    monkeypatch.setattr(sources, "resolve", lambda model, *a, **k: resolved.append(model) or real(model, *a, **k))
    np.save(tmp_path / "baseline.npy", np.zeros((8, 2), np.float32))
    r = recipes.validate({"name": "one-trial", "target": "avx512_vnni", "passes": ["export"],
                          "evaluation": {"data": str(heldout_file), "limit": 8, "latency_rounds": 3, "warmup": 1,
                                         "repeats": 1}}, "test")
    validation = {"data": str(heldout_file), "limit": 8, "baseline": str(tmp_path / "baseline.npy")}
    result = run_trial(TrialJob(0, str(tiny_classifier), r, str(tmp_path / "trials" / "000"), None, validation))
    assert result["status"] == "complete", result
    assert resolved == [str(tiny_classifier)]


def test_measured_order_tries_the_fastest_shape_first(tiny_classifier, heldout_file, tmp_path, monkeypatch):
    """order: measured: the shapes are tried in the order their untrained students timed (injected here: the
    more-FLOPs shape as the faster), and the record keeps the timings and how they were taken."""
    seen = {}

    def fake_timing(spec, target, shape_list, texts, threads, shaper="prune"):
        seen["shapes"] = shape_list
        return {"median_ms": [1.0 if s.get("layers") == 2 else 2.0 for s in shape_list], "unpruned_ms": 3.0,
                "what": "injected", "measured_on": "test", "rounds": 1, "seconds": 0.0}

    monkeypatch.setattr(shapes, "time_shapes", fake_timing)
    result = api.optimize(tiny_classifier, recipe=tiny_recipe(heldout_file, order="measured"), output=tmp_path / "out",
                          max_accuracy_drop=100, validation_data=str(heldout_file))
    searched = result.report["shape_search"]
    assert [s["layers"] for s in seen["shapes"]] == [1, 2]  # handed over fewest FLOPs first
    assert [t["shape"]["layers"] for t in searched["tried"]] == [2]  # the faster one tried first, and kept
    assert searched["tried"][0]["untrained_ms"] == 1.0 and searched["ordering"]["unpruned_ms"] == 3.0
    assert searched["order"].startswith("fastest first as measured")
    assert 0 < searched["tried"][0]["flops_share_of_teacher"] <= 1
    assert searched["tried"][0]["resolved"] == {"layers": 2, "heads_per_layer": 4, "ffn_dim": 64, "hidden_size": 64}


def test_untrained_students_of_every_kind_are_timed(tiny_classifier, sample_texts):
    """time_shapes on real graphs: absolute, relative and hidden-size shapes each cut, exported, fused and timed
    (a median per shape; no claim about which is faster: the host decides)."""
    from xformopt import sources, targets
    from xformopt.recipe_search.shape_order import time_shapes

    spec = sources.resolve(str(tiny_classifier))
    listed = [{"layers": 1}, {"layers_fraction": 0.5, "ffn_fraction": 0.5}, {"hidden_fraction": 0.5}]
    timing = time_shapes(spec, targets.PROFILES["avx512_vnni"], listed, sample_texts[:16], 1)
    assert len(timing["median_ms"]) == 3 and all(ms > 0 for ms in timing["median_ms"]) and timing["unpruned_ms"] > 0


def test_a_hidden_size_shape_runs_the_whole_chain_in_measured_order(tiny_classifier, heldout_file, tmp_path):
    """A relative shape with a narrower residual stream, beside an absolute one, in measured order (real timings:
    which comes first is the host's call): the kept one runs prune -> distill -> export -> quantize and the artifact
    has the shape its record names."""
    listed = [{"layers": 1, "hidden_fraction": 0.5}, {"layers": 2, "ffn_dim": 64}]
    result = api.optimize(tiny_classifier, recipe=tiny_recipe(heldout_file, order="measured", shapes=listed),
                          output=tmp_path / "out", max_accuracy_drop=100, validation_data=str(heldout_file))
    searched = result.report["shape_search"]
    assert len(searched["ordering"]["median_ms"]) == 2 and searched["ordering"]["unpruned_ms"] > 0
    kept = searched["tried"][0]
    assert kept["kept"] and kept["untrained_ms"] in searched["ordering"]["median_ms"]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"]) == (kept["resolved"]["layers"],
                                                                    kept["resolved"]["hidden_size"])
    assert kept["resolved"]["hidden_size"] in (32, 64)
