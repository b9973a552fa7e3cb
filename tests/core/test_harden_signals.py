"""Signals and crashes (issue 12 point 4): SIGTERM/SIGINT clean up like any failure and say one
line; kill -9 leftovers are swept by the next run; a run killed at any point never leaves a partial
artifact or a cache entry that does not verify, and the re-run gives the clean run's graph."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx
import pytest
from harden_helpers import leftovers, one_error, quick_recipe
from helpers import run_cli

from xformopt import cache

ROOT = Path(__file__).resolve().parents[2]
DETERMINISTIC = "- export\n- fuse: {select: all}"  # no timing-based choice: every run has one graph


def graph_of(path: Path) -> list:
    model = onnx.load(str(path))
    return [(n.op_type, list(n.input), list(n.output)) for n in model.graph.node]


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_mid_pass_cleans_up_and_says_one_line(signum, code, tiny_classifier, heldout_file, tmp_path, capsys,
                                                       monkeypatch, isolated_cache):
    from xformopt.passes.export.run import ExportPass

    real = ExportPass.run

    def interrupted(self, ctx, src, dst, options):
        real(self, ctx, src, dst, options)  # the cache build folder is full of files now
        os.kill(os.getpid(), signum)
        time.sleep(5)  # the handler raises before this returns
        pytest.fail("signal not delivered")

    monkeypatch.setattr(ExportPass, "run", interrupted)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    out = tmp_path / "out"
    exit_code, _, err = run_cli(["optimize", tiny_classifier, "-r", quick_recipe(tmp_path, heldout_file), "-o", out],
                                capsys)
    one_error(exit_code, err, f"interrupted ({signal.Signals(signum).name})", exit_code=code)
    assert not out.exists() and leftovers(tmp_path) == []
    assert list((tmp_path / "tmp").iterdir()) == []  # the xformopt-run-* work folder is gone
    assert not list((isolated_cache / "passes").iterdir())  # no .tmp-* build folder, no entry
    assert signal.getsignal(signal.SIGTERM) is not None  # handlers restored (pytest keeps working)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_leftovers_of_dead_runs_are_swept_at_start(tiny_classifier, heldout_file, tmp_path, capsys, monkeypatch,
                                                    isolated_cache):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    dead = dead_pid()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        passes = isolated_cache / "passes"
        passes.mkdir(parents=True, exist_ok=True)
        stale = [tmp / f"xformopt-run-{dead}-abc", tmp_path / f".out.tmp-{dead}-123", passes / f".k.tmp-{dead}-9",
                 tmp_path / f".out.old-{dead}-5"]
        live = [tmp / f"xformopt-run-{alive.pid}-abc", passes / f".k.tmp-{alive.pid}-9"]
        for folder in stale + live:
            folder.mkdir()
            (folder / "model.onnx").write_bytes(b"half")
        code, _, err = run_cli(["optimize", tiny_classifier, "-r", quick_recipe(tmp_path, heldout_file),
                                "-o", tmp_path / "out"], capsys)
        assert code == 0, err
        assert [p for p in stale if p.exists()] == []
        assert all(p.exists() for p in live)  # a live run's work in progress is not ours to remove
    finally:
        alive.kill()
        alive.wait()


def _start(model: Path, recipe: Path, out: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "xformopt.cli.app", "optimize", str(model), "-r", str(recipe),
                             "-o", str(out), "--force"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _assert_whole_or_absent(out: Path) -> None:
    if out.exists():
        assert (out / "manifest.json").is_file() and (out / "report.json").is_file()
        onnx.checker.check_model(str(out / "model.onnx"))


def test_kills_at_random_points_never_leave_a_partial_artifact(tiny_classifier, heldout_file, tmp_path):
    recipe = quick_recipe(tmp_path, heldout_file, passes=DETERMINISTIC)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    clean_cache = tmp_path / "clean-cache"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}

    started = time.monotonic()
    clean = _start(tiny_classifier, recipe, tmp_path / "clean", {**env, "XFORMOPT_CACHE_DIR": str(clean_cache)})
    assert clean.wait(timeout=300) == 0, clean.stderr.read()
    duration = time.monotonic() - started  # only to spread the kill points over a run, never asserted

    env["XFORMOPT_CACHE_DIR"] = str(tmp_path / "cache")
    out = tmp_path / "out"
    rng = random.Random(12)
    trials = [signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGKILL]  # kill -9 twice: its leftovers are the hard case
    codes = []
    for signum in trials:
        proc = _start(tiny_classifier, recipe, out, env)
        time.sleep(rng.uniform(0.2, duration))
        proc.send_signal(signum)
        code = proc.wait(timeout=300)
        err = proc.stderr.read()
        codes.append(code)
        handled = 128 + signum
        assert code in (0, handled, -signum), (signum, code, err)
        assert "Traceback" not in err, err
        if code == handled and signum != signal.SIGKILL:
            assert err.strip().splitlines()[-1] == f"error: interrupted ({signal.Signals(signum).name})"
            # cleaned up like any failure: no temp folders of this run anywhere
            assert not [p for p in tmp.iterdir() if f"-{proc.pid}-" in p.name]
            assert not [p for p in tmp_path.iterdir() if f"-{proc.pid}-" in p.name]
        _assert_whole_or_absent(out)
        entries = sorted(p for p in (tmp_path / "cache" / "passes").glob("*") if not p.name.startswith(".")) \
            if (tmp_path / "cache" / "passes").is_dir() else []
        for entry in entries:
            assert cache.problem(entry) is None, (signum, entry, cache.problem(entry))

    print("exit codes of the killed runs:", codes)
    assert any(code != 0 for code in codes)  # at least one kill landed mid-run (a run that finished first proves less)
    final = _start(tiny_classifier, recipe, out, env)
    assert final.wait(timeout=300) == 0, final.stderr.read()
    assert graph_of(out / "model.onnx") == graph_of(tmp_path / "clean" / "model.onnx")
    assert leftovers(tmp_path) == []  # kill -9 leftovers swept by the re-run
    assert not [p for p in tmp.iterdir() if p.name.startswith("xformopt-")]
    passes = tmp_path / "cache" / "passes"
    assert not [p for p in passes.iterdir() if p.name.startswith(".")]


class _SignalsItselfWhenCollected:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)  # the handler runs inside this finalizer, where Python cannot raise


def test_a_signal_landing_in_a_finalizer_still_interrupts_the_block(capfd):
    from xformopt.signals import Interrupted, interruptible

    with pytest.raises(Interrupted) as caught:
        with interruptible():
            victim = _SignalsItselfWhenCollected()
            del victim
            for _ in range(200):
                time.sleep(0.01)
    assert caught.value.signum == signal.SIGTERM
    err = capfd.readouterr().err
    assert "Exception ignored" not in err and "Traceback" not in err, err
