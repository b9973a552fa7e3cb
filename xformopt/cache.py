"""Finished passes, keyed by a hash of everything that decides their output.

Key = input stage hash + pass name + resolved options + target + task + library versions + the
context the pass ran in (sample texts, threads, CPU, content of data files it reads). Olive's
cache omits library versions; we include them, since a new onnxruntime can fuse differently.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from xformopt.artifact import write_json


def cache_root() -> Path:
    return Path(os.environ.get("XFORMOPT_CACHE_DIR") or Path.home() / ".cache" / "xformopt") / "passes"


def pass_key(input_key: str, name: str, options: dict, target: str, task: str, versions: dict) -> str:
    payload = json.dumps(
        {"input": input_key, "pass": name, "options": options, "target": target, "task": task, "versions": versions},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def lookup(key: str) -> tuple[Path, dict] | None:
    entry = cache_root() / key
    record = entry / ".record.json"
    if not record.is_file():
        return None
    try:
        return entry, json.loads(record.read_text())
    except (json.JSONDecodeError, OSError):  # a damaged entry is a miss, rebuilt below
        shutil.rmtree(entry, ignore_errors=True)
        return None


def build(key: str, run: Callable[[Path], dict]) -> tuple[Path, dict]:
    """Run ``run(tmp_dir)`` and move its output into the cache atomically; the record is written last."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{key}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir()
    try:
        record = run(tmp)
        write_json(tmp / ".record.json", record)
        entry = root / key
        try:
            tmp.rename(entry)
        except OSError:  # a concurrent run finished the same key first: keep theirs
            if not (entry / ".record.json").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return entry, record
