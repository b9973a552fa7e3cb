"""Finished passes, keyed by a hash of everything that decides their output, stored so that they
verify themselves.

Key = input stage hash + pass name + resolved options + target + task + library versions + the
context the pass ran in (sample texts, threads, CPU, content of data files it reads) + what the model's
family decides for it (``Pass.cache_facts``: an export's default exporter). Olive's
cache omits library versions; we include them, since a new onnxruntime can fuse differently.

How an entry is stored: a folder ``<root>/<key>/`` holding the pass's files and ``.entry.json``
(written last) with the pass record and the size and sha256 of every file. Entries are built in
a ``.<key>.tmp-PID-NS`` folder and renamed into place (atomic publish), under an exclusive flock on
``locks/<key>.lock`` (beside the entries' folder) so two runs never build one key at once (the second waits, then reuses). Reuse
re-hashes every file: an entry edited, truncated or half-deleted after the fact is logged, evicted
and recomputed, never served. A run holds a shared lock on the entries it uses, so
``xformopt cache prune|clear`` skips them rather than deleting them under it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from xformopt.artifact import sha256_file
from xformopt.atomic import temp_sibling, write_json
from xformopt.locks import Lock
from xformopt.stale import sweep

_log = logging.getLogger(__name__)

ENTRY_SCHEMA = "xformopt.cache/1"
ENTRY_FILE = ".entry.json"


def cache_root() -> Path:
    return Path(os.environ.get("XFORMOPT_CACHE_DIR") or Path.home() / ".cache" / "xformopt") / "passes"


def pass_key(input_key: str, name: str, options: dict, target: str, task: str, versions: dict) -> str:
    payload = json.dumps(
        {"input": input_key, "pass": name, "options": options, "target": target, "task": task, "versions": versions},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def lock_dir() -> Path:
    """Entry locks live beside the entries' folder, not in it, so the folder holds entries only."""
    return cache_root().parent / "locks"


def entry_lock(key: str, *, shared: bool = False) -> Lock:
    return Lock(lock_dir() / f"{key}.lock", shared=shared, unlink=False)


# --------------------------------------------------------------------------- pins (shared locks)

_pins: list[list[Lock]] = []


@contextmanager
def session() -> Iterator[None]:
    """Entries looked up or built inside this block stay pinned (shared-locked) until it ends."""
    _pins.append([])
    try:
        yield
    finally:
        for lock in _pins.pop():
            lock.release()


def _pin(key: str, lock: Lock, *, held: bool = False) -> None:
    """Keep ``lock`` (shared; an exclusive one is downgraded) until the session ends, or release it
    now outside a session."""
    if not _pins:
        lock.release()
        return
    if not held:
        lock.downgrade()
    _pins[-1].append(lock)


def _unpin_own(key: str) -> None:
    name = f"{key}.lock"
    for pins in _pins:
        for lock in [p for p in pins if p.path.name == name]:
            lock.release()
            pins.remove(lock)


# --------------------------------------------------------------------------- files and verification


def entry_files(directory: Path) -> dict[str, dict]:
    """Every file under an entry (but its .entry.json): relative path -> size and sha256."""
    files = {}
    for path in sorted(Path(directory).rglob("*")):
        if path.is_file() and path.name != ENTRY_FILE:
            files[str(path.relative_to(directory))] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    return files


