"""The suite's own set-up holds in whichever process runs a test (each pytest-xdist worker included):
the host facts of --host-profile are stated, every timing race is decided by --timing-winner, the GEMM
peak folder is the run's shared one, and the workers split the cores for torch."""

from __future__ import annotations

import os

import host_facts
import pytest

from xformopt.measure.forced_host import FORCED_FLAGS_ENV, FORCED_SATURATES_ENV
from xformopt.targets import u8s8_saturates

pytestmark = pytest.mark.host_sensitive


def test_this_process_states_the_host_profile(pytestconfig):
    flags = host_facts.profile_flags(pytestconfig.getoption("--host-profile"))
    assert os.environ[FORCED_FLAGS_ENV] == " ".join(sorted(flags))
    assert os.environ[FORCED_SATURATES_ENV] == ("1" if u8s8_saturates(flags) else "0")


def test_this_process_decides_timing_races_by_the_option(pytestconfig):
    import xformopt.decoder.fusion as decoder_fusion
    import xformopt.passes.stage_runs as stage_runs
    import xformopt.passes.timing as timing

    winner = pytestconfig.getoption("--timing-winner")
    assert timing.time_stage_dirs.decided_winner == winner
    assert stage_runs.time_stage_dirs.decided_winner == winner  # imported by name: replaced there too
    assert decoder_fusion.time_decoder_dirs.decided_winner == winner


def test_the_gemm_peak_folder_is_shared_and_the_pass_cache_is_not(isolated_cache, shared_gemm_peak):
    from xformopt.cache import cache_root
    from xformopt.profiling.peak import peak_dir

    assert cache_root() == isolated_cache / "passes"
    assert peak_dir().resolve() == shared_gemm_peak.resolve()


def test_xdist_workers_split_the_cores_for_torch():
    import torch
    from conftest import torch_threads_share

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:  # each test starts with the worker's share, whatever an earlier test set
        assert torch.get_num_threads() == torch_threads_share() == max(1, len(os.sched_getaffinity(0)) // workers)
