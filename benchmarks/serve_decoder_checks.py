"""The serving checks of issue 24 on a real decoder artifact, each against `xformopt serve` run as users run it:

    python benchmarks/serve_decoder_checks.py /work/art/smol-int4

1. the OpenAI Python client streams a chat completion (printed as it arrives), and the streamed text
   equals the same request answered whole and `xformopt.load(ARTIFACT).generate(chat=...)` alone;
2. a client that disconnects mid-stream frees its slot: a stream of up to 400 tokens is dropped after
   5 chunks; /metrics then shows it cancelled, no sequence running, and far fewer tokens generated;
3. SIGTERM with two streams in flight and one request waiting (`--max-batch 2 --drain-seconds 3`):
   the short stream finishes, the long one ends at the drain with finish_reason and [DONE], the waiting
   one gets 503 + Retry-After, and the server exits 0.
Never run as a test (the suite does the same on a tiny decoder: tests/serve/test_serve_decoder.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(text: str, name: str) -> float:
    found = re.search(r"^" + re.escape(name) + r" ([0-9.e+-]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def serve(artifact: Path, *args: str):
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "xformopt.cli.app", "serve", str(artifact), "--port", str(port),
                                *args], stderr=open(os.environ.get("SERVE_LOG", os.devnull), "w"), env={**os.environ})
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit("the server did not become healthy")


def openai_stream(artifact: Path, url: str) -> None:
    import openai

    from xformopt.api import load

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    question = "What is the capital of France?"
    messages = [{"role": "user", "content": question}]
    print(f"1. OpenAI client, chat stream of {question!r}:\n   ", end="", flush=True)
    pieces, finish, usage = [], None, None
    for chunk in client.chat.completions.create(model="smol", messages=messages, max_tokens=48, temperature=0,
                                                stream=True, stream_options={"include_usage": True}):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            print(pieces[-1], end="", flush=True)
            finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
    whole = client.chat.completions.create(model="smol", messages=messages, max_tokens=48, temperature=0)
    alone = load(artifact).generate(chat=question, max_new_tokens=48)
    print(f"\n   {len(pieces)} chunks, finish_reason {finish}, usage {usage.prompt_tokens}+{usage.completion_tokens}; "
          f"streamed == whole: {''.join(pieces) == whole.choices[0].message.content}; "
          f"== generate() alone: {''.join(pieces) == alone.text}")


CANCELLED = 'xformopt_decoder_finished_total{reason="cancelled"}'


def disconnect(url: str) -> None:
    body = {"prompt": "The movie was", "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stream": True}
    before = httpx.get(f"{url}/metrics").text
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as reply:
        lines = reply.iter_lines()
        got = 0
        while got < 5:
            got += next(lines).startswith("data: ")
    for _ in range(200):
        page = httpx.get(f"{url}/metrics").text
        if metric(page, CANCELLED) > metric(before, CANCELLED):
            break
        time.sleep(0.05)
    tokens = "xformopt_decoder_generated_tokens_total"
    generated = metric(page, tokens) - metric(before, tokens)
    print(f"2. disconnect after 5 chunks of a 400-token stream: cancelled {metric(page, CANCELLED):g}, running "
          f"{metric(page, 'xformopt_decoder_running_sequences'):g}, tokens generated for it {generated:g}")


def sigterm(artifact: Path) -> None:
    process, url = serve(artifact, "--max-batch", "2", "--drain-seconds", "3")
    base = {"prompt": "The movie was", "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}

    async def stream(client, n, started):
        events = []
        async with client.stream("POST", f"{url}/v1/completions", json={**base, "max_tokens": n}) as reply:
            async for line in reply.aiter_lines():
                if line.startswith("data: "):
                    events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
                    started.set()
        return events

    async def scenario():
        async with httpx.AsyncClient(timeout=120) as client:
            flags = [asyncio.Event(), asyncio.Event()]
            tasks = [asyncio.create_task(stream(client, n, f)) for n, f in zip((1000, 20), flags)]
            await asyncio.gather(*(f.wait() for f in flags))
            waiting = asyncio.create_task(client.post(f"{url}/v1/completions", json={**base, "stream": False,
                                                                                      "max_tokens": 3}))
            while metric((await client.get(f"{url}/metrics")).text, "xformopt_decoder_waiting_sequences") < 1:
                await asyncio.sleep(0.02)
            process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            return await asyncio.gather(*tasks), await waiting, signalled

    (long, short), waited, signalled = asyncio.run(scenario())
    code = process.wait(timeout=120)
    print(f"3. SIGTERM (drain 3 s) after {time.monotonic() - signalled:.1f} s: exit code {code}")
    for name, events in (("short (20 tokens)", short), ("long (1000 tokens)", long)):
        finish = [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"]][-1]
        print(f"   {name}: finish_reason {finish}, completion_tokens {events[-2]['usage']['completion_tokens']}, "
              f"last line {events[-1]}")
    print(f"   waiting request: {waited.status_code} Retry-After {waited.headers.get('Retry-After')} {waited.text}")


def main() -> int:
    artifact = Path(sys.argv[1])
    process, url = serve(artifact, "--max-batch", "8")
    try:
        openai_stream(artifact, url)
        disconnect(url)
    finally:
        process.terminate()
        process.wait(timeout=60)
    sigterm(artifact)
    return 0


if __name__ == "__main__":
    sys.exit(main())
