"""The done-when checks of "serve on a busy host and at shutdown", against `xformopt serve` run as users run
it (with an API key) on a real artifact:

    python benchmarks/serve_busy_start_and_drain.py ARTIFACT OUT_DIR [--starts 3] [--drain-seconds 5]

1. start-up tune: three starts on the host as it is, then three with a CPU-burning process (a Python busy
   loop) per usable core beside the server; each start's /info `batching` and the load average are kept;
2. SIGTERM 0.3 s after /health turned 200, with 200 concurrent requests sent at readiness: 100 on a
   connection each and 100 through a keep-alive pool of 16 (opened before the burst); every outcome (status,
   or the client's error) is kept, with the exit code and the server's log; the same with
   `--drain-seconds 0` (the listener closed at once, as uvicorn's own shutdown does) for comparison.

Writes OUT_DIR/starts.json, OUT_DIR/drain.json and the server logs. Never run as a test (the suite does the
same on a tiny model: tests/serve/test_serve.py, tests/serve/test_serve_autotune.py).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

KEY = "bench-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(artifact: str, log_path: Path, *flags: str):
    port = free_port()
    env = {**os.environ, "BENCH_KEY": KEY}
    log = open(log_path, "w")  # noqa: SIM115  (the server writes to it until it exits)
    process = subprocess.Popen([sys.executable, "-m", "xformopt.cli.app", "serve", artifact, "--port", str(port),
                                "--api-key-env", "BENCH_KEY", *flags], env=env, stderr=log)
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url, time.monotonic()
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            raise SystemExit(f"the server stopped: see {log_path}")
        time.sleep(0.02)


def starts(artifact: str, out: Path, count: int, burn: bool) -> list[dict]:
    results = []
    for i in range(count):
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)] \
            if burn else []
        try:
            process, url, _ = start(artifact, out / f"start-{'burn' if burn else 'plain'}-{i}.log")
            batching = httpx.get(f"{url}/info", headers=AUTH).json()["batching"]
            process.send_signal(signal.SIGINT)
            process.wait(60)
        finally:
            for burner in burners:
                burner.kill()
                burner.wait()
        row = {"burners": len(burners), "max_batch": batching["max_batch"], "max_wait_ms": batching["max_wait_ms"],
               **{k: batching["measured"][k] for k in ("at", "load_average", "seconds", "pairs", "pairs_dropped",
                                                       "call_ratio", "typical_call_ms", "recorded_batch1_ms", "busy")},
               "session_call_ms": batching["session_call_ms"]}
        print(json.dumps(row), flush=True)
        results.append(row)
    return results


async def burst(url: str, process, ready: float, term_after: float) -> tuple[list, float]:
    texts = [f"review {i}: a warm, funny film with a weak last act" for i in range(200)]

    async def one(client, kind, text):
        try:
            reply = await client.post(f"{url}/embed", json={"inputs": [text]}, headers=AUTH)
            return kind, reply.status_code if reply.status_code == 200 else f"{reply.status_code} {reply.json()['error_type']}"
        except httpx.HTTPError as exc:
            return kind, type(exc).__name__ + ": " + str(exc)[:60]

    fresh = httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=None))
    pooled = httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=16, max_keepalive_connections=16))
    async with fresh, pooled:
        await asyncio.gather(*(pooled.get(f"{url}/health") for _ in range(16)))
        tasks = [asyncio.create_task(one(fresh, "fresh", t) if i % 2 else one(pooled, "keep-alive", t))
                 for i, t in enumerate(texts)]
        await asyncio.sleep(max(0.0, ready + term_after - time.monotonic()))
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic() - ready
        return await asyncio.gather(*tasks), signalled


def drain(artifact: str, out: Path, drain_s: float) -> dict:
    log_path = out / f"drain-{drain_s:g}s.log"
    process, url, ready = start(artifact, log_path, "--drain-seconds", str(drain_s))
    outcomes, signalled = asyncio.run(burst(url, process, ready, 0.3))
    code = process.wait(120)
    log = log_path.read_text()
    counts = collections.Counter(f"{kind} {status}" for kind, status in outcomes)
    result = {"drain_seconds": drain_s, "sigterm_after_ready_s": round(signalled, 3), "exit_code": code,
              "outcomes": dict(sorted(counts.items())), "stopped_after_ready_s": round(time.monotonic() - ready, 2),
              "unretrieved_future_lines": log.count("never retrieved"), "traceback_lines": log.count("Traceback"),
              "load_average": os.getloadavg()}
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("artifact")
    parser.add_argument("out", type=Path)
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--drain-seconds", type=float, default=5.0)
    parser.add_argument("--drain-only", action="store_true", help="skip the start-up checks")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.drain_only:
        runs = {"plain": starts(args.artifact, args.out, args.starts, burn=False),
                "burn": starts(args.artifact, args.out, args.starts, burn=True)}
        (args.out / "starts.json").write_text(json.dumps(runs, indent=1))
    drains = [drain(args.artifact, args.out, s) for s in (args.drain_seconds, 0.0)]
    (args.out / "drain.json").write_text(json.dumps(drains, indent=1))


if __name__ == "__main__":
    main()
