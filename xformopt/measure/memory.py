"""Peak resident memory of a block of work (a pass, a stage's evaluation), in MB.

Two sources, combined. ``ru_maxrss`` is exact but process-wide: it cannot say which pass reached it,
except that a block after which it is higher than before set a new process peak, and that peak is
the block's, exactly. For every other block a thread samples the RSS (every 10 ms: a spike has to
fault in pages faster than ~5 GB/s to slip between samples by more than a few tens of MB), a lower
bound the record marks as ``sampled``. Linux's resettable high-water mark (writing 5 to
/proc/self/clear_refs) would give every block an exact peak, but it resets ``ru_maxrss`` with it,
so `/usr/bin/time -v` and CI memory monitors would report the last block's peak instead of the
run's: not used. Child processes are not in the parent's RSS: the thread sums the RSS of live
children (Linux), and the children's ``ru_maxrss`` covers those that exited. Hand-written because
psutil (not a dependency) only offers the same sampling, without the exact peak.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

MB = 1024 * 1024
SAMPLE_SECONDS = 0.01
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def current_rss_bytes(pid: int | str = "self") -> int | None:
    """Resident bytes of a process (/proc/PID/statm, Linux), or None where there is no /proc."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def _maxrss_bytes(who: int) -> int:
    value = resource.getrusage(who).ru_maxrss
    return value if sys.platform == "darwin" else value * 1024  # kilobytes on Linux, bytes on macOS


def _children(pid: int | str = "self") -> list[int]:
    """Live descendants of a process (every thread's children, recursively); [] without /proc."""
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                kids = [int(k) for k in handle.read().split()]
        except (OSError, ValueError):
            continue
        for kid in kids:
            found += [kid, *_children(kid)]
    return found


@dataclass
class Peak:
    """One measured block, in bytes. ``to_dict()`` is what manifests and reports record (MB)."""

    label: str
    start: int = 0  # RSS at entry
    end: int = 0
    peak: int = 0  # this process's peak RSS inside the block
    exact: bool = False  # the block set the process's peak: ``peak`` is ru_maxrss, not a sample
    children_peak: int = 0  # largest summed RSS of live children seen, or an exited child's peak
    child_pids: set[int] = field(default_factory=set)
    maxrss_at_start: int = 0
    children_maxrss_at_start: int = 0

    @property
    def method(self) -> str:
        if self.exact:
            return "ru_maxrss (exact: this block set the process's peak)"
        return f"sampled every {SAMPLE_SECONDS * 1000:.0f} ms (a lower bound: the process peaked in an earlier block)"

    def to_dict(self) -> dict:
        return {
            "peak_rss_mb": round(self.peak / MB, 1),
            "start_rss_mb": round(self.start / MB, 1),
            "peak_delta_mb": round((self.peak - self.start) / MB, 1),
            "end_rss_mb": round(self.end / MB, 1),
            "child_processes": len(self.child_pids),
            "children_peak_rss_mb": round(self.children_peak / MB, 1),
            "method": self.method,
        }


class _Tracker:
    """The open blocks of this process and the one thread that samples for them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.open: list[Peak] = []
        self.stop: threading.Event | None = None  # one per sampler thread
        self.thread: threading.Thread | None = None

    def _sample(self, stop: threading.Event) -> None:
        tick = 0
        while not stop.wait(SAMPLE_SECONDS):
            rss = current_rss_bytes()
            kids = _children() if tick % 10 == 0 else None  # children every 100 ms: a /proc walk per thread
            kids_rss = sum(current_rss_bytes(k) or 0 for k in kids) if kids else 0
            tick += 1
            with self.lock:
                for block in self.open:
                    if rss is not None:
                        block.peak = max(block.peak, rss)
                    if kids:
                        block.child_pids.update(kids)
                        block.children_peak = max(block.children_peak, kids_rss)

    def enter(self, label: str) -> Peak:
        with self.lock:
            rss = current_rss_bytes()
            maxrss = _maxrss_bytes(resource.RUSAGE_SELF)
            block = Peak(label, start=rss if rss is not None else maxrss, maxrss_at_start=maxrss,
                         children_maxrss_at_start=_maxrss_bytes(resource.RUSAGE_CHILDREN))
            block.peak = block.start
            self.open.append(block)
            if self.thread is None:
                self.stop = threading.Event()
                self.thread = threading.Thread(target=self._sample, args=(self.stop,), name="xformopt-memory",
                                               daemon=True)
                self.thread.start()
            return block

    def leave(self, block: Peak) -> None:
        with self.lock:
            rss = current_rss_bytes()
            maxrss = _maxrss_bytes(resource.RUSAGE_SELF)
            if maxrss > block.maxrss_at_start or rss is None:
                # A new process peak inside the block is the block's peak (without /proc: all there is).
                block.peak, block.exact = max(block.peak, maxrss), True
            block.end = rss if rss is not None else block.peak
            block.peak = max(block.peak, block.end)
            exited = _maxrss_bytes(resource.RUSAGE_CHILDREN)
            if exited > block.children_maxrss_at_start:  # a child that exited inside the block set a new peak
                block.children_peak = max(block.children_peak, exited)
            self.open.remove(block)
            thread, last = self.thread, not self.open
            if last:
                self.thread = None
                self.stop.set()
        if last and thread is not None:
            thread.join()


_tracker = _Tracker()


@contextmanager
def measured(label: str = ""):
    """``with measured("fuse") as peak: ...``; afterwards ``peak.to_dict()`` holds the block's figures."""
    block = _tracker.enter(label)
    try:
        yield block
    finally:
        _tracker.leave(block)


def process_peak_mb() -> float:
    """This process's lifetime peak RSS (ru_maxrss), MB: what `/usr/bin/time -v` reports for it."""
    return round(_maxrss_bytes(resource.RUSAGE_SELF) / MB, 1)


def release() -> None:
    """Collect what the last step left in reference cycles (sessions, graphs, tensors) and hand freed
    heap pages back to the OS, so the next step starts from what is really still in use."""
    import gc

    gc.collect()
    try:  # glibc keeps freed heap pages mapped (counted in RSS) until asked; absent elsewhere
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
