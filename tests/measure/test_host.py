"""Tests for xformopt.measure.host."""

from __future__ import annotations

import json
import math
import os
import re

import pytest

from xformopt.measure import host


@pytest.fixture
def affinity(monkeypatch):
    """Set the fake affinity-mask CPU count; also hide this machine's own cgroup paths."""
    monkeypatch.setattr(host, "_own_cgroup_paths", lambda: [])

    def set_count(n):
        monkeypatch.setattr(host, "_affinity_count", lambda: n)

    return set_count


# ----------------------------------------------------------------------------- usable_cpus


def test_cgroup_v2_quota_caps_affinity(tmp_path, affinity):
    affinity(8)
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert host.usable_cpus(tmp_path) == 2  # ceil(1.5)


def test_cgroup_v2_quota_not_above_affinity(tmp_path, affinity):
    affinity(2)
    (tmp_path / "cpu.max").write_text("400000 100000\n")
    assert host.usable_cpus(tmp_path) == 2


def test_cgroup_v2_max_means_affinity(tmp_path, affinity):
    affinity(6)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert host.usable_cpus(tmp_path) == 6


def test_cgroup_small_quota_at_least_one(tmp_path, affinity):
    affinity(4)
    (tmp_path / "cpu.max").write_text("10000 100000\n")
    assert host.usable_cpus(str(tmp_path)) == 1


def test_cgroup_v1_quota(tmp_path, affinity):
    affinity(16)
    d = tmp_path / "cpu"
    d.mkdir()
    (d / "cpu.cfs_quota_us").write_text("250000\n")
    (d / "cpu.cfs_period_us").write_text("100000\n")
    assert host.usable_cpus(tmp_path) == 3


def test_cgroup_v1_quota_at_root(tmp_path, affinity):
    affinity(16)
    (tmp_path / "cpu.cfs_quota_us").write_text("100000\n")
    (tmp_path / "cpu.cfs_period_us").write_text("100000\n")
    assert host.usable_cpus(tmp_path) == 1


def test_cgroup_v1_unlimited(tmp_path, affinity):
    affinity(5)
    d = tmp_path / "cpu,cpuacct"
    d.mkdir()
    (d / "cpu.cfs_quota_us").write_text("-1\n")
    (d / "cpu.cfs_period_us").write_text("100000\n")
    assert host.usable_cpus(tmp_path) == 5


def test_no_cgroup_files(tmp_path, affinity):
    affinity(3)
    assert host.usable_cpus(tmp_path) == 3


def test_garbage_cgroup_file_ignored(tmp_path, affinity):
    affinity(3)
    (tmp_path / "cpu.max").write_text("nonsense\n")
    assert host.usable_cpus(tmp_path) == 3


def test_fallback_to_cpu_count(tmp_path, affinity, monkeypatch):
    affinity(None)
    monkeypatch.setattr(host.os, "cpu_count", lambda: 7)
    assert host.usable_cpus(tmp_path) == 7
    (tmp_path / "cpu.max").write_text("200000 100000\n")
    assert host.usable_cpus(tmp_path) == 2


def test_usable_cpus_real_host_sane():
    n = host.usable_cpus()
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert 1 <= n <= allowed <= os.cpu_count()
    limit = host.cgroup_cpu_limit()
    assert n == (allowed if limit is None else max(1, min(allowed, math.ceil(limit))))


# ----------------------------------------------------------------------------- cpu identity


@pytest.mark.real_host
@pytest.mark.skipif(not os.path.isfile("/proc/cpuinfo"), reason="needs Linux /proc/cpuinfo")
def test_cpu_flags_and_model_match_proc_cpuinfo():
    """This machine's flags and model, read independently from /proc/cpuinfo (first processor)."""
    with open("/proc/cpuinfo", encoding="utf-8") as fh:
        first = fh.read().split("\n\n")[0]
    fields = {}
    for line in first.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    flags = set((fields.get("flags") or fields.get("features") or "").lower().split())
    assert flags and flags <= host.cpu_flags()
    if "model name" in fields:
        assert host.cpu_model() == fields["model name"]
    import platform

    if platform.machine() in ("x86_64", "AMD64"):
        assert "sse2" in host.cpu_flags()  # every x86-64 CPU has it


@pytest.mark.real_host
def test_cpu_flags_parses_cpuinfo(monkeypatch):
    monkeypatch.setattr(
        host,
        "_cpuinfo_text",
        lambda: "processor\t: 0\nmodel name\t: Fake CPU 9000\nflags\t\t: fpu AVX2 avx512f amx_tile\n",
    )
    assert host.cpu_flags() == {"fpu", "avx2", "avx512f", "amx_tile"}
    assert host.cpu_model() == "Fake CPU 9000"


@pytest.mark.real_host
def test_cpu_flags_parses_arm_features(monkeypatch):
    monkeypatch.setattr(
        host,
        "_cpuinfo_text",
        lambda: "processor\t: 0\nFeatures\t: fp asimd asimddp i8mm sve\nCPU part\t: 0xd40\n",
    )
    assert {"asimd", "asimddp", "i8mm", "sve"} <= host.cpu_flags()


