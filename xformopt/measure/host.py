"""Host capture for latency reports.

Latency numbers are only meaningful next to the machine that produced them:
the CPU model and its ISA extensions (AVX-512 VNNI, AMX, ARM i8mm/dot-product)
decide which int8 kernels onnxruntime can use, and the number of CPUs the
process may *really* use (affinity mask and container CPU quota, not the
host's core count) decides the threading. This module records those facts and
derives a fingerprint so a regression gate can refuse to compare reports taken
on different hosts.

Nothing here imports torch: versions are read from package metadata.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path

from xformopt.measure import kernel_probe
from xformopt.measure.forced_host import (
    FORCED_FLAGS_ENV,
    FORCED_SATURATES_ENV,
    forced_cpu_flags,
)

DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup"

# ISA extensions that change which ONNX Runtime / PyTorch kernels run (mostly
# int8 and bf16 GEMM paths). Anything starting with "amx" is kept as well.
RELEVANT_FLAGS = frozenset(
    {
        "avx2",
        "avx512f",
        "avx512bw",
        "avx512_vnni",
        "avx512vnni",
        "avx_vnni",
        "avx512_bf16",
        "asimd",
        "asimddp",
        "i8mm",
        "sve",
    }
)

# The libraries that shape results: recorded in every report and manifest, and part of every cache key.
LIBRARIES = ("xformopt", "torch", "transformers", "optimum", "optimum-onnx", "onnx", "onnxruntime", "numpy")

NOT_INSTALLED = "not installed"


# --------------------------------------------------------------------------- CPUs


def _affinity_count() -> int | None:
    """CPUs in this process's affinity mask, or None where the OS cannot tell."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is None:
        return None
    try:
        return len(getaffinity(0))
    except OSError:
        return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _quota_v2(cpu_max: Path) -> float | None:
    """CPUs allowed by a cgroup v2 ``cpu.max`` file ("quota period" or "max period")."""
    text = _read_text(cpu_max)
    if not text:
        return None
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    try:
        quota = int(parts[0])
        period = int(parts[1]) if len(parts) > 1 else 100_000
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def _quota_v1(directory: Path) -> float | None:
    """CPUs allowed by cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1 = unlimited)."""
    quota_text = _read_text(directory / "cpu.cfs_quota_us")
    period_text = _read_text(directory / "cpu.cfs_period_us")
    if quota_text is None or period_text is None:
        return None
    try:
        quota, period = int(quota_text), int(period_text)
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def _own_cgroup_paths() -> list[str]:
    """Relative cgroup paths of this process (from /proc/self/cgroup) for the cpu controller."""
    text = _read_text(Path("/proc/self/cgroup"))
    if not text:
        return []
    paths = []
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, rel = fields
        if controllers == "" or "cpu" in controllers.split(","):
            rel = rel.strip().lstrip("/")
            if rel:
                paths.append(rel)
    return paths


def cgroup_cpu_limit(cgroup_root: str | os.PathLike[str] = DEFAULT_CGROUP_ROOT) -> float | None:
    """Fractional CPU quota imposed by cgroups (v2 or v1), or None when unlimited/unknown.

    Looks at the root (what a container sees as its own cgroup) and, where
    /proc/self/cgroup names a nested group, at that group too; the tightest wins.
    """
    root = Path(cgroup_root)
    dirs_v1 = [root, root / "cpu", root / "cpu,cpuacct", root / "cpuacct,cpu"]
    dirs_v2 = [root, root / "unified"]
    for rel in _own_cgroup_paths():
        dirs_v2 += [root / rel, root / "unified" / rel]
        dirs_v1 += [d / rel for d in dirs_v1[1:4]]

    limits = []
    for d in dirs_v2:
        q = _quota_v2(d / "cpu.max")
        if q is not None:
            limits.append(q)
    for d in dirs_v1:
        q = _quota_v1(d)
        if q is not None:
            limits.append(q)
    return min(limits) if limits else None


def usable_cpus(cgroup_root: str | os.PathLike[str] = DEFAULT_CGROUP_ROOT) -> int:
    """How many CPUs this process can really use.

    ``os.cpu_count()`` reports the host's cores, which in a container or under
    ``taskset`` overstates what we get; sizing thread pools from it causes
    oversubscription and noisy, pessimistic latencies. We take the affinity
    mask, capped by ceil(cgroup quota / period), never below 1.
    """
    count = _affinity_count()
    if count is None:
        count = os.cpu_count() or 1
    limit = cgroup_cpu_limit(cgroup_root)
    if limit is not None:
        count = min(count, math.ceil(limit))
    return max(1, count)


# --------------------------------------------------------------------------- CPU identity


def _cpuinfo_text() -> str | None:
    return _read_text(Path("/proc/cpuinfo"))


