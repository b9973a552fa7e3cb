"""The server's Prometheus metrics, one registry per app (so two apps in one process, as in tests, do
not share counters). Names follow Prometheus conventions: ``_total`` counters, ``_seconds`` histograms."""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,  # noqa: F401  (re-exported for the /metrics route)
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
disable_created_metrics()  # the *_created series only add noise to a scrape
BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("xformopt_requests", "HTTP requests by route and status", ["route", "status"], registry=r)
        self.latency = Histogram("xformopt_request_duration_seconds", "Request latency (received to answered)",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("xformopt_batch_size", "Rows per session call", buckets=BATCH_BUCKETS, registry=r)
        self.batch_inputs = Histogram("xformopt_batch_inputs", "Inputs per scheduled batch", buckets=BATCH_BUCKETS,
                                      registry=r)
        self.queue_depth = Gauge("xformopt_queue_depth", "Inputs waiting for a batch", registry=r)
        self.cache = Counter("xformopt_cache", "Result cache lookups", ["result"], registry=r)
        self.token_cache = Counter("xformopt_tokenization_cache", "Tokenization cache lookups", ["result"], registry=r)
        self.tokens = Counter("xformopt_tokens", "Tokens run through the model (padding excluded)", registry=r)
        self.padded_tokens = Counter("xformopt_padded_tokens", "Positions fed to the model (padding included)",
                                     registry=r)
        self.batch_failures = Counter("xformopt_batch_failures", "Session calls that raised", registry=r)
        # process_resident_memory_bytes & co.: what `loadtest --overload` reads to bound memory under load
        ProcessCollector(registry=r)
        for result in ("hit", "miss"):  # present at 0 from the start, so a scrape sees them
            self.cache.labels(result)
            self.token_cache.labels(result)

    def render(self) -> bytes:
        return generate_latest(self.registry)