def test_stated_host_facts_replace_the_real_ones(monkeypatch):
    """XFORMOPT_CPU_FLAGS replaces /proc/cpuinfo; the INT8 probe follows XFORMOPT_INT8_SATURATES, else unknown."""
    from xformopt import targets
    from xformopt.measure import kernel_probe

    monkeypatch.setattr(host, "_cpuinfo_text", lambda: "flags\t: fpu avx2 avx512f avx512bw avx512_vnni\n")
    monkeypatch.setattr(kernel_probe, "_probe", lambda: True)  # the real kernel would saturate
    monkeypatch.setenv("XFORMOPT_CPU_FLAGS", "AVX2, fma")
    monkeypatch.delenv("XFORMOPT_INT8_SATURATES", raising=False)
    assert host.cpu_flags() == {"avx2", "fma"}
    assert kernel_probe.int8_gemm_saturates() is None  # never half real
    assert host.host_info()["forced_facts"] == {"XFORMOPT_CPU_FLAGS": "AVX2, fma", "XFORMOPT_INT8_SATURATES": None}
    monkeypatch.setenv("XFORMOPT_CPU_FLAGS", "avx2 avx512f avx512bw avx512_vnni")
    monkeypatch.setenv("XFORMOPT_INT8_SATURATES", "1")
    assert kernel_probe.int8_gemm_saturates() is True
    assert targets.detect().name == "avx512"  # VNNI stated but the stated kernel saturates
    monkeypatch.setenv("XFORMOPT_INT8_SATURATES", "0")
    assert targets.detect().name == "avx512_vnni"
    monkeypatch.delenv("XFORMOPT_CPU_FLAGS")
    monkeypatch.delenv("XFORMOPT_INT8_SATURATES")
    assert host.cpu_flags() == {"fpu", "avx2", "avx512f", "avx512bw", "avx512_vnni"}
    assert kernel_probe.int8_gemm_saturates() is True
    assert "forced_facts" not in host.host_info()


# ----------------------------------------------------------------------------- host_info


EXPECTED_KEYS = {
    "cpu_model", "machine", "cpu_flags", "cores_logical", "cores_usable", "memory_total_gb",
    "os", "python", "versions", "onnxruntime_providers",
}


def test_host_info_keys_and_json():
    info = host.host_info()
    assert EXPECTED_KEYS <= set(info)
    assert json.loads(json.dumps(info)) == info
    assert set(info["versions"]) == set(host.LIBRARIES)
    import importlib.metadata
    import platform

    import onnxruntime

    for name in ("torch", "onnxruntime", "numpy"):
        assert info["versions"][name] == importlib.metadata.version(name)
    assert info["machine"] == platform.machine() and info["python"] == platform.python_version()
    assert info["cores_logical"] == os.cpu_count() and info["cores_usable"] == host.usable_cpus()
    if hasattr(os, "sched_getaffinity"):
        assert 1 <= info["cores_usable"] <= len(os.sched_getaffinity(0))
    assert info["onnxruntime_providers"] == onnxruntime.get_available_providers()
    assert "CPUExecutionProvider" in info["onnxruntime_providers"]
    if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
        assert info["memory_total_gb"] == pytest.approx(physical, rel=0.01)


def test_host_info_flags_only_relevant_subset(monkeypatch):
    monkeypatch.setattr(host, "cpu_flags", lambda: {"fpu", "sse2", "avx2", "amx_int8", "avx512_vnni"})
    info = host.host_info()
    assert info["cpu_flags"] == ["amx_int8", "avx2", "avx512_vnni"]


def test_missing_library_reported(monkeypatch):
    monkeypatch.setattr(host, "LIBRARIES", ("definitely-not-a-real-package-xyz",))
    assert host.library_versions() == {"definitely-not-a-real-package-xyz": host.NOT_INSTALLED}


def test_host_info_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys; from xformopt.measure import host; host.host_info(); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------------- fingerprint


def _info(**over):
    info = {
        "cpu_model": "Fake CPU 9000",
        "machine": "x86_64",
        "cpu_flags": ["avx2"],
        "cores_logical": 8,
        "cores_usable": 4,
        "memory_total_gb": 16.0,
        "os": "Linux",
        "python": "3.11.7",
        "versions": {"onnxruntime": "1.32.0", "torch": "2.13.0", "numpy": "2.0.0"},
        "onnxruntime_providers": ["CPUExecutionProvider"],
    }
    info.update(over)
    return info


def test_fingerprint_stable():
    fp = host.host_fingerprint(_info())
    assert fp == host.host_fingerprint(_info())
    assert re.fullmatch(r"[0-9a-f]{8,32}", fp)
    real = host.host_info()
    assert host.host_fingerprint(real) == host.host_fingerprint(json.loads(json.dumps(real)))


def test_fingerprint_changes_with_comparability_fields():
    fp = host.host_fingerprint(_info())
    assert host.host_fingerprint(_info(cores_usable=2)) != fp
    assert host.host_fingerprint(_info(cpu_model="Other CPU")) != fp
    assert host.host_fingerprint(_info(machine="aarch64")) != fp
    v = dict(_info()["versions"], onnxruntime="1.33.0")
    assert host.host_fingerprint(_info(versions=v)) != fp
    v = dict(_info()["versions"], torch="2.14.0")
    assert host.host_fingerprint(_info(versions=v)) != fp


def test_fingerprint_ignores_irrelevant_fields():
    fp = host.host_fingerprint(_info())
    assert host.host_fingerprint(_info(memory_total_gb=32.0, os="Linux-6", python="3.12")) == fp
    v = dict(_info()["versions"], numpy="9.9")
    assert host.host_fingerprint(_info(versions=v)) == fp
