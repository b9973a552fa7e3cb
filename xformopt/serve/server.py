"""Run the app on uvicorn: bind (127.0.0.1 unless told), warn loudly on an open bind without a key,
and on SIGTERM drain readiness-first, then exit 0.

uvicorn's own shutdown closes the listener at once: connections the kernel had already accepted into
the listen backlog are reset, and a pooled client that sends on a keep-alive connection as it closes
gets a reset too. Load balancers expect the other order, so on SIGTERM, for ``drain_s`` seconds:
/health says 503 (the balancer stops sending), the listener stays open and every request is answered
as usual, each answer with ``Connection: close`` (a pool reconnects, which still works, rather than
reuse a connection about to close). Then the listener closes, connections accepted in its last moment
get ``LINGER_S`` to deliver their request, and uvicorn's graceful shutdown answers what is in flight
(the app's lifespan then drains the scheduler). A second SIGTERM, or Ctrl-C (SIGINT: someone at a
terminal, not a balancer), skips the grace period.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import signal
import sys
import time

LOCAL_HOSTS = ("localhost",)
DRAIN_SECONDS = 30  # after the listener closed, at most this long for the requests in flight
LINGER_S = 0.3  # between closing the listener and closing idle connections (a request may be on its way)
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


def draining_server(config, app, drain_s: float):
    """A uvicorn.Server whose SIGTERM starts the readiness-first drain of the module docstring."""
    import uvicorn

    def tell_app():  # plain stores only: this runs inside a signal handler
        begin = getattr(getattr(app, "state", None), "begin_drain", None)
        if begin is not None:
            begin()

    class Server(uvicorn.Server):
        drain_started: float | None = None  # monotonic time of the SIGTERM that began the grace period
        listener_closed = False
        announced = False

        def handle_exit(self, sig, frame):
            tell_app()
            if sig == signal.SIGTERM and drain_s > 0 and self.started and self.drain_started is None \
                    and not self.should_exit:
                self.drain_started = time.monotonic()  # on_tick ends the grace period
                return
            super().handle_exit(sig, frame)  # uvicorn's own shutdown, now

        async def on_tick(self, counter: int) -> bool:  # uvicorn's main loop calls it every 0.1 s
            if self.drain_started is not None and not self.should_exit:
                waited = time.monotonic() - self.drain_started
                if not self.announced:  # logged here, not in the signal handler (logging takes locks)
                    self.announced = True
                    logging.getLogger("uvicorn.error").info(
                        f"SIGTERM: /health says 503; still answering for {drain_s:g} s (a second SIGTERM or Ctrl-C "
                        "stops sooner)")
                if waited >= drain_s and not self.listener_closed:
                    for listener in self.servers:
                        listener.close()  # new connections are refused from here; uvicorn closes the rest
                    self.listener_closed = True
                    logging.getLogger("uvicorn.error").info(f"drained for {drain_s:g} s: listener closed, answering "
                                                            "the requests in flight")
                if waited >= drain_s + LINGER_S:
                    self.should_exit = True
            return await super().on_tick(counter)

    return Server(config)


def run(app, host: str, port: int, json_logs: bool = False, drain_s: float = 0.0) -> bool:
    """Serve until SIGTERM/SIGINT; False when the server could not start (port taken, model failed).
    ``drain_s``: the readiness-first grace period after SIGTERM (0: close the listener at once)."""
    import uvicorn

    server = draining_server(uvicorn.Config(app, host=host, port=port, access_log=False, lifespan="on",
                                            log_config=log_config(json_logs), timeout_graceful_shutdown=DRAIN_SECONDS,
                                            timeout_keep_alive=KEEP_ALIVE_SECONDS), app, drain_s)
    # uvicorn raises a signal it handled again once it stopped, for the handlers it found; for a server
    # that drained, that stop is the normal end (exit 0), so the CLI's own handler (which turns a signal
    # into exit 143) is parked meanwhile.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    sys.stderr.flush()
    return bool(server.started)
