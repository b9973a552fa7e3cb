"""The pass cache verifies itself: tampered, truncated or partial entries are evicted and
recomputed, never served; `xformopt cache list|verify|prune|clear` (issue 12 point 5, issue 11)."""

from __future__ import annotations

import json
import os
import time

import onnx
import pytest
from harden_helpers import one_error, quick_recipe
from helpers import run_cli

from xformopt import cache
from xformopt.cli.cache import parse_duration, parse_size


@pytest.fixture
def recipe(tmp_path, heldout_file):
    return quick_recipe(tmp_path, heldout_file)


@pytest.fixture
def filled(tiny_classifier, recipe, tmp_path, capsys, isolated_cache):
    """One optimize run: the cache holds its export entry; returns (entry, first artifact)."""
    out = tmp_path / "first"
    code, _, err = run_cli(["optimize", tiny_classifier, "-r", recipe, "-o", out], capsys)
    assert code == 0, err
    (entry,) = cache.entries()
    assert cache.problem(entry) is None
    return entry, out


def graph_of(path):
    model = onnx.load(str(path))
    return [(n.op_type, list(n.input), list(n.output)) for n in model.graph.node]


TAMPER = {
    "overwritten": lambda e: (e / "model.onnx").write_bytes((e / "model.onnx").read_bytes()[::-1]),
    "same-size-edit": lambda e: (e / "model.onnx").write_bytes(
        (b := (e / "model.onnx").read_bytes())[:-1] + bytes([b[-1] ^ 1])),
    "truncated": lambda e: (e / "model.onnx").write_bytes((e / "model.onnx").read_bytes()[:100]),
    "deleted": lambda e: (e / "model.onnx").unlink(),
    "added": lambda e: (e / "extra.bin").write_bytes(b"x"),
    "entry-file-gone": lambda e: (e / cache.ENTRY_FILE).unlink(),
    "entry-file-garbage": lambda e: (e / cache.ENTRY_FILE).write_text("{not json"),
}


@pytest.mark.parametrize("how", list(TAMPER))
def test_a_damaged_entry_is_evicted_and_recomputed(filled, tiny_classifier, recipe, tmp_path, capsys, how):
    entry, first = filled
    TAMPER[how](entry)
    out = tmp_path / "second"
    code, _, err = run_cli(["optimize", tiny_classifier, "-r", recipe, "-o", out], capsys)
    assert code == 0, err
    assert f"cache entry {entry.name} is corrupt" in err and "evicted, recomputing" in err
    assert "reused from cache" not in err
    assert graph_of(out / "model.onnx") == graph_of(first / "model.onnx")
    assert cache.problem(entry) is None  # rebuilt, and verifies


def test_an_intact_entry_is_reused(filled, tiny_classifier, recipe, tmp_path, capsys):
    entry, _ = filled
    code, _, err = run_cli(["optimize", tiny_classifier, "-r", recipe, "-o", tmp_path / "again"], capsys)
    assert code == 0 and "reused from cache" in err and "corrupt" not in err


def test_an_entry_records_size_and_sha256_of_every_file(filled):
    entry, _ = filled
    meta = json.loads((entry / cache.ENTRY_FILE).read_text())
    assert meta["schema"] == cache.ENTRY_SCHEMA and meta["pass"] == "export"
    assert "model.onnx" in meta["files"]
    assert meta["files"]["model.onnx"]["size"] == (entry / "model.onnx").stat().st_size
    assert len(meta["files"]["model.onnx"]["sha256"]) == 64


def test_cache_list_and_verify(filled, capsys):
    entry, _ = filled
    code, out, _ = run_cli(["cache", "list", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and [e["key"] for e in doc["entries"]] == [entry.name]
    assert doc["entries"][0]["size_bytes"] > 0 and doc["total_bytes"] == doc["entries"][0]["size_bytes"]
    assert run_cli(["cache", "verify"], capsys)[0] == 0
    TAMPER["same-size-edit"](entry)
    code, out, err = run_cli(["cache", "verify", "--json"], capsys)
    one_error(code, err, "1 corrupt cache entry", exit_code=1)
    assert json.loads(out)["corrupt"] == 1 and not entry.exists()


def test_cache_prune_older_than_and_max_size(filled, capsys):
    entry, _ = filled
    code, out, _ = run_cli(["cache", "prune", "--older-than", "1d", "--json"], capsys)
    assert code == 0 and json.loads(out)["removed"] == 0 and entry.exists()
    old = time.time() - 3 * 86400
    os.utime(entry, (old, old))
    code, out, _ = run_cli(["cache", "prune", "--older-than", "2d", "--dry-run", "--json"], capsys)
    assert json.loads(out)["removed"] == 1 and entry.exists()
    code, out, _ = run_cli(["cache", "prune", "--older-than", "2d", "--json"], capsys)
    assert code == 0 and json.loads(out)["freed_bytes"] > 0 and not entry.exists()


def test_cache_prune_max_size_keeps_the_newest(filled, tiny_classifier, heldout_file, tmp_path, capsys):
    entry, _ = filled
    other = quick_recipe(tmp_path, heldout_file, passes="- export: {opset: 16}", name="other.yaml")
    assert run_cli(["optimize", tiny_classifier, "-r", other, "-o", tmp_path / "o2"], capsys)[0] == 0
    newer = next(e for e in cache.entries() if e != entry)
    old = time.time() - 3600
    os.utime(entry, (old, old))
    code, out, _ = run_cli(["cache", "prune", "--max-size", f"{cache.size_of(newer)}B", "--json"], capsys)
    assert code == 0 and json.loads(out)["removed"] == 1
    assert cache.entries() == [newer]


def test_cache_clear_skips_entries_in_use(filled, capsys):
    entry, _ = filled
    with cache.session():
        assert cache.lookup(entry.name) is not None  # pinned by this "run"
        code, out, _ = run_cli(["cache", "clear", "--json"], capsys)
        assert code == 0 and json.loads(out)["removed"] == 0 and entry.exists()
    code, out, _ = run_cli(["cache", "clear", "--json"], capsys)
    assert json.loads(out)["removed"] == 1 and cache.entries() == []


@pytest.mark.parametrize("args", [["prune"], ["prune", "--older-than", "soon"], ["prune", "--max-size", "big"]])
def test_cache_prune_bad_values_are_one_line(args, capsys):
    code, _, err = run_cli(["cache", *args], capsys)
    one_error(code, err)


def test_parse_size_and_duration():
    assert parse_size("5GB") == 5 * 10**9 and parse_size("2GiB") == 2 * 1024**3 and parse_size("0") == 0
    assert parse_duration("30d") == 30 * 86400 and parse_duration("90m") == 5400 and parse_duration("2w") == 14 * 86400


def test_concurrent_builders_of_one_key_build_once(isolated_cache, tmp_path):
    """The second builder waits for the first, then reuses its entry instead of building again."""
    import threading

    built = []

    def work(dst):
        built.append(1)
        time.sleep(0.3)
        (dst / "a.txt").write_text("same")
        return {"ok": True}

    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.build("k" * 24, work))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1 and len(results) == 2
    assert cache.problem(results[0][0]) is None
