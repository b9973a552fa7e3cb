"""A shape search that lists pretrained students beside pruned shapes (``- student: NAME``): each is timed
untrained like the shapes (its own family's graph, its own tokenizer), ordered with them, tried by distilling it
from the model with the prune step dropped, and listed in the report's front like any shape; one that is not
smaller than the model (the packaged MiniLM beside a tiny teacher) or cannot be found is skipped with the reason."""

from __future__ import annotations

import json

import pytest
from helpers import run_cli
from tiny_students import tiny_roberta_encoder

from xformopt import api
from xformopt import recipe as recipes
from xformopt.recipe_search import shapes

PRUNE = {"layers": 1, "ffn_dim": 32, "measure_latency": False, "samples": 16, "eval_samples": 16}
DISTILL = {"train_samples": 64, "eval_samples": 16, "max_length": 32, "batch_size": 16, "patience": 0,
           "checkpoint_every": 0, "max_steps": 2, "eval_every": 2, "label_column": "", "select": "agreement"}


@pytest.fixture(scope="module")
def roberta(tmp_path_factory):
    return tiny_roberta_encoder(tmp_path_factory.mktemp("students") / "roberta")


def recipe(heldout_file, listed, **search) -> dict:
    return {
        "name": "tiny-students", "target": "avx512_vnni",
        "passes": [{"prune": PRUNE}, {"distill": DISTILL}, "export", {"quantize": {"mode": "dynamic"}}],
        "evaluation": {"data": str(heldout_file), "limit": 8, "latency_rounds": 3, "warmup": 1, "repeats": 1},
        "shape_search": {"max_minutes": 30, "shapes": listed, "order": "measured", **search},
    }


def test_a_pretrained_student_is_timed_untrained_beside_the_shapes(tiny_classifier, roberta, sample_texts):
    """Real graphs: the pruned shape cut and the RoBERTa student (another family, another tokenizer) loaded with the
    model's head, each exported, fused and timed interleaved (a median each; which is faster is the host's call)."""
    from xformopt import sources, targets
    from xformopt.recipe_search.shape_order import time_shapes

    spec = sources.resolve(str(tiny_classifier))
    timing = time_shapes(spec, targets.PROFILES["avx512_vnni"], [{"layers": 1}, {"student": str(roberta)}],
                         sample_texts[:16], 1)
    assert len(timing["median_ms"]) == 2 and all(ms > 0 for ms in timing["median_ms"])
    assert "pretrained student" in timing["what"]


def test_the_search_tries_a_pretrained_student_and_lists_it_in_its_front(tiny_classifier, roberta, heldout_file,
                                                                        tmp_path, monkeypatch):
    """The student timed fastest (injected) is tried first and kept: the artifact is the RoBERTa student distilled
    from the BERT model (no prune step), the report's front lists it with its size, and the packaged MiniLM,
    larger than this tiny model (or not installed here), is skipped with its reason."""
    seen = {}

    def fake_timing(spec, target, shape_list, texts, threads, shaper="prune"):
        seen["shapes"] = shape_list
        return {"median_ms": [1.0 if s.get("student") else 2.0 for s in shape_list], "unpruned_ms": 3.0,
                "what": "injected", "measured_on": "test", "rounds": 1, "seconds": 0.0}

    monkeypatch.setattr(shapes, "time_shapes", fake_timing)
    listed = [{"layers": 1, "ffn_dim": 32}, {"student": str(roberta)}, {"student": "minilm"}]
    result = api.optimize(tiny_classifier, recipe=recipe(heldout_file, listed), output=tmp_path / "out",
                          max_accuracy_drop=100, validation_data=str(heldout_file))
    assert {"student": str(roberta)} in seen["shapes"] and {"student": "minilm"} not in seen["shapes"]
    tried = result.report["shape_search"]["tried"]
    first, skipped = tried[0], tried[-1]
    assert first["shape"] == {"student": str(roberta)} and first["kept"] and first["student_kind"] == "pretrained"
    assert first["resolved"] == {"layers": 1, "heads_per_layer": 2, "ffn_dim": 64, "hidden_size": 32}
    assert 0 < first["flops_share_of_teacher"] < 1 and first["untrained_ms"] == 1.0
    assert skipped["shape"] == {"student": "minilm"} and skipped["status"] == "skipped"
    assert "not smaller than the model" in skipped["why"] or "not available here" in skipped["why"]
    assert [p["pass"] for p in result.manifest["passes"]][:2] == ["distill", "export"]  # the prune step dropped
    distill = result.manifest["passes"][0]["record"]
    assert distill["student"]["kind"] == "pretrained" and not distill["student"]["same_tokenizer"]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    tokenizer = json.loads((tmp_path / "out" / "tokenizer.json").read_text())
    assert config["model_type"] == "roberta" and tokenizer["model"]["type"] == "BPE"  # the student's own tokenizer
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert f"pretrained {roberta} = 1 × 2 × 64 × 32" in markdown and "pretrained minilm" in markdown


def test_a_student_entry_names_no_shape(heldout_file, tmp_path, capsys, tiny_classifier):
    path = tmp_path / "r.yaml"
    path.write_text(json.dumps(recipe(heldout_file, [{"student": "minilm", "layers": 2}])))
    code, _, err = run_cli(["optimize", tiny_classifier, "--recipe", path, "-o", tmp_path / "o",
                            "--max-accuracy-drop", "1"], capsys)
    assert code == 2 and "give student or layers, not both" in err and not (tmp_path / "o").exists()


def test_the_shipped_recipe_lists_the_packaged_minilm_beside_its_shapes():
    r = recipes.load("prune-distill-int8")
    assert [s.student for s in r.shape_search.shapes if s.student] == ["minilm"]


def test_an_embedding_models_student_must_embed_in_its_width(tiny_encoder, roberta):
    """An embedder's student is held to its vectors' width (embedding distillation compares them): the 32-wide
    RoBERTa is skipped for the 64-wide tiny encoder, and kept for a classifier of the same model."""
    config = json.loads((tiny_encoder / "config.json").read_text())
    listed = [shapes.Candidate({"student": str(roberta)}, None, {})]
    kept, skipped = shapes.locate_students(listed, config, embedding=True)
    assert not kept and "embeds in 32 dimensions, the model in 64" in skipped[0]["why"]
    kept, skipped = shapes.locate_students(listed, config, embedding=False)
    assert kept == listed and not skipped and kept[0].student.path == roberta


def test_a_pretrained_student_after_prune_is_refused_before_any_work(heldout_file, roberta):
    from xformopt.errors import InputError

    raw = recipe(heldout_file, [{"layers": 1}])
    raw["passes"][1] = {"distill": {**DISTILL, "student": str(roberta)}}
    with pytest.raises(InputError, match="distill.student: a pretrained student replaces the model, so what prune"):
        recipes.validate(raw, "test")
