"""What a load test talks to: a server URL as given, or an artifact directory served for the run
(``xformopt serve`` on a free local port, stopped with SIGTERM after it, so the server drains as it
would in production)."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

from xformopt.errors import InputError
from xformopt.loadtest.run import Target, _get

_log = logging.getLogger(__name__)


def open_targets(stack: contextlib.ExitStack, specs: list[tuple[str, str, str]]) -> list[Target]:
    """A :class:`Target` per ``(url or artifact directory, label, serve args)``; artifacts are served
    on free local ports until ``stack`` closes. With two targets, each is labelled by its role."""
    targets = []
    for spec, label, serve_args in specs:
        if spec.startswith(("http://", "https://")):
            targets.append(Target(spec.rstrip("/"), label if len(specs) > 1 else spec))
            continue
        if not Path(spec).is_dir():
            raise InputError(f"{spec} is neither a URL (http://...) nor an artifact directory")
        server = stack.enter_context(LocalServer(Path(spec), serve_args))
        targets.append(Target(server.url, f"{label} ({Path(spec).name})"))
    return targets


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    """``xformopt serve ARTIFACT`` on a free local port for the duration of the run."""

    def __init__(self, artifact: Path, serve_args: str):
        self.artifact, self.args = Path(artifact), shlex.split(serve_args or "")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> LocalServer:
        command = [sys.executable, "-m", "xformopt.cli.app", "serve", str(self.artifact), "--port", str(self.port),
                   *self.args]
        _log.info(f"starting: {shlex.join(command[2:])}")
        self.process = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                                        stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise InputError(f"`xformopt serve {self.artifact}` exited ({self.process.returncode}) before it was "
                                 "healthy; run it alone to see why")
            try:
                if _get(f"{self.url}/health", None, timeout=2):
                    return self
            except OSError:
                time.sleep(0.2)
        self.__exit__()
        raise InputError(f"`xformopt serve {self.artifact}` was not healthy within 600 s")

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
