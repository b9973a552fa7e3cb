"""Expensive test fixtures (trained tiny models) built once per test run and shared by every pytest-xdist worker."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def run_shared(tmp_path_factory, name: str, build) -> Path:
    """``build(folder)`` once per test run, whichever pytest-xdist worker asks first; the others wait on a lock
    and read the same folder (expensive fixtures: trained tiny models). Written to a sibling and renamed, so a
    reader never sees half a model. Not kept across runs: a run's workers share their base folder's parent."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "run-shared"
    root.mkdir(exist_ok=True)
    folder = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not folder.is_dir():
            partial = root / f"{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            build(partial)
            partial.rename(folder)
    return folder
