"""Host facts stated instead of read, for reproducing another host's choices and for the test suite.

Which profile ``--target auto`` detects and which INT8 formats quantize picks follow the CPU flags and a
kernel probe (kernel_probe.py). Stating them (``XFORMOPT_CPU_FLAGS="avx2 fma"``, optionally
``XFORMOPT_INT8_SATURATES=1``) makes a run choose as that host would; the suite uses it so it behaves the
same on every CPU. A forced fact replaces the real one, and the probe answers "unknown" when flags are
forced without it, so a stated host is never half real. Reports record the forced facts (host_info).
"""

from __future__ import annotations

import os

FORCED_FLAGS_ENV = "XFORMOPT_CPU_FLAGS"  # space- or comma-separated flags, e.g. "avx2 fma"
FORCED_SATURATES_ENV = "XFORMOPT_INT8_SATURATES"  # "1" / "0": what ORT's INT8 GEMM probe answers


def forced_cpu_flags() -> set[str] | None:
    """The flags stated in ``XFORMOPT_CPU_FLAGS``, or None when the host is to be read."""
    value = os.environ.get(FORCED_FLAGS_ENV)
    if value is None:
        return None
    return {flag for flag in value.replace(",", " ").lower().split() if flag}


def forced_int8_saturates() -> bool | None | str:
    """``XFORMOPT_INT8_SATURATES`` as a bool; None when flags are forced without it; "probe" otherwise."""
    value = os.environ.get(FORCED_SATURATES_ENV)
    if value is not None and value.strip():
        return value.strip().lower() in ("1", "true", "yes")
    return None if forced_cpu_flags() is not None else "probe"
