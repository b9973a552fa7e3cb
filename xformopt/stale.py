"""Leftovers of runs that died (kill -9, power loss): temp folders whose owner pid is gone.

Every temp name xformopt makes carries its pid (``.NAME.tmp-PID-NS``, ``xformopt-run-PID-...``), so a
later run can tell a dead run's leftovers from a live run's work in progress and remove only those.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

_log = logging.getLogger(__name__)

# .NAME.tmp-PID-NS / .NAME.old-PID (artifacts, cache entries, atomic files) and the run workdirs.
STALE = re.compile(r"^(?:\..+\.(?:tmp|old)-(?P<pid>\d+)(?:-\d+)?|xformopt-run-(?P<run>\d+)-.*)$")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    except (OverflowError, ValueError):
        return False
    return True


def sweep(directory: Path) -> list[Path]:
    """Remove leftovers of dead runs directly inside ``directory``; returns what was removed."""
    removed = []
    try:
        entries = list(Path(directory).iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = STALE.match(entry.name)
        if not match:
            continue
        pid = int(match.group("pid") or match.group("run"))
        if pid == os.getpid() or pid_alive(pid):
            continue
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError:
            continue
        removed.append(entry)
    return removed


def sweep_at_start(*directories: Path) -> None:
    """Sweep the system temp dir and the given folders (an output's parent, the cache root)."""
    for directory in (Path(tempfile.gettempdir()), *directories):
        gone = sweep(directory)
        if gone:
            _log.info(f"removed {len(gone)} leftover temp folder(s) of dead runs in {directory}")


def run_workdir_prefix() -> str:
    return f"xformopt-run-{os.getpid()}-"
