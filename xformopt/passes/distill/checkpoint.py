"""Resumable training state on disk, with no pickle of anything a user could hand us.

A checkpoint is a folder ``current/`` under the run's checkpoint directory:

- ``student.safetensors``: the student's weights now; ``best.safetensors``: at the best evaluation;
- ``optimizer.pt``: AdamW's state dict (tensors, numbers, lists), ``rng.pt``: the torch RNG state,
  both read back with ``torch.load(weights_only=True)``;
- ``state.json``: step, schedule horizon, evaluation history, early-stopping counters, seconds
  spent, and the run identity it belongs to.

Writes are atomic: a new ``next/`` folder is filled, then swapped in for ``current/``. A checkpoint
whose identity differs from the run's (other inputs, other options) is ignored.

Where: ``checkpoint_dir`` when given, else ``<xformopt cache>/distill-checkpoints/<identity>/``
(``$XFORMOPT_CACHE_DIR`` or ``~/.cache/xformopt``). It is removed when the pass finishes.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from xformopt.cache_stores import store

SCHEMA = "xformopt.passes.distill-checkpoint/1"


def default_root(identity: str) -> Path:
    return store("distill-checkpoints") / identity[:24]


def state_dict_cpu(model) -> dict:
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}


def save(root: Path, *, identity: str, student_state: dict, best_state: dict | None, optimizer_state: dict,
         state: dict) -> None:
    import torch
    from safetensors.torch import save_file

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    nxt = root / f"next-{os.getpid()}-{time.monotonic_ns()}"
    nxt.mkdir()
    try:
        save_file(student_state, str(nxt / "student.safetensors"))
        if best_state is not None:
            save_file(best_state, str(nxt / "best.safetensors"))
        torch.save(optimizer_state, nxt / "optimizer.pt")
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        torch.save(rng, nxt / "rng.pt")
        (nxt / "state.json").write_text(json.dumps({"schema": SCHEMA, "identity": identity, **state}, indent=1))
        current, old = root / "current", root / f"old-{os.getpid()}"
        if current.exists():
            current.rename(old)
        nxt.rename(current)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(nxt, ignore_errors=True)
        raise


def load(root: Path, identity: str) -> dict | None:
    """The checkpoint under ``root`` for this run, or None (absent, another run's, or unreadable)."""
    import torch
    from safetensors.torch import load_file

    root = Path(root)
    folder = root / "current"
    if not folder.is_dir():
        olds = sorted(root.glob("old-*")) if root.is_dir() else []  # a crash between the two renames
        if not olds:
            return None
        folder = olds[-1]
    try:
        state = json.loads((folder / "state.json").read_text())
        if state.get("schema") != SCHEMA or state.get("identity") != identity:
            return None
        out = {
            "state": state,
            "student": load_file(str(folder / "student.safetensors")),
            "best": load_file(str(folder / "best.safetensors")) if (folder / "best.safetensors").is_file() else None,
            "optimizer": torch.load(folder / "optimizer.pt", weights_only=True),
            "rng": torch.load(folder / "rng.pt", weights_only=True),
        }
    except (OSError, ValueError, RuntimeError, json.JSONDecodeError):
        return None
    return out


def restore_rng(rng: dict) -> None:
    import torch

    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def remove(root: Path) -> None:
    """Remove what ``save`` wrote (never anything else in a user-given folder), and the folder if then empty."""
    root = Path(root)
    if not root.is_dir():
        return
    for item in [root / "current", *root.glob("next-*"), *root.glob("old-*")]:
        shutil.rmtree(item, ignore_errors=True)
    try:
        root.rmdir()
    except OSError:  # not empty: the user's own files stay
        pass
