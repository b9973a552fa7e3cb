"""The stores beside the pass entries (teacher outputs, importance scores, distillation checkpoints) are sized by
`xformopt cache list` and trimmed by `cache prune --older-than` / `cache clear`, never under a running command
and never through a symbolic link (xformopt/cache_stores.py)."""

from __future__ import annotations

import json
import os
import time

import numpy as np
from helpers import run_cli

from xformopt import cache_stores
from xformopt.passes.prune import importance_cache


def fill(root, name, relative, size):
    path = root / name / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return path


def test_list_sizes_the_stores_and_clear_empties_them_but_models_and_links(isolated_cache, capsys):
    root = isolated_cache
    fill(root, "distill-teacher", "a.safetensors", 300)
    fill(root, "prune-importance", "b.npz", 50)
    fill(root, "distill-checkpoints", "run1/current/student.safetensors", 200)
    model = fill(root, "models", "all-minilm/config.json", 10)
    linked = root / "gemm-peak"  # the fixture's link to the peak shared by all tests
    peak_files = sorted(p.name for p in linked.iterdir())

    code, out, err = run_cli(["cache", "list", "--json"], capsys)
    assert code == 0, err
    sizes = {row["store"]: (row["items"], row["size_bytes"]) for row in json.loads(out)["stores"]}
    assert sizes["distill-teacher"] == (1, 300) and sizes["prune-importance"] == (1, 50)
    assert sizes["distill-checkpoints"] == (1, 200)  # a checkpoint folder is one item
    assert "models" not in sizes

    code, out, err = run_cli(["cache", "clear", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    actions = {row["store"]: row["action"] for row in doc["stores"]}
    assert actions["distill-teacher"] == actions["prune-importance"] == actions["distill-checkpoints"] == "removed"
    assert actions["gemm-peak"].startswith("a symbolic link: kept")
    assert doc["freed_bytes"] == 550
    for name in ("distill-teacher", "prune-importance", "distill-checkpoints"):
        assert cache_stores.items(name) == []
    assert model.read_bytes() == b"x" * 10  # an install, not a cache of results
    assert sorted(p.name for p in linked.iterdir()) == peak_files


def test_a_running_command_keeps_the_stores_whole(isolated_cache, capsys):
    teacher = fill(isolated_cache, "distill-teacher", "a.safetensors", 30)
    with cache_stores.in_use():  # what optimize and every single-pass command hold while they run
        code, out, err = run_cli(["cache", "clear", "--json"], capsys)
    assert code == 0 and teacher.is_file()
    assert {row["action"] for row in json.loads(out)["stores"]} == {"in use by a running command: kept"}
    assert "in use by a running command" in err
    code, out, _ = run_cli(["cache", "clear", "--json"], capsys)
    assert code == 0 and not teacher.exists()


def test_prune_older_than_removes_stored_items_unused_for_that_long(isolated_cache, capsys):
    old = fill(isolated_cache, "distill-teacher", "old.safetensors", 40)
    new = fill(isolated_cache, "distill-teacher", "new.safetensors", 7)
    three_days_ago = time.time() - 3 * 86400
    os.utime(old, (three_days_ago, three_days_ago))
    # importance scores read back count as used: the read marks them
    importance_cache.save("k" * 24, [np.ones(2)], [np.ones(3)], [0.5])
    scores = importance_cache.folder() / f"{'k' * 24}.npz"
    os.utime(scores, (three_days_ago, three_days_ago))
    assert importance_cache.load("k" * 24) is not None

    code, out, _ = run_cli(["cache", "prune", "--older-than", "2d", "--dry-run", "--json"], capsys)
    assert code == 0 and old.is_file() and json.loads(out)["freed_bytes"] == 40
    code, out, _ = run_cli(["cache", "prune", "--older-than", "2d", "--json"], capsys)
    assert code == 0 and json.loads(out)["freed_bytes"] == 40
    assert not old.exists() and new.is_file() and scores.is_file()
