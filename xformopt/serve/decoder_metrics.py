"""Prometheus metrics of the continuous-batching decoder, in the app's registry (beside the request
metrics of :mod:`.metrics`). The rows of each decode call go to ``xformopt_batch_size``, so a load
test reads the mean batch the same way for encoders and decoders."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0)
FIRST_TOKEN_BUCKETS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0)
PREFILL_BUCKETS = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048)
FINISH_REASONS = ("stop", "length", "cancelled", "error")


class DecoderMetrics:
    def __init__(self, metrics):
        r = metrics.registry
        self.batch_size = metrics.batch_size  # rows per decode call
        self.running = Gauge("xformopt_decoder_running_sequences", "Sequences holding a KV row (reading their "
                             "prompt or decoding)", registry=r)
        self.waiting = Gauge("xformopt_decoder_waiting_sequences", "Requests queued for a KV row", registry=r)
        self.kv_tokens = Gauge("xformopt_decoder_kv_tokens", "KV cache positions holding a token", registry=r)
        self.kv_allocated = Gauge("xformopt_decoder_kv_tokens_allocated", "KV cache positions allocated (rows x "
                                  "capacity, right-padded)", registry=r)
        self.kv_limit = Gauge("xformopt_decoder_kv_tokens_limit", "The bound on allocated KV positions "
                              "(--max-kv-tokens)", registry=r)
        self.generated = Counter("xformopt_decoder_generated_tokens", "Tokens generated", registry=r)
        self.prompt_tokens = Counter("xformopt_decoder_prompt_tokens", "Prompt tokens read", registry=r)
        self.prefill_tokens = Histogram("xformopt_decoder_prefill_tokens", "Prompt tokens per prefill call",
                                        buckets=PREFILL_BUCKETS, registry=r)
        self.ttft = Histogram("xformopt_decoder_time_to_first_token_seconds", "Arrival to first token",
                              buckets=FIRST_TOKEN_BUCKETS, registry=r)
        self.inter_token = Histogram("xformopt_decoder_inter_token_seconds", "Between a stream's successive tokens",
                                     buckets=TOKEN_BUCKETS, registry=r)
        self.step = Histogram("xformopt_decoder_step_seconds", "One session call", ["kind"], buckets=TOKEN_BUCKETS,
                              registry=r)
        self.finished = Counter("xformopt_decoder_finished", "Streams ended, by finish reason", ["reason"], registry=r)
        self.rejected = Counter("xformopt_decoder_rejected", "Requests refused before a KV row (503)", ["why"],
                                registry=r)
        for reason in FINISH_REASONS:
            self.finished.labels(reason)
        for kind in ("prefill", "decode"):
            self.step.labels(kind)
