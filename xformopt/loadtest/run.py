"""The rate ladder: for each offered rate, one open-loop step per target (two targets interleaved,
their order alternating from rate to rate, so drift on a shared host hits both alike), after one
warm-up step. A target is a server URL (an artifact is served first: loadtest/targets.py).

What each request sends comes from the server's /info (its task: /v1/embeddings for embedders,
/predict otherwise); ``route``/``field`` override it for servers without /info (another server
compared with ``--compare``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
import urllib.request
from dataclasses import dataclass, field

from xformopt import tasks
from xformopt.errors import InputError
from xformopt.loadtest import overload
from xformopt.loadtest.generator import Request, json_bodies, run_step
from xformopt.loadtest.report import LAG_LIMIT_MS, SCHEMA, summarize, sustainable
from xformopt.measure.host import cpu_model, usable_cpus

_log = logging.getLogger(__name__)

PAUSE_S = 1.0  # between steps, so one step's backlog does not spill into the next


@dataclass
class Target:
    url: str
    label: str
    route: str | None = None  # overrides --route / /info for this target
    field_name: str | None = None
    as_list: bool = False  # send each text as a one-element list (servers that take only lists)
    request: Request | None = None
    has_metrics: bool = False
    idle_bytes: float | None = None  # resident memory before any load (from /metrics)
    overload: dict | None = None
    steps: list[dict] = field(default_factory=list)
    done: bool = False  # past the knee: two steps in a row over the bound


@dataclass
class Options:
    rates: list[float]
    duration_s: float = 10.0
    warmup_s: float = 3.0
    p99_ms: float = 50.0
    concurrency_limit: int | None = None
    timeout_s: float = 30.0
    seed: int = 0
    route: str | None = None
    field_name: str | None = None
    model: str | None = None
    api_key: str | None = None
    full_ladder: bool = False  # keep going past the knee
    overload_factor: float | None = None  # after the ladder: this many times the sustainable rate ...
    overload_rps: float | None = None  # ... or this rate
    overload_s: float = 60.0
    recovery_s: float = 15.0


def _get(url: str, api_key: str | None, timeout: float = 10.0) -> bytes:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return reply.read()


def describe(target: Target, texts: list, options: Options) -> None:
    """Fill in what the target's requests send, from its /info where it has one."""
    task = None
    try:
        task = json.loads(_get(f"{target.url}/info", options.api_key)).get("task")
    except (OSError, ValueError):
        pass
    serving = getattr(tasks.TASKS.get(task), "serving", None)  # None: not an xformopt encoder server
    route, name = (serving.routes[0], serving.field) if serving else (None, None)
    route = target.route or options.route or route
    name = target.field_name or options.field_name or name
    if route is None:
        raise InputError(f"{target.url} has no xformopt /info; pass --route PATH and --field NAME for it")
    headers = {"content-type": "application/json"}
    if options.api_key:
        headers["Authorization"] = f"Bearer {options.api_key}"
    extra = {"model": options.model} if options.model else {}
    if serving and serving.structured and not all(isinstance(t, dict) for t in texts):
        raise InputError(f"a {task} server needs --data rows with {serving.structured}")
    target.request = Request(target.url + route, json_bodies(texts, name, as_list=target.as_list, extra=extra), headers)
    try:
        target.has_metrics = b"xformopt_batch_size_count" in _get(f"{target.url}/metrics", options.api_key)
    except OSError:
        target.has_metrics = False


_SAMPLE = re.compile(rb"^xformopt_batch_size_(sum|count)\s+([0-9.eE+-]+)\s*$", re.MULTILINE)


def batch_totals(target: Target, api_key: str | None) -> tuple[float, float] | None:
    """(rows, session calls) so far, from the server's /metrics."""
    if not target.has_metrics:
        return None
    try:
        values = dict(_SAMPLE.findall(_get(f"{target.url}/metrics", api_key)))
    except OSError:
        return None
    return float(values.get(b"sum", 0)), float(values.get(b"count", 0))


