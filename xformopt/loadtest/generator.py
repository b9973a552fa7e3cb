"""One step of open-loop load: requests sent at Poisson arrival times for ``duration`` seconds.

Latency is measured from each request's *scheduled* send time, not from when the client got round to
sending it (wrk2's correction for coordinated omission), and the client records how late it sent
each request (its lag): when that lag is large, the client, not the server, set the pace, and the
step says so. ``concurrency_limit`` caps requests in flight; a request waiting for a slot keeps its
scheduled time, so the wait counts as latency.

aiohttp: one event loop sends thousands of requests a second with it; httpx's async client costs
several times more CPU per request, which on a small host would make the client the bottleneck.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field


@dataclass
class Outcome:
    scheduled: float  # when the open-loop schedule said to send it
    started: float  # when the client got to it (started - scheduled: the client's own lag)
    done: float
    status: str  # "200", "503", ..., or "timeout" / "error:ClassName"


@dataclass
class Request:
    """What one request sends: POST ``url`` with ``body`` (JSON bytes) and ``headers``."""

    url: str
    bodies: list[bytes]
    headers: dict = field(default_factory=dict)


def arrival_times(rate: float, duration: float, rng: random.Random) -> list[float]:
    """Offsets (s) of a Poisson process at ``rate`` per second over ``duration`` seconds."""
    times, t = [], rng.expovariate(rate)
    while t < duration:
        times.append(t)
        t += rng.expovariate(rate)
    return times


async def run_step(session, request: Request, rate: float, duration: float, seed: int,
                   concurrency_limit: int | None = None, timeout_s: float = 30.0) -> list[Outcome]:
    offsets = arrival_times(rate, duration, random.Random(seed))
    return await run_schedule(session, request, offsets, concurrency_limit, timeout_s)


async def run_schedule(session, request: Request, offsets: list[float], concurrency_limit: int | None = None,
                       timeout_s: float = 30.0, start: float | None = None) -> list[Outcome]:
    """One request at each offset (s) after ``start`` (loop time; default: now), open loop."""
    import aiohttp

    slots = asyncio.Semaphore(concurrency_limit) if concurrency_limit else None
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    loop = asyncio.get_running_loop()
    outcomes: list[Outcome] = []

    async def one(scheduled: float, body: bytes) -> None:
        started = loop.time()
        if slots is not None:
            await slots.acquire()
        try:
            async with session.post(request.url, data=body, headers=request.headers, timeout=timeout) as reply:
                await reply.read()
                status = str(reply.status)
        except asyncio.TimeoutError:
            status = "timeout"
        except aiohttp.ClientError as exc:
            status = f"error:{type(exc).__name__}"
        finally:
            if slots is not None:
                slots.release()
        outcomes.append(Outcome(scheduled, started, loop.time(), status))

    start = loop.time() + 0.05 if start is None else start
    tasks = []
    for k, offset in enumerate(offsets):
        scheduled = start + offset
        delay = scheduled - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(scheduled, request.bodies[k % len(request.bodies)])))
    await asyncio.gather(*tasks)
    return outcomes


def json_bodies(texts: list, field_name: str, as_list: bool, extra: dict | None = None) -> list[bytes]:
    return [json.dumps({field_name: [t] if as_list else t, **(extra or {})}).encode() for t in texts]