def _sysctl(*names: str) -> str | None:
    try:
        out = subprocess.run(
            ["sysctl", "-n", *names], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def cpu_flags() -> set[str]:
    """All CPU feature flags we can find (lower case); empty set where unknown."""
    forced = forced_cpu_flags()
    if forced is not None:
        return forced
    text = _cpuinfo_text()
    if text:
        flags: set[str] = set()
        for line in text.splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip().lower() in ("flags", "features"):
                flags.update(value.lower().split())
        return flags
    if sys.platform == "darwin":
        out = _sysctl("machdep.cpu.features", "machdep.cpu.leaf7_features")
        if out:
            return set(out.lower().split())
        # Apple silicon exposes features as "hw.optional.<name>: 1" lines instead.
        try:
            listing = subprocess.run(
                ["sysctl", "hw.optional"], capture_output=True, text=True, timeout=5, check=False
            ).stdout
        except (OSError, subprocess.SubprocessError):
            listing = ""
        flags = set()
        for line in listing.splitlines():
            key, _, value = line.partition(":")
            if value.strip() == "1":
                flags.add(key.strip().rsplit(".", 1)[-1].lower())
        return flags
    return set()


def effective_cpu_flags() -> set[str]:
    """The CPU flags, less VNNI when ONNX Runtime's INT8 kernel is seen to saturate anyway.

    The runtime's behaviour is the authority for the quantize formats (see kernel_probe.py).
    """
    flags = cpu_flags()
    if kernel_probe.int8_gemm_saturates():
        flags -= {"avx512_vnni", "avx512vnni", "avx_vnni"}
    return flags


def cpu_model() -> str:
    """Human-readable CPU model string, best effort."""
    text = _cpuinfo_text()
    if text:
        fallback = None
        for line in text.splitlines():
            key, sep, value = line.partition(":")
            if not sep:
                continue
            key = key.strip().lower()
            if key == "model name" and value.strip():
                return value.strip()
            # ARM Linux often has no "model name"; keep an identifying fallback.
            if key in ("hardware", "cpu model", "processor") and value.strip() and fallback is None:
                if not value.strip().isdigit():
                    fallback = value.strip()
        if fallback:
            return fallback
    if sys.platform == "darwin":
        out = _sysctl("machdep.cpu.brand_string")
        if out:
            return out
    return platform.processor() or platform.machine() or "unknown"


# --------------------------------------------------------------------------- host info


def _memory_total_gb() -> float | None:
    text = _read_text(Path("/proc/meminfo"))
    if text:
        for line in text.splitlines():
            if line.startswith("MemTotal:"):
                parts = line.split()
                try:
                    return round(int(parts[1]) * 1024 / 1e9, 2)  # value is in kB
                except (IndexError, ValueError):
                    break
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 2)
    except (AttributeError, ValueError, OSError):
        return None


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        pass
    if dist == "xformopt":
        # Running from a source checkout that was never pip-installed.
        try:
            from xformopt.version import __version__

            return str(__version__)
        except Exception:  # noqa: BLE001
            pass
    return NOT_INSTALLED


def library_versions() -> dict[str, str]:
    """Versions of the libraries that shape results, without importing them."""
    return {name: _version(name) for name in LIBRARIES}


def _ort_providers() -> list[str]:
    try:
        import onnxruntime

        return list(onnxruntime.get_available_providers())
    except Exception:  # noqa: BLE001 - missing or broken install
        return []


def _int8_saturates() -> bool | None:
    return kernel_probe.int8_gemm_saturates()


def host_info() -> dict:
    """JSON-serialisable description of the host, stored next to every latency report."""
    flags = cpu_flags()
    relevant = sorted(f for f in flags if f in RELEVANT_FLAGS or f.startswith("amx"))
    return {
        "cpu_model": cpu_model(),
        "machine": platform.machine(),
        "cpu_flags": relevant,
        "int8_gemm_saturates": _int8_saturates(),
        "cores_logical": os.cpu_count(),
        "cores_usable": usable_cpus(),
        "memory_total_gb": _memory_total_gb(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": library_versions(),
        "onnxruntime_providers": _ort_providers(),
        **({"forced_facts": {FORCED_FLAGS_ENV: os.environ.get(FORCED_FLAGS_ENV),
                             FORCED_SATURATES_ENV: os.environ.get(FORCED_SATURATES_ENV)}}
           if forced_cpu_flags() is not None or os.environ.get(FORCED_SATURATES_ENV) else {}),
    }


# Fields that must match for two latency reports to be comparable.
FINGERPRINT_FIELDS = ("cpu_model", "machine", "cores_usable")
FINGERPRINT_VERSIONS = ("onnxruntime", "torch")


def host_fingerprint(info: dict) -> str:
    """Short stable hash of the comparability-relevant fields of ``host_info()``.

    Only what changes latency materially is included (CPU, usable cores, the
    two runtimes that execute the models), so e.g. a kernel update or a
    transformers bump does not invalidate a stored baseline.
    """
    versions = info.get("versions") or {}
    key = {field: info.get(field) for field in FINGERPRINT_FIELDS}
    key.update({f"{lib}_version": versions.get(lib) for lib in FINGERPRINT_VERSIONS})
    blob = json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]
