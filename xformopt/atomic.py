"""Atomic file writes: every reader sees the old file or the whole new one, never a part.

The bytes go to a temp file in the same folder (a rename is atomic only within one file system),
are fsynced, and ``os.replace`` puts them in place; the folder is fsynced after, so a power loss
does not undo the rename. A failed write removes its temp file; a killed process leaves one named
``.NAME.tmp-PID-NS``, which :func:`xformopt.stale.sweep` removes once that pid is gone.
Folder-level publishing (a whole artifact or cache entry) is ``xformopt.artifact.atomic_dir``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def temp_sibling(path: Path, kind: str = "tmp") -> Path:
    """``.NAME.tmp-PID-NS`` beside ``path``: the pid lets a later run sweep it if this one dies."""
    path = Path(path)
    return path.parent / f".{path.name}.{kind}-{os.getpid()}-{time.monotonic_ns()}"


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # not every platform / file system lets a folder be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """Yield a temp path beside ``path`` for a writer that takes a file name (safetensors, onnx);
    when the block ends normally the file written there replaces ``path``, otherwise it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def write_bytes(path: Path, data: bytes) -> None:
    with replacing(path) as tmp, open(tmp, "xb") as fh:
        fh.write(data)


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, data, *, indent: int | None = 2) -> None:
    """``data`` as JSON (objects json cannot encode are written as their ``str``), newline-terminated."""
    # Encoded before the temp file exists: an unencodable value fails with nothing written.
    write_text(path, json.dumps(data, indent=indent, default=str) + "\n")
