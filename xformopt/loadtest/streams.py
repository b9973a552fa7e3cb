"""Load for decoders: a fixed number of concurrent streams (closed loop), at a ladder of stream counts.

Why closed loop here, when the encoder ladder is open loop: a generation lasts seconds, and the
question a decoder server answers is "how fast does each of N users' text arrive, and how much text
per second do N users get together" (the done-when is stated at N concurrent streams; vLLM's
``--max-concurrency`` and llama.cpp's server bench ask it the same way). An offered-rate ladder would
mix queueing into that number. Nothing is hidden by the closed loop: queueing shows in time to first
token, measured from the send, and every stall of a running stream shows in its inter-token gaps.

Each of N users sends a streamed request (a prompt cut from real text, ``max_tokens`` new tokens,
greedy), reads it to the end, and sends the next, until the level's duration has passed; requests
still streaming then are read to their end. Per request: time to first token (send to the first
chunk carrying text), the gaps between text chunks (inter-token latency), the completion tokens (from
the usage chunk when the server sends one, else the chunks counted), and its decode rate: tokens
after the first over the time from first to last token.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import numpy as np

CHAT_ROUTE, COMPLETIONS_ROUTE = "/v1/chat/completions", "/v1/completions"


@dataclass
class StreamRecord:
    user: int
    sent: float
    first: float | None = None
    gaps: list[float] = field(default_factory=list)
    last: float | None = None
    done: float | None = None
    tokens: int = 0  # completion tokens
    chunks: int = 0  # chunks that carried text
    prompt_tokens: int | None = None
    finish: str | None = None
    status: str = "200"

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.sent

    @property
    def decode_rate(self) -> float | None:
        """Tokens after the first, per second from the first to the last text chunk."""
        if self.first is None or self.last is None or self.last <= self.first or self.tokens < 2:
            return None
        return (self.tokens - 1) / (self.last - self.first)


def body_for(route: str, text: str, max_tokens: int, ignore_eos: bool, model: str | None) -> bytes:
    body = {"max_tokens": max_tokens, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True
    if model:
        body["model"] = model
    if route == CHAT_ROUTE:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return json.dumps(body).encode()


def _text_of(event: dict) -> str | None:
    choices = event.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    return choice.get("text") if "text" in choice else (choice.get("delta") or {}).get("content")


async def one_stream(session, url: str, body: bytes, headers: dict, user: int, timeout_s: float) -> StreamRecord:
    import aiohttp

    loop = asyncio.get_running_loop()
    record = StreamRecord(user, loop.time())
    try:
        async with session.post(url, data=body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as reply:
            record.status = str(reply.status)
            if reply.status != 200:
                await reply.read()
                return record
            async for raw in reply.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                now = loop.time()
                event = json.loads(data)
                if event.get("usage"):
                    record.tokens = int(event["usage"].get("completion_tokens") or 0)
                    record.prompt_tokens = event["usage"].get("prompt_tokens")
                choice = (event.get("choices") or [{}])[0]
                record.finish = choice.get("finish_reason") or record.finish
                text = _text_of(event)
                if text:
                    if record.first is None:
                        record.first = now
                    else:
                        record.gaps.append(now - record.last)
                    record.last = now
                    record.chunks += 1
    except asyncio.TimeoutError:
        record.status = "timeout"
    except aiohttp.ClientError as exc:
        record.status = f"error:{type(exc).__name__}"
    record.done = loop.time()
    if record.tokens == 0:
        record.tokens = record.chunks
    return record


async def run_level(session, url: str, bodies: list[bytes], headers: dict, streams: int, duration_s: float,
                    timeout_s: float, offset: int = 0) -> tuple[list[StreamRecord], float]:
    """``streams`` users in a closed loop for ``duration_s``; (records, wall seconds first send to last end)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    records: list[StreamRecord] = []
    counter = iter(range(offset, 10**9))

    async def user(k: int) -> None:
        while loop.time() - start < duration_s:
            body = bodies[next(counter) % len(bodies)]
            records.append(await one_stream(session, url, body, headers, k, timeout_s))

    await asyncio.gather(*(user(k) for k in range(streams)))
    return records, loop.time() - start


def _pct(values, q) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 3) if len(values) else None


def summarize(records: list[StreamRecord], streams: int, wall_s: float, batch: float | None) -> dict:
    """One level: latency percentiles (ms), throughput (tokens/s), per-user decode rates, errors."""
    ok = [r for r in records if r.status == "200" and r.first is not None]
    errors: dict[str, int] = {}
    for r in records:
        if r.status != "200":
            errors[r.status] = errors.get(r.status, 0) + 1
    ttft = [r.ttft for r in ok]
    gaps = [g for r in ok for g in r.gaps]
    rates = [r.decode_rate for r in ok if r.decode_rate is not None]
    users = []
    for k in range(streams):
        mine = [r for r in ok if r.user == k]
        user_rates = [r.decode_rate for r in mine if r.decode_rate is not None]
        users.append({"user": k, "requests": len(mine), "tokens": sum(r.tokens for r in mine),
                      "ttft_ms_mean": round(1000 * float(np.mean([r.ttft for r in mine])), 3) if mine else None,
                      "decode_tokens_per_s": round(float(np.mean(user_rates)), 3) if user_rates else None})
    tokens = sum(r.tokens for r in ok)
    per_stream = float(np.mean(rates)) if rates else None
    prompt = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    return {
        "streams": streams, "requests": len(records), "ok": len(ok), "errors": errors, "wall_s": round(wall_s, 3),
        "prompt_tokens_mean": round(float(np.mean(prompt)), 1) if prompt else None,
        "completion_tokens": tokens,
        "ttft_p50_ms": _pct(ttft, 50), "ttft_p90_ms": _pct(ttft, 90), "ttft_p99_ms": _pct(ttft, 99),
        "itl_p50_ms": _pct(gaps, 50), "itl_p90_ms": _pct(gaps, 90), "itl_p99_ms": _pct(gaps, 99),
        "itl_max_ms": _pct(gaps, 100),
        "stream_decode_tokens_per_s": round(per_stream, 3) if per_stream else None,
        # N streams decoding at once, each at its own rate: together N x the mean per-stream rate
        "aggregate_decode_tokens_per_s": round(per_stream * streams, 3) if per_stream else None,
        "output_tokens_per_s": round(tokens / wall_s, 3) if wall_s > 0 else None,  # everything, prompts included
        "mean_decode_batch": None if batch is None else round(batch, 2),
        "users": users,
    }


def prompt_texts(texts: list[str], chars: int, count: int = 64) -> list[str]:
    """``count`` prompts of about ``chars`` characters, each joined from consecutive real texts."""
    out, i = [], 0
    texts = [t.strip() for t in texts if t and t.strip()]
    if not texts:
        return out
    while len(out) < count:
        piece = ""
        while len(piece) < chars:
            piece = (piece + " " + texts[i % len(texts)]).strip()
            i += 1
        out.append(piece[:chars].rsplit(" ", 1)[0] if " " in piece[:chars] else piece[:chars])
    return out


def scaling(levels: list[dict]) -> dict:
    """Each level's aggregate decode and output tokens/s over the single stream's."""
    base = next((s for s in levels if s["streams"] == 1), None)
    out = {}
    for key in ("aggregate_decode_tokens_per_s", "output_tokens_per_s", "server_decode_tokens_per_s"):
        ref = base and base.get(key)
        out[key] = {str(s["streams"]): (round(s[key] / ref, 2) if ref and s.get(key) else None) for s in levels}
    return out
