"""Overload and recovery: open-loop load past the sustainable rate for a while, then back at it.

One continuous Poisson schedule: ``over_rps`` for ``over_s`` seconds, then ``full_rps`` (the
sustainable rate) for ``recovery_s`` seconds. What it reports:

- every request's fate: answered (by status: 200, 429 or 503 refused, 504 past its deadline, others),
  **hung** (no answer within the client's timeout) or **lost** (the connection failed or was reset);
- the server's resident memory over time (its /metrics ``process_resident_memory_bytes``, sampled
  every ``RSS_EVERY_S``), against its idle size before the run;
- **recovery**: the time from the end of the overload to the start of the first one-second window
  (by scheduled send time) from which every later window is all-200 with its median latency within
  the bound (the backlog is gone); the same with each window's p99 is reported beside it.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter

import numpy as np

from xformopt.loadtest.generator import Outcome, Request, arrival_times, run_schedule

RSS_EVERY_S = 0.5
WINDOW_S = 1.0
ANSWERED = ("200", "429", "503", "504")  # 429: an encoder server's full queue (TEI's code); 503: a decoder's
_RSS = re.compile(rb"^process_resident_memory_bytes\s+([0-9.eE+-]+)\s*$", re.MULTILINE)


async def resident_bytes(session, metrics_url: str, headers: dict) -> float | None:
    import aiohttp

    try:
        async with session.get(metrics_url, headers=headers, timeout=aiohttp.ClientTimeout(total=5)) as reply:
            found = _RSS.search(await reply.read())
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None
    return float(found.group(1)) if found else None


def recovery_time(outcomes: list[Outcome], end: float, until: float, bound_ms: float, q: float = 50) -> float | None:
    """Seconds after ``end`` (loop time) until every later full window is all-200 with its ``q``-th latency
    percentile within ``bound_ms``."""
    windows = int((until - end) // WINDOW_S)
    good = []
    for k in range(windows):
        lo, hi = end + k * WINDOW_S, end + (k + 1) * WINDOW_S
        inside = [o for o in outcomes if lo <= o.scheduled < hi]
        latency = [(o.done - o.scheduled) * 1000 for o in inside]
        good.append(bool(inside) and all(o.status == "200" for o in inside)
                    and float(np.percentile(latency, q)) <= bound_ms)
    for k in range(windows):
        if all(good[k:]):
            return k * WINDOW_S
    return None


def windows(outcomes: list[Outcome], start: float, until: float) -> list[dict]:
    """Per one-second window (by scheduled send time, from ``start``): requests, 200s, p50 and p99 ms."""
    out = []
    for k in range(int((until - start) // WINDOW_S)):
        lo = start + k * WINDOW_S
        inside = [o for o in outcomes if lo <= o.scheduled < lo + WINDOW_S]
        latency = [(o.done - o.scheduled) * 1000 for o in inside] or [0.0]
        out.append({"t_s": round(k * WINDOW_S, 1), "sent": len(inside), "ok": sum(o.status == "200" for o in inside),
                    "p50_ms": round(float(np.percentile(latency, 50)), 1),
                    "p99_ms": round(float(np.percentile(latency, 99)), 1)})
    return out


def _fates(outcomes: list[Outcome]) -> dict:
    statuses = Counter(o.status for o in outcomes)
    return {"sent": len(outcomes), "by_status": dict(sorted(statuses.items())),
            "hung": statuses.get("timeout", 0),
            "lost": sum(n for s, n in statuses.items() if s not in ANSWERED and s != "timeout")}


async def run(session, request: Request, metrics_url: str | None, headers: dict, over_rps: float, full_rps: float,
              over_s: float, recovery_s: float, p99_ms: float, seed: int, timeout_s: float,
              concurrency_limit: int | None = None, idle_bytes: float | None = None) -> dict:
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    over = arrival_times(over_rps, over_s, rng)
    back = [over_s + t for t in arrival_times(full_rps, recovery_s, rng)]
    before = await resident_bytes(session, metrics_url, headers) if metrics_url else None
    samples: list[tuple[float, float]] = []
    start = loop.time() + 0.1
    stop = asyncio.Event()

    async def sample_memory() -> None:
        while not stop.is_set():
            value = await resident_bytes(session, metrics_url, headers)
            if value is not None:
                samples.append((round(loop.time() - start, 2), value))
            try:
                await asyncio.wait_for(stop.wait(), RSS_EVERY_S)
            except asyncio.TimeoutError:
                pass

    sampler = asyncio.create_task(sample_memory()) if metrics_url else None
    outcomes = await run_schedule(session, request, over + back, concurrency_limit, timeout_s, start=start)
    stop.set()
    if sampler is not None:
        await sampler
    end = start + over_s
    in_over = [o for o in outcomes if o.scheduled < end]
    in_back = [o for o in outcomes if o.scheduled >= end]
    lag = np.array([(o.started - o.scheduled) * 1000 for o in outcomes]) if outcomes else np.zeros(1)
    idle = idle_bytes or before
    peak = max((v for _, v in samples), default=None)
    until = start + over_s + recovery_s
    # Recovered: the backlog is gone (every window all-200, its median within the bound). A one-second
    # window holds ~100 requests, so its p99 is its slowest one: also reported, not the check.
    recovered = recovery_time(outcomes, end, until, p99_ms, q=50)
    recovered_p99 = recovery_time(outcomes, end, until, p99_ms, q=99)
    return {
        "over_rps": over_rps, "full_rps": full_rps, "over_s": over_s, "recovery_s_run": recovery_s, "p99_ms": p99_ms,
        "overload": {**_fates(in_over), "achieved_200_rps": round(sum(o.status == "200" for o in in_over) / over_s, 2)},
        "recovery": {**_fates(in_back), "recovered_after_s": recovered, "p99_recovered_after_s": recovered_p99,
                     "windows": windows(outcomes, end, until)},
        "lost": _fates(outcomes)["lost"], "hung": _fates(outcomes)["hung"],
        "memory": {"idle_bytes": idle, "before_bytes": before, "peak_bytes": peak,
                   "peak_over_idle": round(peak / idle, 3) if peak and idle else None,
                   "samples": [[t, round(v / 2**20, 1)] for t, v in samples]},
        "client_lag_p99_ms": round(float(np.percentile(lag, 99)), 3),
    }


def verdict(result: dict, memory_factor: float = 1.5, recover_within_s: float = 5.0) -> dict:
    """The checks of an overload run, each True/False (None: not measurable, e.g. no /metrics)."""
    ratio = result["memory"]["peak_over_idle"]
    recovered = result["recovery"]["recovered_after_s"]
    return {"none_lost_or_hung": result["lost"] == 0 and result["hung"] == 0,
            f"memory_within_{memory_factor:g}x_idle": None if ratio is None else ratio <= memory_factor,
            f"recovered_within_{recover_within_s:g}s": recovered is not None and recovered <= recover_within_s}
