"""The artifact directory: written in a temporary sibling, renamed into place only when complete.

An existing output is never replaced without ``force``; a failed run leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from xformopt.errors import InputError

MANIFEST_SCHEMA = "xformopt.manifest/1"


def check_output(out: Path, force: bool) -> None:
    """Fail before any work when the output exists (and --force was not given) or cannot be made."""
    out = Path(out)
    if out.exists() and not force:
        raise InputError(f"output {out} already exists; pass --force to replace it or choose another -o")
    if out.exists() and not out.is_dir():
        raise InputError(f"output {out} exists and is not a directory; remove it or choose another -o")
    parent = out.resolve().parent
    if parent.exists() and not os.access(parent, os.W_OK):
        raise InputError(f"cannot write to {parent}; choose another -o")


@contextmanager
def atomic_dir(out: Path, force: bool) -> Iterator[Path]:
    """Yield an empty temp sibling of ``out``; on success it replaces ``out``, on error it vanishes."""
    out = Path(out)
    check_output(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():  # --force: move the old one aside first so a crash never leaves neither
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def hash_dir(path: Path) -> str:
    """Content hash of a model directory: file names and bytes, in a stable order."""
    digest = hashlib.sha256()
    for file in sorted(p for p in Path(path).rglob("*") if p.is_file() and not p.name.startswith(".")):
        digest.update(str(file.relative_to(path)).encode())
        digest.update(sha256_file(file).encode())
    return digest.hexdigest()


def copy_stage(stage_dir: Path, dst: Path) -> None:
    """Copy a stage's model, tokenizer and config files into the artifact."""
    for item in Path(stage_dir).iterdir():
        if item.name.startswith("."):
            continue
        if item.is_dir():
            shutil.copytree(item, dst / item.name)
        else:
            shutil.copy2(item, dst / item.name)


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def read_manifest(artifact: Path) -> dict:
    path = Path(artifact) / "manifest.json"
    if not path.is_file():
        raise InputError(f"{artifact} is not an xformopt artifact (no manifest.json); pass the -o folder of `xformopt optimize`")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON ({exc.msg}, line {exc.lineno}); re-run optimize") from None
