"""The peak-memory meter (xformopt/measure/memory.py) sees real allocations, nested blocks and children."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from xformopt.measure import memory

MB = 1024 * 1024
HAS_PROC = Path("/proc/self/statm").is_file()


def allocate(mb: int, hold: float = 0.3) -> None:
    block = np.ones(mb * MB // 8)  # np.ones writes every page: all of it becomes resident
    time.sleep(hold)  # longer than a sampling interval, so the sampler sees it even when ru_maxrss cannot
    del block


def test_a_measured_allocation_raises_the_peak_by_its_size():
    memory.release()
    with memory.measured("alloc") as peak:
        allocate(200)
    figures = peak.to_dict()
    assert 190 <= figures["peak_delta_mb"] <= 260, figures
    assert figures["peak_rss_mb"] == pytest.approx(figures["start_rss_mb"] + figures["peak_delta_mb"], abs=0.11)
    assert figures["end_rss_mb"] < figures["peak_rss_mb"] - 150  # it was freed again
    assert figures["method"]


def test_a_block_below_the_process_peak_is_still_measured_by_sampling():
    """After a bigger earlier block ru_maxrss cannot tell; the sampler still sees the block's own peak."""
    with memory.measured("big"):
        allocate(300)
    with memory.measured("small") as small:
        allocate(120)
    figures = small.to_dict()
    assert 110 <= figures["peak_delta_mb"] <= 180, figures


def test_nothing_allocated_means_no_rise():
    with memory.measured("idle") as peak:
        time.sleep(0.05)
    assert peak.to_dict()["peak_delta_mb"] < 20


def test_nested_blocks_each_get_their_own_peak():
    with memory.measured("outer") as outer:
        keep = np.ones(100 * MB // 8)
        with memory.measured("inner") as inner:
            allocate(150)
        del keep
    o, i = outer.to_dict(), inner.to_dict()
    assert 140 <= i["peak_delta_mb"] <= 210, i
    assert 240 <= o["peak_delta_mb"] <= 330, o  # the outer block holds 100 MB while the inner one adds 150
    assert o["peak_rss_mb"] >= i["peak_rss_mb"]


@pytest.mark.skipif(not HAS_PROC, reason="live children are found through /proc")
def test_child_processes_are_counted_with_their_memory():
    script = "import time; b = bytearray(150 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); time.sleep(0.6)"
    with memory.measured("child") as peak:
        subprocess.run([sys.executable, "-c", script], check=True)
    figures = peak.to_dict()
    assert figures["child_processes"] >= 1
    assert figures["children_peak_rss_mb"] >= 140
    assert figures["peak_delta_mb"] < 100  # the child's memory is its own, not this process's


def test_release_gives_back_what_reference_cycles_held():
    import gc

    gc.disable()  # as during a pass: the collector has not run yet
    try:
        with memory.measured("cycles") as peak:
            holder: dict = {"data": np.ones(150 * MB // 8)}
            holder["self"] = holder
            time.sleep(0.3)  # held long enough for the sampler, whatever ru_maxrss earlier tests left
            del holder
            before = memory.current_rss_bytes()
            memory.release()
            after = memory.current_rss_bytes()
    finally:
        gc.enable()
    if HAS_PROC:
        assert before - after >= 140 * MB
    assert peak.to_dict()["peak_delta_mb"] >= 120
