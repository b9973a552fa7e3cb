"""A real uvicorn server on a free local port, in a thread of the test process (the model is opened
once per test module, not once per process start), and instrumented predictors: the real one with a
known service time, or one that fails on a marked input."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    def __init__(self, app, port: int | None = None, graceful_s: float | None = None):
        """``graceful_s``: at exit, how long requests in flight may take before they are cancelled (None:
        as long as they need, up to the 60 s join; an app whose requests can hang passes a few seconds)."""
        import uvicorn

        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    access_log=False, lifespan="on", timeout_keep_alive=60,
                                                    timeout_graceful_shutdown=graceful_s))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if not self.thread.is_alive():
                raise RuntimeError("the server thread stopped before it was healthy")
            time.sleep(0.1)
        raise RuntimeError("the server did not become healthy")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)


class Slowed:
    """The real predictor, each session call taking at least ``seconds`` (a known service time);
    a session call carrying an input that contains ``fail_on`` raises."""

    def __init__(self, predictor, seconds: float = 0.0, fail_on: str | None = None):
        self.inner, self.seconds, self.fail_on = predictor, seconds, fail_on
        self.calls: list[int] = []  # rows per session call

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def prepare(self, inputs, truncate=True):
        prepared = self.inner.prepare(inputs, truncate)
        for item, p in zip(inputs, prepared):
            for row in p.rows:  # the row carries the mark, so run_rows sees it whatever the grouping
                row.fail = bool(self.fail_on and self.fail_on in str(item))
        return prepared

    def run_rows(self, rows):
        started = time.perf_counter()
        self.calls.append(len(rows))
        if any(getattr(r, "fail", False) for r in rows):
            raise RuntimeError("injected failure")
        out = self.inner.run_rows(rows)
        time.sleep(max(0.0, self.seconds - (time.perf_counter() - started)))
        return out


def slowed_factory(seconds: float = 0.0, fail_on: str | None = None, keep: list | None = None):
    """A predictor_factory for create_app; ``keep`` receives the predictor it made."""
    from xformopt.runtime.predictor import load_predictor

    def factory(path: str | Path, threads, int8_scales="per-token"):
        predictor = Slowed(load_predictor(path, threads, int8_scales), seconds, fail_on)
        if keep is not None:
            keep.append(predictor)
        return predictor

    return factory


def metric(text: str, name: str, **labels) -> float:
    """One sample's value from a Prometheus text page (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0
