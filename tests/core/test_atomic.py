"""xformopt.atomic: a write either lands whole or leaves the old file as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from xformopt import atomic
from xformopt.stale import sweep

ROOT = Path(__file__).resolve().parents[2]


def test_writes_text_bytes_and_json_and_leaves_no_temp(tmp_path):
    atomic.write_text(tmp_path / "sub" / "a.txt", "héllo\n")
    atomic.write_bytes(tmp_path / "b.bin", b"\x00\x01")
    atomic.write_json(tmp_path / "c.json", {"path": tmp_path, "n": 1})
    assert (tmp_path / "sub" / "a.txt").read_text(encoding="utf-8") == "héllo\n"
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert json.loads((tmp_path / "c.json").read_text()) == {"path": str(tmp_path), "n": 1}
    assert (tmp_path / "c.json").read_text().endswith("}\n")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a.txt", "b.bin", "c.json", "sub"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temp(tmp_path, monkeypatch):
    target = tmp_path / "doc.json"
    target.write_text("old\n")

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space left"):
        atomic.write_text(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["doc.json"]


def test_an_exception_inside_replacing_keeps_the_old_file(tmp_path):
    target = tmp_path / "weights.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic.replacing(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("writer failed")
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["weights.bin"]


def test_unencodable_json_writes_nothing(tmp_path):
    target = tmp_path / "doc.json"
    target.write_text("{}\n")
    with pytest.raises(ValueError):
        atomic.write_json(target, _cycle())
    assert target.read_text() == "{}\n" and len(list(tmp_path.iterdir())) == 1


def _cycle() -> dict:
    doc: dict = {}
    doc["self"] = doc  # json raises ValueError: Circular reference detected
    return doc


def test_a_process_killed_mid_write_leaves_the_old_file_and_a_sweepable_temp(tmp_path):
    """A real crash: the writer dies (os._exit, no cleanup) after half the new bytes are on disk."""
    target = tmp_path / "report.json"
    target.write_text('{"old": true}\n')
    script = textwrap.dedent("""
        import os, sys
        from xformopt.atomic import replacing
        with replacing(sys.argv[1]) as tmp:
            with open(tmp, "wb") as fh:
                fh.write(b'{"new": ')
                fh.flush()
                os._exit(9)
    """)
    proc = subprocess.run([sys.executable, "-c", script, str(target)], cwd=ROOT, capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert proc.returncode == 9, proc.stderr
    assert json.loads(target.read_text()) == {"old": True}
    leftovers = [p for p in tmp_path.iterdir() if p != target]
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".report.json.tmp-")
    assert leftovers[0].read_bytes() == b'{"new": '
    assert sweep(tmp_path) == leftovers  # the dead writer's temp goes at the next run's sweep
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_the_artifact_and_cache_writers_are_the_atomic_ones():
    from xformopt import artifact, cache

    assert artifact.write_json is atomic.write_json and cache.write_json is atomic.write_json
    assert artifact.temp_sibling is atomic.temp_sibling
