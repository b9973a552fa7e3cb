"""Output paths: never the input, never half-written, one writer at a time (issue 12, points 1 and 3)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from harden_helpers import leftovers, one_error, quick_recipe, tree
from helpers import run_cli

from xformopt.artifact import check_output
from xformopt.errors import InputError
from xformopt.locks import lock_output, output_lock_path

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def model_copy(tmp_path, tiny_classifier) -> Path:
    """A private copy of the tiny model under tmp/models/m (so a test may point -o at or around it)."""
    dst = tmp_path / "models" / "m"
    shutil.copytree(tiny_classifier, dst)
    return dst


@pytest.mark.parametrize("where", ["same", "inside", "parent"])
def test_output_at_inside_or_around_the_model_is_refused(model_copy, heldout_file, tmp_path, capsys, where):
    out = {"same": model_copy, "inside": model_copy / "sub" / "out", "parent": model_copy.parent}[where]
    before = tree(model_copy)
    code, _, err = run_cli(["optimize", model_copy, "-r", quick_recipe(tmp_path, heldout_file), "-o", out, "--force"],
                           capsys)
    one_error(code, err, "which this run reads")
    assert tree(model_copy) == before  # model.safetensors and every other file untouched


def test_output_containing_the_data_file_is_refused(tiny_classifier, heldout_file, tmp_path, capsys):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    data = data_dir / "rows.jsonl"
    shutil.copy(heldout_file, data)
    recipe = quick_recipe(tmp_path, data)
    code, _, err = run_cli(["optimize", tiny_classifier, "-r", recipe, "-o", data_dir, "--force"], capsys)
    one_error(code, err, "contains", str(data.resolve()))
    assert data.read_bytes() == heldout_file.read_bytes()


@pytest.mark.parametrize("where", ["root", "inside"])
def test_output_at_or_in_the_cache_is_refused(tiny_classifier, heldout_file, tmp_path, capsys, isolated_cache, where):
    out = isolated_cache if where == "root" else isolated_cache / "passes" / "x"
    code, _, err = run_cli(["optimize", tiny_classifier, "-r", quick_recipe(tmp_path, heldout_file), "-o", out, "--force"],
                           capsys)
    one_error(code, err, "which this run reads")


def test_pass_command_output_equal_to_its_input_is_refused(model_copy, capsys):
    before = tree(model_copy)
    code, _, err = run_cli(["export", model_copy, "-o", model_copy, "--force"], capsys)
    one_error(code, err, "which this run reads")
    assert tree(model_copy) == before


@pytest.mark.parametrize("dangling", [True, False])
def test_symlink_at_output_is_refused_and_its_target_kept(tiny_classifier, heldout_file, tmp_path, capsys, dangling):
    target = tmp_path / "real"
    if not dangling:
        target.mkdir()
        (target / "keep.txt").write_text("mine")
    link = tmp_path / "link"
    link.symlink_to(target)
    code, _, err = run_cli(["optimize", tiny_classifier, "-r", quick_recipe(tmp_path, heldout_file), "-o", link, "--force"],
                           capsys)
    one_error(code, err, "is a symbolic link", str(target))
    assert link.is_symlink()
    assert dangling or (target / "keep.txt").read_text() == "mine"


def test_output_under_a_file_is_refused_before_work(tiny_classifier, heldout_file, tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    monkeypatch.setattr("xformopt.pipeline.execute_run", lambda *a, **k: pytest.fail("work started"))
    code, _, err = run_cli(["optimize", tiny_classifier, "-r", quick_recipe(tmp_path, heldout_file),
                            "-o", blocker / "missing" / "out"], capsys)
    one_error(code, err, "is a file, not a folder", str(blocker))


def test_output_under_a_read_only_folder_is_refused_before_work(tmp_path, monkeypatch):
    read_only = tmp_path / "ro"
    read_only.mkdir()
    real_access = os.access
    # root ignores permission bits, so the folder's write permission is what access() reports here
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == read_only else real_access(p, mode))
    with pytest.raises(InputError, match=f"cannot write to {read_only}"):
        check_output(read_only / "missing" / "deeper" / "out", force=False)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only folder")
def test_output_under_a_read_only_folder_really(tiny_classifier, heldout_file, tmp_path, capsys):
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    try:
        code, _, err = run_cli(["optimize", tiny_classifier, "-r", quick_recipe(tmp_path, heldout_file),
                                "-o", read_only / "missing" / "out"], capsys)
        one_error(code, err, "cannot write to")
    finally:
        read_only.chmod(0o755)


def test_force_replaces_atomically_without_leftovers(tiny_classifier, heldout_file, tmp_path, capsys):
    recipe = quick_recipe(tmp_path, heldout_file)
    out = tmp_path / "out"
    assert run_cli(["optimize", tiny_classifier, "-r", recipe, "-o", out], capsys)[0] == 0
    (out / "old-marker.txt").write_text("from the first run")
    code, _, err = run_cli(["optimize", tiny_classifier, "-r", recipe, "-o", out, "--force"], capsys)
    assert code == 0, err
    assert not (out / "old-marker.txt").exists()
    assert (out / "manifest.json").is_file()
    onnx.load(str(out / "model.onnx"))
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("kind", ["home", "hub-cache", "fake-manifest"])
def test_force_refuses_a_folder_that_is_no_xformopt_output(kind, tiny_classifier, heldout_file, tmp_path, capsys):
    """--force deletes what it replaces: a home dir, an HF cache, or a project folder with someone
    else's manifest.json stays untouched (found by review: `-o ~ --force` wiped the home directory)."""
    out = tmp_path / kind
    (out / ".cache" / "huggingface").mkdir(parents=True)
    (out / ".gitconfig").write_text("[user]\n  name = me\n")
    if kind == "fake-manifest":
        (out / "manifest.json").write_text('{"schema": "webapp/1"}')
    before = tree(out)
    env = {"HF_HOME": str(out)} if kind == "hub-cache" else {}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        code, _, err = run_cli(["optimize", tiny_classifier, "-r", quick_recipe(tmp_path, heldout_file), "-o", out,
                                "--force"], capsys)
    one_error(code, err, "not an xformopt output", "choose another -o")
    assert tree(out) == before and (out / ".cache" / "huggingface").is_dir()
    code, _, err = run_cli(["export", tiny_classifier, "-o", out, "--force"], capsys)
    one_error(code, err, "not an xformopt output")
    assert tree(out) == before


