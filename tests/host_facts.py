"""The host the suite pretends to run on: CPU flags, the INT8 kernel probe and timing winners, stated.

No test may depend on the CPU it runs on (issue 21). Every test sees the host facts of one profile
(``--host-profile``, default avx2: its 7-bit INT8 formats are exact on every x86 kernel), stated through
xformopt's own forced-facts variables, so subprocesses see them too; and every timing race among candidate
graphs (fuse's ``select: fastest``, quantize's budget candidates, prune's plans) is decided by
``--timing-winner`` (first: the most preferred candidate; last: the least preferred), after the real
timing loop has run. CI reruns the ``host_sensitive`` tests under every profile with ``--timing-winner
last`` (.ci/run). Tests marked ``real_host`` read the real host and must assert what holds for any host.
"""

from __future__ import annotations

import functools
import os
import sys

from xformopt.measure.forced_host import FORCED_FLAGS_ENV, FORCED_SATURATES_ENV
from xformopt.targets import PROFILES, detect, u8s8_saturates

X86_BASE = ("sse4_2", "avx", "avx2", "fma")
ARM_BASE = ("fp", "asimd")
WINNERS = ("first", "last")
TIMERS = ("time_stage_dirs", "time_decoder_dirs")  # every loop that times candidate graphs to pick one


def profile_flags(name: str) -> set[str]:
    """CPU flags of a host that ``name`` is the best profile for (the first spelling of each requirement)."""
    target = PROFILES[name]
    base = ARM_BASE if name.startswith("arm") else X86_BASE
    flags = set(base) | {req.split("|")[0] for req in target.requires}
    assert detect(flags) is target, f"the stated flags of {name} detect {detect(flags).name}"
    return flags


def add_options(parser) -> None:
    group = parser.getgroup("xformopt host facts")
    group.addoption("--host-profile", choices=list(PROFILES), default=os.environ.get("XFORMOPT_TEST_HOST_PROFILE", "avx2"),
                    help="the host profile every test sees (CPU flags + INT8 kernel probe)")
    group.addoption("--timing-winner", choices=WINNERS, default="first",
                    help="which candidate wins every timing race among candidate graphs")


def state_host(config) -> None:
    """Set the forced-facts environment for this process and every subprocess a test starts."""
    flags = profile_flags(config.getoption("--host-profile"))
    os.environ[FORCED_FLAGS_ENV] = " ".join(sorted(flags))
    os.environ[FORCED_SATURATES_ENV] = "1" if u8s8_saturates(flags) else "0"


def check_stated(config) -> None:
    """The facts of --host-profile are what this process states (each pytest-xdist worker states them
    in its own pytest_configure; subprocesses inherit them)."""
    flags = profile_flags(config.getoption("--host-profile"))
    assert os.environ.get(FORCED_FLAGS_ENV) == " ".join(sorted(flags)), (os.environ.get(FORCED_FLAGS_ENV), flags)
    assert os.environ.get(FORCED_SATURATES_ENV) == ("1" if u8s8_saturates(flags) else "0")


def unstate_host(monkeypatch) -> None:
    """For a ``real_host`` test: read this machine's flags and probe."""
    monkeypatch.delenv(FORCED_FLAGS_ENV, raising=False)
    monkeypatch.delenv(FORCED_SATURATES_ENV, raising=False)


def real_cpu_flags() -> set[str]:
    """This machine's own flags, whatever the suite states (for skip conditions of ``real_host`` tests)."""
    from xformopt.measure import host

    stated = os.environ.pop(FORCED_FLAGS_ENV, None)
    try:
        return host.cpu_flags()
    finally:
        if stated is not None:
            os.environ[FORCED_FLAGS_ENV] = stated


def decided(timer, winner: str):
    """``timer`` whose result is rewritten so that ``winner`` (first or last candidate) is the fastest by 2x."""

    @functools.wraps(timer)
    def timed(*args, **kwargs):
        stats = timer(*args, **kwargs)
        if not stats:
            return stats
        names = list(stats)
        chosen = names[0] if winner == "first" else names[-1]
        base = min(s["median_ms"] for s in stats.values())
        for name, s in stats.items():
            factor = (1.0 if name == chosen else 2.0) * base / s["median_ms"]
            for key in [k for k in s if k.endswith("_ms")]:
                s[key] = s[key] * factor
        return stats

    timed.decided_winner = winner
    return timed


def decide_timing_races(winner: str) -> None:
    """Replace every candidate timer, wherever it was imported, by its decided form."""
    import xformopt.decoder.fusion  # noqa: F401  (import the homes of the timers before patching)
    import xformopt.passes.fuse.run  # noqa: F401
    import xformopt.passes.quantize.run  # noqa: F401
    import xformopt.passes.timing  # noqa: F401

    originals = {}
    for module in [m for name, m in list(sys.modules.items()) if name.startswith("xformopt") and m is not None]:
        for attr in TIMERS:
            fn = getattr(module, attr, None)
            if callable(fn) and not hasattr(fn, "decided_winner"):
                originals.setdefault(fn, decided(fn, winner))
                setattr(module, attr, originals[fn])
    assert originals, "no candidate timer found to decide"
