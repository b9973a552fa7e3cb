"""Advisory locks (flock) on a lock file beside what they protect: one writer per output path and
per cache entry. The kernel drops a flock when its process dies, so a killed run never leaves a
lock that blocks the next one; the lock file itself is harmless and reused.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from xformopt.errors import InputError

_log = logging.getLogger(__name__)


class Lock:
    """An flock on ``path``; the holder's pid is written into the file so a refusal can name it."""

    def __init__(self, path: Path, *, shared: bool = False, unlink: bool = True):
        self.path = Path(path)
        self.shared = shared
        self.unlink = unlink and not shared  # only a sole (exclusive) holder may remove the file
        self.fd: int | None = None

    def acquire(self, *, wait: bool = False) -> bool:
        """Take the lock; False when another process holds it and ``wait`` is off."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        mode = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
        while True:
            try:
                # NOFOLLOW: a symlink planted at the lock path must not make us truncate its target.
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
            except OSError as exc:  # a symlink (ELOOP), a folder, no permission
                raise InputError(f"cannot take the lock {self.path} ({exc.strerror}); remove that path if no "
                                 "xformopt run is using it") from None
            try:
                fcntl.flock(fd, mode if wait else mode | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            except BaseException:
                os.close(fd)
                raise
            # The exclusive holder unlinks the file when it is done; a lock taken on that old inode
            # protects nothing, so take it again on the file now at the path.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        if not self.shared:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            try:
                if self.unlink:  # no lock file is left beside the output once the writer is done
                    self.path.unlink(missing_ok=True)
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def downgrade(self) -> None:
        """Exclusive -> shared, keeping the lock held (a builder becomes one more reader)."""
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_SH)
            self.shared, self.unlink = True, False

    def holder(self) -> int | None:
        try:
            text = self.path.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def __enter__(self) -> Lock:
        if not self.acquire(wait=True):  # pragma: no cover - wait=True blocks instead
            raise RuntimeError("lock not acquired")
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def build_lock(target: Path, busy: str) -> Lock:
    """The held exclusive lock for building ``target`` once (``.NAME.lock`` beside it, kept): when
    another run holds it, ``busy`` (with that run's pid) is logged and this one waits."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = Lock(target.parent / f".{target.name}.lock", unlink=False)
    if not lock.acquire(wait=False):
        _log.info(f"{busy} (pid {lock.holder() or '?'}); waiting for it")
        lock.acquire(wait=True)
    return lock


def output_lock_path(out: Path) -> Path:
    """The lock file beside an output path (hidden, so artifacts and listings stay clean)."""
    out = Path(out).absolute()
    return out.parent / f".{out.name}.lock"


def lock_output(out: Path, *, wait: bool = False) -> Lock:
    """The exclusive lock for writing ``out``; a second writer gets a one-line InputError naming the
    first's pid, or waits for it with ``wait``."""
    lock = Lock(output_lock_path(out))
    if not lock.acquire(wait=wait):
        pid = lock.holder()
        who = f" (pid {pid})" if pid else ""
        raise InputError(f"output {out} is being written by another run{who}; wait for it (or pass --wait) "
                         "or choose another -o")
    return lock


_held: dict[Path, Lock] = {}


class claim_output:
    """Hold ``out``'s lock for a block (re-entrant within this process: the pipeline claims the
    output before its first pass, and the atomic writer inside it finds the claim already held)."""

    def __init__(self, out: Path, *, wait: bool = False):
        self.key = output_lock_path(out)
        self.out, self.wait, self.lock = Path(out), wait, None

    def __enter__(self) -> claim_output:
        if self.key not in _held:
            self.lock = lock_output(self.out, wait=self.wait)
            _held[self.key] = self.lock
        return self

    def __exit__(self, *exc) -> None:
        if self.lock is not None:
            _held.pop(self.key, None)
            self.lock.release()