def test_force_still_replaces_an_empty_folder(tiny_classifier, tmp_path, capsys):
    out = tmp_path / "empty"
    out.mkdir()
    code, _, err = run_cli(["export", tiny_classifier, "-o", out, "--force"], capsys)
    assert code == 0, err
    assert (out / "model.onnx").is_file()


@pytest.mark.parametrize("planted", ["symlink", "folder"])
def test_a_path_planted_at_the_lock_is_refused_and_its_target_kept(planted, tiny_classifier, tmp_path, capsys):
    """Found by review: a symlink at .OUT.lock made the writer truncate its target (a user's file)."""
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me\n")
    out = tmp_path / "out"
    lock = output_lock_path(out)
    lock.symlink_to(victim) if planted == "symlink" else lock.mkdir()
    code, _, err = run_cli(["export", tiny_classifier, "-o", out], capsys)
    one_error(code, err, "cannot take the lock", str(lock))
    assert victim.read_text() == "keep me\n" and not out.exists()


def _hold_lock(out: Path) -> subprocess.Popen:
    """Another process holding OUT's writer lock (as a concurrent optimize would)."""
    code = ("import sys, time; from xformopt.locks import lock_output; "
            f"lock_output({str(out)!r}); print('held', flush=True); time.sleep(float(sys.argv[1]))")
    proc = subprocess.Popen([sys.executable, "-c", code, "2.5"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_writer_is_refused_naming_the_first_pid(tiny_classifier, heldout_file, tmp_path, capsys):
    out = tmp_path / "out"
    holder = _hold_lock(out)
    try:
        code, _, err = run_cli(["optimize", tiny_classifier, "-r", quick_recipe(tmp_path, heldout_file), "-o", out],
                               capsys)
        one_error(code, err, "is being written by another run", f"(pid {holder.pid})", "--wait")
        assert not out.exists()
    finally:
        holder.kill()
        holder.wait()


def test_wait_waits_for_the_other_writer(tiny_classifier, heldout_file, tmp_path, capsys):
    out = tmp_path / "out"
    holder = _hold_lock(out)
    try:
        code, _, err = run_cli(["optimize", tiny_classifier, "-r", quick_recipe(tmp_path, heldout_file), "-o", out,
                                "--wait"], capsys)
        assert code == 0, err
        assert holder.poll() is not None  # we only got the lock once the holder was gone
    finally:
        holder.kill()
        holder.wait()
    assert leftovers(tmp_path) == []


def test_lock_is_released_by_a_killed_holder(tmp_path):
    out = tmp_path / "out"
    holder = _hold_lock(out)
    holder.kill()
    holder.wait()
    lock = lock_output(out)  # the kernel dropped the dead holder's flock
    lock.release()
    assert not output_lock_path(out).exists()


def _optimize_proc(model: Path, recipe: Path, out: Path, cache: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XFORMOPT_CACHE_DIR": str(cache)}
    return subprocess.Popen([sys.executable, "-m", "xformopt.cli.app", "optimize", str(model), "-r", str(recipe),
                             "-o", str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_concurrent_runs_on_one_output_never_both_succeed(tiny_classifier, heldout_file, tmp_path, isolated_cache):
    recipe = quick_recipe(tmp_path, heldout_file)
    out = tmp_path / "same"
    procs = [_optimize_proc(tiny_classifier, recipe, out, isolated_cache) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "being written by another run" in loser or "already exists" in loser, loser
    onnx.checker.check_model(str(out / "model.onnx"))
    assert (out / "manifest.json").is_file() and leftovers(tmp_path) == []


def test_two_concurrent_runs_on_one_cache_both_succeed_and_agree(tiny_classifier, heldout_file, tmp_path, isolated_cache):
    from xformopt import cache

    recipe = quick_recipe(tmp_path, heldout_file)
    procs = [_optimize_proc(tiny_classifier, recipe, tmp_path / f"out{i}", isolated_cache) for i in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert [code for code, _ in results] == [0, 0], results
    assert (tmp_path / "out0" / "model.onnx").read_bytes() == (tmp_path / "out1" / "model.onnx").read_bytes()
    entries = cache.entries()
    assert entries and all(cache.problem(e) is None for e in entries)
    assert not [p for p in (isolated_cache / "passes").iterdir() if p.name.startswith(".")]
