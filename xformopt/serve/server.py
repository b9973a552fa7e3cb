"""Run the app on uvicorn: bind (127.0.0.1 unless told), warn loudly on an open bind without a key,
and on SIGTERM stop accepting, answer every request already accepted, exit 0 (uvicorn's graceful
shutdown, then the app's lifespan drains the scheduler)."""

from __future__ import annotations

import ipaddress
import json
import logging
import signal
import sys

LOCAL_HOSTS = ("localhost",)
DRAIN_SECONDS = 30  # at most this long for in-flight requests after SIGTERM
# uvicorn closes idle keep-alive connections after 5 s by default; a pooled client reusing one as it
# closes sees a reset. Load balancers keep theirs for a minute.
KEEP_ALIVE_SECONDS = 65


def is_local(host: str) -> bool:
    if host in LOCAL_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def open_bind_warning(host: str, has_key: bool) -> str | None:
    if is_local(host) or has_key:
        return None
    return (f"WARNING: serving on {host} WITHOUT an API key: anyone who can reach this port can use the model. "
            "Pass --api-key-env VAR (clients then send Authorization: Bearer $VAR), or bind 127.0.0.1.")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({"time": self.formatTime(record), "level": record.levelname, "logger": record.name,
                           "message": record.getMessage()})


def log_config(json_logs: bool) -> dict:
    formatter = {"()": f"{__name__}.JsonFormatter"} if json_logs else {"format": "%(asctime)s %(levelname)s %(message)s"}
    return {"version": 1, "disable_existing_loggers": False, "formatters": {"default": formatter},
            "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "default", "stream": "ext://sys.stderr"}},
            "loggers": {name: {"handlers": ["stderr"], "level": "INFO", "propagate": False}
                        for name in ("uvicorn", "uvicorn.error", "xformopt.serve")}}


def run(app, host: str, port: int, json_logs: bool = False) -> bool:
    """Serve until SIGTERM/SIGINT; False when the server could not start (port taken, model failed)."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, access_log=False, lifespan="on",
                                           log_config=log_config(json_logs), timeout_graceful_shutdown=DRAIN_SECONDS,
                                           timeout_keep_alive=KEEP_ALIVE_SECONDS))
    # uvicorn handles SIGTERM/SIGINT itself (stop accepting, drain), then raises the signal again for
    # the handlers it found; for a server that drained, that stop is the normal end (exit 0), so the
    # CLI's own handler (which turns a signal into exit 143) is parked meanwhile.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    uvicorn_exit = server.handle_exit

    def handle_exit(sig, frame):  # tell the app too: streams in flight get their drain time now
        uvicorn_exit(sig, frame)
        drain = getattr(getattr(app, "state", None), "begin_drain", None)
        if drain is not None:
            drain()

    server.handle_exit = handle_exit
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    sys.stderr.flush()
    return bool(server.started)
