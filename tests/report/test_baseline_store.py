"""The PyTorch baseline's held-out outputs are computed once per model, rows and settings and read back by a later
run (a shape search's trials, a second recipe), and recomputed when any of them changes or the file is damaged
(xformopt/evaluate/baseline_store.py)."""

from __future__ import annotations

import json
import shutil

import numpy as np
from harden_helpers import quick_recipe
from helpers import run_cli

from xformopt.cache_stores import items


def optimize(model, recipe, out, capsys) -> tuple[dict, np.ndarray, str]:
    code, _, err = run_cli(["optimize", model, "-r", recipe, "-o", out], capsys)
    assert code == 0, err
    report = json.loads((out / "report.json").read_text())
    return report, np.load(out / "reference" / "baseline_outputs.npy"), err


def test_the_baseline_is_scored_once_per_model_rows_and_settings(tiny_classifier, heldout_file, tmp_path, capsys):
    recipe = quick_recipe(tmp_path, heldout_file)
    first, first_outputs, _ = optimize(tiny_classifier, recipe, tmp_path / "a", capsys)
    assert "outputs_read_from_disk" not in first["stages"][0] and len(items("baseline-outputs")) == 1

    again, again_outputs, err = optimize(tiny_classifier, recipe, tmp_path / "b", capsys)
    assert again["stages"][0]["outputs_read_from_disk"] is True and "read from" in err
    assert "outputs_read_from_disk" not in again["stages"][-1]  # only the baseline's are kept
    np.testing.assert_array_equal(again_outputs, first_outputs)
    assert again["stages"][0]["metrics"] == first["stages"][0]["metrics"]
    assert again["stages"][-1]["metrics"] == first["stages"][-1]["metrics"]

    # other rows, another model: a new key each
    fewer = recipe.read_text().replace("limit: 8", "limit: 6")
    (tmp_path / "fewer.yaml").write_text(fewer)
    other_rows, _, _ = optimize(tiny_classifier, tmp_path / "fewer.yaml", tmp_path / "c", capsys)
    assert "outputs_read_from_disk" not in other_rows["stages"][0]
    changed = tmp_path / "changed-model"
    shutil.copytree(tiny_classifier, changed)
    with open(changed / "config.json", "a") as config:  # same weights, other bytes: another model folder
        config.write("\n")
    other_model, _, _ = optimize(changed, recipe, tmp_path / "d", capsys)
    assert "outputs_read_from_disk" not in other_model["stages"][0]
    assert len(items("baseline-outputs")) == 3


def test_a_damaged_file_is_recomputed(tiny_classifier, heldout_file, tmp_path, capsys):
    recipe = quick_recipe(tmp_path, heldout_file)
    _, first_outputs, _ = optimize(tiny_classifier, recipe, tmp_path / "a", capsys)
    (stored,) = items("baseline-outputs")
    stored.write_bytes(stored.read_bytes()[:40])
    report, outputs, _ = optimize(tiny_classifier, recipe, tmp_path / "b", capsys)
    assert "outputs_read_from_disk" not in report["stages"][0]
    np.testing.assert_array_equal(outputs, first_outputs)
    assert np.load(stored).shape == first_outputs.shape  # written again, whole