def read_entry(entry: Path) -> dict | None:
    try:
        data = json.loads((entry / ENTRY_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and data.get("schema") == ENTRY_SCHEMA else None


def problem(entry: Path, *, deep: bool = True) -> str | None:
    """Why an entry cannot be served (missing/damaged .entry.json, a file missing, added, resized or
    changed), or None when every file matches its recorded sha256 (sizes only when not ``deep``)."""
    meta = read_entry(entry)
    if meta is None:
        return f"no readable {ENTRY_FILE} (an unfinished or older-format entry)"
    recorded = meta.get("files")
    if not isinstance(recorded, dict) or not isinstance(meta.get("record"), dict):
        return f"{ENTRY_FILE} lacks its file list or record"
    present = {str(p.relative_to(entry)) for p in Path(entry).rglob("*") if p.is_file() and p.name != ENTRY_FILE}
    if missing := sorted(set(recorded) - present):
        return f"{missing[0]} is missing"
    if extra := sorted(present - set(recorded)):
        return f"{extra[0]} was added after the entry was stored"
    for name, info in recorded.items():
        path = Path(entry) / name
        if path.stat().st_size != info.get("size"):
            return f"{name} changed size ({path.stat().st_size} bytes, stored {info.get('size')})"
        if deep and sha256_file(path) != info.get("sha256"):
            return f"{name} does not match its stored sha256"
    return None


def evict(entry: Path) -> None:
    """Remove an entry (a folder, or a store's file): renamed away first (so nobody sees it half-deleted), then
    deleted."""
    gone = temp_sibling(entry)
    try:
        Path(entry).rename(gone)
    except FileNotFoundError:
        return
    if gone.is_dir():
        shutil.rmtree(gone, ignore_errors=True)
    else:
        gone.unlink(missing_ok=True)


# --------------------------------------------------------------------------- lookup and build


def lookup(key: str) -> tuple[Path, dict] | None:
    """A verified entry (path, pass record), or None; a corrupt entry is logged and evicted."""
    entry = cache_root() / key
    if not entry.is_dir():
        return None
    pin = entry_lock(key, shared=True)
    pin.acquire(wait=True)  # waits while another run builds or evicts this key
    why = problem(entry) if entry.is_dir() else "gone"
    if why is None:
        meta = read_entry(entry)
        _pin(key, pin, held=True)
        try:
            os.utime(entry)  # last use, for `xformopt cache prune --older-than`
        except OSError:
            pass
        return entry, meta["record"]
    pin.release()
    if why == "gone":
        return None
    _unpin_own(key)  # our own earlier pin on this key would block the eviction below
    with entry_lock(key):
        if entry.is_dir() and (why := problem(entry)) is not None:  # still bad under the lock
            _log.info(f"cache entry {key} is corrupt ({why}); evicted, recomputing")
            evict(entry)
    if why is not None:
        return None
    return lookup(key)  # another run rebuilt it while we waited


def build(key: str, run: Callable[[Path], dict], meta: dict | None = None) -> tuple[Path, dict]:
    """Run ``run(tmp_dir)`` and publish its output as entry ``key``: files hashed, .entry.json
    written last, one rename. Another run building the same key is waited for, then reused."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    _unpin_own(key)
    lock = entry_lock(key)
    if not lock.acquire(wait=False):
        _log.info(f"cache entry {key} is being built by another run (pid {lock.holder() or '?'}); waiting for it")
        lock.acquire(wait=True)
    try:
        entry = root / key
        if entry.is_dir():
            if problem(entry) is None:
                meta_doc = read_entry(entry)
                _pin(key, lock)
                lock = None
                return entry, meta_doc["record"]
            _log.info(f"cache entry {key} is corrupt ({problem(entry)}); evicted, recomputing")
            evict(entry)
        sweep(root)
        tmp = temp_sibling(entry)
        tmp.mkdir()
        try:
            record = run(tmp)
            doc = {
                "schema": ENTRY_SCHEMA,
                "key": key,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                **(meta or {}),
                "record": record,
                "files": entry_files(tmp),
            }
            write_json(tmp / ENTRY_FILE, doc)
            tmp.rename(entry)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _pin(key, lock)
        lock = None
        return entry, record
    finally:
        if lock is not None:
            lock.release()


# --------------------------------------------------------------------------- listing and pruning


def entries() -> list[Path]:
    root = cache_root()
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def size_of(entry: Path) -> int:
    """Bytes of a folder's files, or of one file."""
    entry = Path(entry)
    if entry.is_file():
        return entry.stat().st_size
    return sum(p.stat().st_size for p in entry.rglob("*") if p.is_file())


def describe(entry: Path, *, deep: bool = False) -> dict:
    meta = read_entry(entry) or {}
    stat = entry.stat()
    why = problem(entry, deep=deep)
    return {
        "key": entry.name,
        "pass": meta.get("pass"),
        "created": meta.get("created"),
        "last_used": datetime.fromtimestamp(stat.st_mtime, timezone.utc).isoformat(timespec="seconds"),
        "age_s": max(0.0, time.time() - stat.st_mtime),
        "size_bytes": size_of(entry),
        "files": len(meta.get("files") or {}),
        "ok": why is None,
        "problem": why,
        "path": str(entry),
    }


def remove_if_unused(entry: Path) -> bool:
    """Evict an entry unless a run holds it (pinned or being rebuilt); True when removed."""
    lock = entry_lock(entry.name)
    if not lock.acquire(wait=False):
        return False
    try:
        evict(entry)
        (lock_dir() / f"{entry.name}.lock").unlink(missing_ok=True)
    finally:
        lock.release()
    return True
