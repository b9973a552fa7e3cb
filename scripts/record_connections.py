"""Run a command with every proxy variable pointing at a local listener that records each connection.

    python scripts/record_connections.py [--linger S] -- xformopt optimize ./model -o out

Libraries that open network connections through the standard proxy variables (libcurl, as in ONNX
Runtime's telemetry uploader; requests/httpx, as in huggingface_hub) connect to the listener instead,
which writes down the request line (``CONNECT host:443 HTTP/1.1``), answers 403 and closes: nothing
reaches the network. Prints one line per connection on stderr and exits 1 when there was any, 0 when
none, or the command's own exit code when it failed. ``--linger S``: after the command exits, keep
listening S seconds (a child it left behind may still connect).

Hand-written rather than a proxy package: all it needs is to read one line per connection and refuse
it; forwarding, which is what proxy packages do, is exactly what must not happen here. The tests
(tests/core/test_no_telemetry.py) use its ``Recorder``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import threading
import time

# Every spelling the common clients read (libcurl reads lowercase http_proxy only; most read both).
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
NO_PROXY_VARIABLES = ("NO_PROXY", "no_proxy")
# What already switches telemetry off, left out by --bare so that only what the command sets itself counts.
# ONNX Runtime also stays quiet where it sees a CI variable (its list: onnxruntime/core/platform/
# telemetry_environment.h), so a check run in CI shows nothing either way unless they are left out.
QUIETING = ("ORT_DISABLE_TELEMETRY", "ORT_TELEMETRY_DISABLED", "HF_HUB_DISABLE_TELEMETRY", "DO_NOT_TRACK", "DISABLE_TELEMETRY",
            "RAY_USAGE_STATS_ENABLED", "ORT_RUNNING_UNIT_TESTS", "CI", "TF_BUILD", "GITHUB_ACTIONS", "GITLAB_CI",
            "CIRCLECI", "TRAVIS", "JENKINS_URL", "CODEBUILD_BUILD_ID", "BUILDKITE", "TEAMCITY_VERSION", "APPVEYOR",
            "BITBUCKET_BUILD_NUMBER", "SYSTEM_TEAMFOUNDATIONCOLLECTIONURI")
# Where ONNX Runtime's uploader keeps its device id and event cache, under HOME (XDG_CACHE_HOME if set).
ORT_STATE = ".cache/Microsoft/DeveloperTools/.onnxruntime"


class Recorder:
    """A listener on 127.0.0.1 (a free port) in a thread of its own; ``lines``: one per connection."""

    def __init__(self):
        self.lines: list[str] = []
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def environ(self, base: dict[str, str] | None = None, bare: bool = False) -> dict[str, str]:
        """``base`` (os.environ) with every proxy variable at this listener and no proxy exceptions;
        ``bare``: without the QUIETING variables either."""
        dropped = NO_PROXY_VARIABLES + (QUIETING if bare else ())
        env = {k: v for k, v in (os.environ if base is None else base).items() if k not in dropped}
        env.update(dict.fromkeys(PROXY_VARIABLES, self.url))
        return env

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = (await asyncio.wait_for(reader.readline(), 10)).decode("latin-1").strip()
        except (asyncio.TimeoutError, ConnectionError):
            line = ""
        self.lines.append(f"{time.strftime('%H:%M:%S')} {line or '(connected, sent nothing)'}")
        try:
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
        except ConnectionError:
            pass
        writer.close()

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()

    def __enter__(self) -> Recorder:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--linger", type=float, default=0.0, help="seconds to keep listening after the command exits")
    parser.add_argument("--bare", action="store_true", help="leave out every variable that already switches "
                        "telemetry off (ORT_DISABLE_TELEMETRY, CI, ...): only what the command sets itself counts")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    with Recorder() as recorder:
        print(f"recording connections on {recorder.url}", file=sys.stderr)
        code = subprocess.call(command, env=recorder.environ(bare=args.bare))
        time.sleep(args.linger)
    for line in recorder.lines:
        print(f"connection: {line}", file=sys.stderr)
    print(f"{len(recorder.lines)} connection(s) while running: {' '.join(command)}", file=sys.stderr)
    return code or (1 if recorder.lines else 0)


if __name__ == "__main__":
    sys.exit(main())
