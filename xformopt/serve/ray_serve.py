"""The same app as a Ray Serve deployment (extra ``serve``): ``replicas`` copies, each with its own
model, scheduler and caches, behind Ray Serve's HTTP proxy, for traffic one process cannot carry.

The app is built on each replica from the picklable ServeConfig (``serve.ingress`` with a builder),
so no ONNX session or metrics registry crosses the cluster; its lifespan opens the model and warms it
up there. Batching stays per replica (our scheduler), not Ray's ``@serve.batch``: the scheduler's
length grouping, bounded queue and deadlines are what the single-process server measured.
"""

from __future__ import annotations

import logging

from xformopt.errors import InputError
from xformopt.serve.app import create_app

_log = logging.getLogger(__name__)

APP_NAME = "xformopt"


def _ray():
    try:
        import ray
        from ray import serve
    except ImportError:
        raise InputError('--ray needs Ray Serve: pip install "xformopt[serve]"') from None
    return ray, serve


def deployment(config, replicas: int = 1):
    """The bound Ray Serve application for ``config`` (a ServeConfig)."""
    _, serve = _ray()

    def build_app():  # a plain function: Ray calls it on each replica (a partial would be taken for an ASGI app)
        return create_app(config)

    cpus = float(config.threads or 1)
    wrapped = serve.deployment(
        serve.ingress(build_app)(type("XformoptServe", (), {})),
        name="XformoptServe", num_replicas=replicas, ray_actor_options={"num_cpus": cpus},
        # the scheduler bounds its own queue and answers 503 when full; Ray's own limit sits above it
        max_ongoing_requests=max(config.scheduler.max_queue, 1),
    )
    return wrapped.bind()


def start(config, address: str, host: str, port: int, replicas: int) -> str:
    """Connect to (or, for 'local', start) a Ray cluster and deploy; returns the HTTP base URL."""
    ray, serve = _ray()
    if address == "local":
        ray.init(include_dashboard=False, num_cpus=None, ignore_reinit_error=True, log_to_driver=False)
    else:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    serve.start(http_options={"host": host, "port": port})
    serve.run(deployment(config, replicas), name=APP_NAME, route_prefix="/", blocking=False)
    url = f"http://{host}:{port}"
    _log.info(f"Ray Serve: {replicas} replica(s) of {config.artifact} on {url}")
    return url


def run(config, address: str, host: str, port: int, replicas: int) -> None:
    """Deploy, then wait until interrupted; on SIGTERM/SIGINT the deployment is deleted (Ray drains it)."""
    import signal
    import threading

    ray, serve = _ray()
    start(config, address, host, port, replicas)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        stop.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        serve.delete(APP_NAME)
        serve.shutdown()
        ray.shutdown()