async def ladder(targets: list[Target], options: Options) -> None:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        for target in targets:
            if target.has_metrics:
                target.idle_bytes = await overload.resident_bytes(session, f"{target.url}/metrics", _auth(options))
            _log.info(f"warm-up: {target.label} at {options.rates[0]:g} req/s for {options.warmup_s:g} s")
            await run_step(session, target.request, options.rates[0], options.warmup_s, options.seed + 999,
                           options.concurrency_limit, options.timeout_s)
        for i, rate in enumerate(options.rates):
            for target in (targets if i % 2 == 0 else targets[::-1]):
                if target.done:
                    continue
                await asyncio.sleep(PAUSE_S)
                before = batch_totals(target, options.api_key)
                outcomes = await run_step(session, target.request, rate, options.duration_s, options.seed + i,
                                          options.concurrency_limit, options.timeout_s)
                after = batch_totals(target, options.api_key)
                batch = None
                if before and after and after[1] > before[1]:
                    batch = (after[0] - before[0]) / (after[1] - before[1])
                step = summarize(outcomes, rate, options.duration_s, batch)
                target.steps.append(step)
                _log.info(f"{target.label} @ {rate:g} req/s: achieved {step['achieved_rps']:g}, p50 {step['p50_ms']:g} ms, "
                    f"p99 {step['p99_ms']:g} ms, errors {sum(step['errors'].values())}"
                    + (f", mean batch {batch:.1f}" if batch else "")
                    + (" (client-bound: its send lag was high)" if step["client_bound"] else ""))
                over = [s["p99_ms"] > options.p99_ms or s["errors"] for s in target.steps[-2:]]
                if not options.full_ladder and len(over) == 2 and all(over):
                    target.done = True
                    _log.info(f"{target.label}: two rates past the bound; its ladder stops here")
        if options.overload_factor or options.overload_rps:
            await asyncio.sleep(PAUSE_S * 3)
            await _overload(session, targets[0], options)


def _auth(options: Options) -> dict:
    return {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}


async def _overload(session, target: Target, options: Options) -> None:
    full = sustainable(target.steps, options.p99_ms) or options.rates[0]
    over = options.overload_rps or full * options.overload_factor
    _log.info(f"overload: {target.label} at {over:g} req/s for {options.overload_s:g} s, then {full:g} req/s for "
        f"{options.recovery_s:g} s")
    result = await overload.run(session, target.request, f"{target.url}/metrics" if target.has_metrics else None,
                                _auth(options), over, full, options.overload_s, options.recovery_s, options.p99_ms,
                                options.seed + 7777, options.timeout_s, options.concurrency_limit, target.idle_bytes)
    result["checks"] = overload.verdict(result)
    target.overload = result
    memory = result["memory"]
    _log.info(f"overload: lost {result['lost']}, hung {result['hung']}, statuses {result['overload']['by_status']}; memory "
        f"peak/idle {memory['peak_over_idle']}; recovered after {result['recovery']['recovered_after_s']} s")


def run(targets: list[Target], texts: list, options: Options) -> dict:

    for target in targets:
        describe(target, texts, options)
    load_before = os.getloadavg()
    started = time.time()
    asyncio.run(ladder(targets, options))
    document = {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "host": {"cpu": cpu_model(), "usable_cpus": usable_cpus()},
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
        "settings": {"rates": options.rates, "duration_s": options.duration_s, "warmup_s": options.warmup_s,
                     "overload_factor": options.overload_factor, "overload_rps": options.overload_rps,
                     "overload_s": options.overload_s, "recovery_s": options.recovery_s,
                     "p99_ms": options.p99_ms, "concurrency_limit": options.concurrency_limit, "seed": options.seed,
                     "inputs": len(texts), "arrivals": "poisson (open loop)"},
        "targets": [{"label": t.label, "url": t.url, "route": t.request.url, "steps": t.steps,
                     "sustainable_rps": sustainable(t.steps, options.p99_ms),
                     **({"overload": t.overload} if t.overload else {})} for t in targets],
        "warnings": [],
    }
    for t in targets:
        bound = [s["offered_rps"] for s in t.steps if s["client_bound"]]
        if bound:
            document["warnings"].append(f"{t.label}: the client itself lagged (p99 send lag over the limit) at "
                                        f"{', '.join(f'{r:g}' for r in bound)} req/s; those steps measure the client "
                                        "as much as the server (run the client on another machine)")
        if t.overload and t.overload["client_lag_p99_ms"] > LAG_LIMIT_MS:
            document["warnings"].append(f"{t.label}: the client lagged during the overload run (p99 send lag "
                                        f"{t.overload['client_lag_p99_ms']:g} ms): it offered less than asked")
    if len(targets) == 2:
        a, b = (t["sustainable_rps"] for t in document["targets"])
        document["comparison"] = {"labels": [t.label for t in targets],
                                  "ratio": round(a / b, 2) if a and b else None}
    return document
