"""The stream ladder for decoder servers: for each stream count, one closed-loop level per target (two
targets interleaved, their order alternating from level to level), after a warm-up level of one stream.
A target is a URL or an artifact (served on a free port for the run, as for encoders)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from dataclasses import dataclass

from xformopt import tasks
from xformopt.errors import InputError
from xformopt.loadtest.run import PAUSE_S, Target, _get
from xformopt.loadtest.streams import (
    CHAT_ROUTE,
    COMPLETIONS_ROUTE,
    body_for,
    prompt_texts,
    run_level,
    scaling,
    summarize,
)
from xformopt.measure.host import cpu_model, usable_cpus

_log = logging.getLogger(__name__)

SCHEMA = "xformopt.loadtest.streams/1"
# what an xformopt server's /metrics says about its decode calls: rows, calls, seconds inside them
_DECODE_SAMPLES = {"rows": "xformopt_batch_size_sum", "calls": "xformopt_batch_size_count",
                   "seconds": 'xformopt_decoder_step_seconds_sum{kind="decode"}'}
DECODER_ROUTES = (COMPLETIONS_ROUTE, CHAT_ROUTE)


@dataclass
class StreamOptions:
    streams: list[int]
    duration_s: float = 30.0
    warmup_s: float = 5.0
    max_tokens: int = 128
    prompt_chars: int = 600
    ignore_eos: bool = True
    timeout_s: float = 300.0
    route: str | None = None
    model: str | None = None
    api_key: str | None = None
    seed: int = 0


def serves_text_generation(url: str, route: str | None, api_key: str | None) -> bool:
    """A decoder server: its /info says text-generation, or the route given is a completions route."""
    if route in DECODER_ROUTES:
        return True
    try:
        task = tasks.TASKS.get(json.loads(_get(f"{url}/info", api_key)).get("task"))
    except (OSError, ValueError, AttributeError, TypeError):
        return False
    return task is not None and task.decoder


def _prepare(target: Target, prompts: list[str], options: StreamOptions) -> tuple[str, list[bytes], dict]:
    route = target.route or options.route or COMPLETIONS_ROUTE
    if route not in DECODER_ROUTES:
        raise InputError(f"--route {route}: a decoder load test posts to {' or '.join(DECODER_ROUTES)}")
    headers = {"content-type": "application/json"}
    if options.api_key:
        headers["Authorization"] = f"Bearer {options.api_key}"
    bodies = [body_for(route, p, options.max_tokens, options.ignore_eos, options.model) for p in prompts]
    try:
        target.has_metrics = b"xformopt_batch_size_count" in _get(f"{target.url}/metrics", options.api_key)
    except OSError:
        target.has_metrics = False
    return target.url + route, bodies, headers


def decode_totals(target: Target, api_key: str | None) -> dict | None:
    """Rows, calls and seconds of the server's decode calls so far (an xformopt server's /metrics), or None."""
    if not target.has_metrics:
        return None
    try:
        text = _get(f"{target.url}/metrics", api_key).decode()
    except OSError:
        return None
    totals = {}
    for key, name in _DECODE_SAMPLES.items():
        found = re.search(r"^" + re.escape(name) + r" ([0-9.eE+-]+)$", text, re.MULTILINE)
        if found is None:
            return None
        totals[key] = float(found.group(1))
    return totals


def server_decode(before: dict | None, after: dict | None) -> tuple[float | None, float | None]:
    """(mean rows per decode call, tokens/s inside decode calls: prompt reading and serving excluded)."""
    if not before or not after or after["calls"] <= before["calls"] or after["seconds"] <= before["seconds"]:
        return None, None
    rows = after["rows"] - before["rows"]
    return rows / (after["calls"] - before["calls"]), rows / (after["seconds"] - before["seconds"])


async def _ladder(targets: list[Target], plans: list[tuple], options: StreamOptions) -> None:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for target, (url, bodies, headers) in zip(targets, plans):
            if options.warmup_s > 0:
                _log.info(f"warm-up: {target.label}, 1 stream for {options.warmup_s:g} s")
                await run_level(session, url, bodies, headers, 1, options.warmup_s, options.timeout_s, offset=999)
        for i, streams in enumerate(options.streams):
            order = list(zip(targets, plans))
            for target, (url, bodies, headers) in (order if i % 2 == 0 else order[::-1]):
                await asyncio.sleep(PAUSE_S)
                before = decode_totals(target, options.api_key)
                records, wall = await run_level(session, url, bodies, headers, streams, options.duration_s,
                                                options.timeout_s, offset=i * 101)
                batch, inside = server_decode(before, decode_totals(target, options.api_key))
                level = summarize(records, streams, wall, batch)
                level["server_decode_tokens_per_s"] = None if inside is None else round(inside, 3)
                target.steps.append(level)
                _log.info(f"{target.label} @ {streams} stream(s): {level['ok']} requests, TTFT p50 {level['ttft_p50_ms']} ms, "
                    f"ITL p50/p99 {level['itl_p50_ms']}/{level['itl_p99_ms']} ms, decode "
                    f"{level['aggregate_decode_tokens_per_s']} tok/s together, output {level['output_tokens_per_s']} "
                    f"tok/s, errors {sum(level['errors'].values())}" + (f", mean decode batch {batch:.1f}" if batch else ""))


def run_streams(targets: list[Target], texts: list[str], options: StreamOptions) -> dict:
    prompts = prompt_texts(texts, options.prompt_chars)
    if not prompts:
        raise InputError("no texts to build prompts from; pass --data with a text column")
    plans = [_prepare(t, prompts, options) for t in targets]
    load_before = os.getloadavg()
    started = time.time()
    asyncio.run(_ladder(targets, plans, options))
    document = {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "host": {"cpu": cpu_model(), "usable_cpus": usable_cpus()},
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
        "settings": {"streams": options.streams, "duration_s": options.duration_s, "warmup_s": options.warmup_s,
                     "max_tokens": options.max_tokens, "prompt_chars": options.prompt_chars,
                     "ignore_eos": options.ignore_eos, "prompts": len(prompts), "decoding": "greedy (temperature 0)",
                     "arrivals": "closed loop: each stream sends its next request when the last one ended"},
        "targets": [{"label": t.label, "url": t.url, "route": plan[0], "levels": t.steps, "scaling": scaling(t.steps)}
                    for t, plan in zip(targets, plans)],
        "warnings": [],
    }
    for t in document["targets"]:
        for level in t["levels"]:
            if level["ok"] < level["streams"]:
                document["warnings"].append(f"{t['label']} @ {level['streams']} streams: {level['ok']} requests "
                                            "completed, fewer than the streams; give a longer --duration")
    return document
