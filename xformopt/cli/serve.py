"""`xformopt serve ARTIFACT`: the artifact behind an HTTP endpoint (dynamic batching, caches, metrics)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from xformopt.cli import options as opt
from xformopt.cli import output
from xformopt.errors import InputError, PassFailed
from xformopt.measure.host import usable_cpus
from xformopt.runtime.predictor import INT8_SCALES, artifact_spec
from xformopt.serve import server
from xformopt.serve.app import ServeConfig, create_app
from xformopt.serve.decoder_routes import batching_mode, decoder_spec
from xformopt.serve.decoder_scheduler import DecoderSettings
from xformopt.serve.scheduler import Settings
from xformopt.serve.seq2seq_routes import seq2seq_spec

# After SIGTERM, how long an encoder server keeps answering while /health says 503: what a load
# balancer needs to see it and stop sending (Kubernetes' endpoint removal takes a second or two; 5 s is
# the usual preStop wait), short enough that the whole stop fits a 30 s termination grace period.
ENCODER_DRAIN_S = 5.0

EXAMPLES = """
Examples:

    xformopt serve out/                                    # 127.0.0.1:8080, batching measured at start-up
    xformopt serve out/ --max-batch 1                      # one request per session call (no batching)
    API_KEY=secret xformopt serve out/ --host 0.0.0.0 --api-key-env API_KEY
    xformopt serve out/ --ray local --replicas 2           # Ray Serve on a new local Ray head
    curl -s localhost:8080/predict -H 'content-type: application/json' -d '{"inputs": "a fine film"}'

    xformopt serve smol-int4/ --max-batch 8 --max-kv-tokens 4096   # a decoder: OpenAI chat/completions

Routes (encoders: text-embeddings-inference's set, the task's main route also at POST / and /invocations):
/embed, /v1/embeddings and /embeddings (OpenAI), /embed_all and /similarity for embedders, /rerank for
rerankers (one-output cross-encoders), /predict for classifiers, rerankers, taggers and question answering,
/tokenize and /decode for every encoder, GET /, /ping as /health; /v1/chat/completions, /v1/completions and
/v1/models for decoders (continuous
batching, streamed with "stream": true; a graph that cannot be batched, e.g. GPT-2's own layout, is served one
request at a time, said at start-up and in /info), /health, /info, /metrics (Prometheus), /openapi.json.
SIGTERM drains readiness-first and exits 0: /health turns 503, requests are still answered (with
Connection: close) for --drain-seconds, then the listener closes and the requests in flight finish.
A second SIGTERM or Ctrl-C skips the wait.
"""


def register(app: typer.Typer) -> None:
    @app.command(epilog=EXAMPLES)
    def serve(
        artifact: Annotated[Path, typer.Argument(metavar="DIR", help="An ONNX artifact (the -o folder of `xformopt optimize`).")],
        host: Annotated[str, typer.Option("--host", help="Address to bind; anything but loopback needs --api-key-env or gets a loud warning.")] = "127.0.0.1",
        port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port (0: any free port).")] = 8080,
        max_batch: Annotated[int, typer.Option("--max-batch", min=1, help="Inputs per batch and rows per session call "
            "(1: no batching) [default: measured at start-up: the session timed at a few batch sizes, see /info]; decoders: "
            "sequences decoding together [default: 16].")] = None,
        max_wait_ms: Annotated[float, typer.Option("--max-wait-ms", min=0, help="How long a batch's first request waits "
            "for others [default: measured at start-up: one batch-1 session call].")] = None,
        threads: opt.Threads = None,
        cache_size: Annotated[int, typer.Option("--cache-size", min=0, help="Results (and tokenized inputs) cached; 0: off.")] = 10_000,
        api_key_env: Annotated[str, typer.Option("--api-key-env", metavar="VAR", help="Environment variable holding "
            "the API key (clients send Authorization: Bearer KEY).")] = None,
        json_logs: Annotated[bool, typer.Option("--json-logs", help="Log lines on stderr as JSON objects.")] = False,
        max_queue: Annotated[int, typer.Option("--max-queue", min=1, help="Inputs waiting at most; more get 503 + Retry-After.")] = 1024,
        max_queue_ms: Annotated[float, typer.Option("--max-queue-ms", min=0, help="Work waiting at most, in ms at the "
            "rate batches run (0: no such bound); more get 503 + Retry-After, so an overload leaves a short backlog.")] = 1000,
        timeout_ms: Annotated[float, typer.Option("--timeout-ms", min=1, help="A request's deadline (504 after it).")] = 10_000,
        max_inputs: Annotated[int, typer.Option("--max-inputs", min=1, help="Inputs per request at most (422 beyond).")] = 256,
        max_body_bytes: Annotated[int, typer.Option("--max-body-bytes", min=1, help="Request body limit (413 beyond).")] = 1 << 20,
        ray: Annotated[str, typer.Option("--ray", metavar="ADDRESS", help="Run as a Ray Serve deployment: 'local' (a "
            "new Ray head on this machine), 'auto', or ray://HOST:PORT (needs the serve extra).")] = None,
        replicas: Annotated[int, typer.Option("--replicas", min=1, help="Ray Serve replicas (with --ray).")] = 1,
        int8_scales: Annotated[str, typer.Option("--int8-scales", help="Dynamic-INT8 graphs: per-token (one "
            "activation scale per token: an answer does not depend on its batch mates) or per-tensor (the graph as "
            "exported: one scale per batch).")] = "per-token",
        max_kv_tokens: Annotated[int, typer.Option("--max-kv-tokens", min=1, help="Decoders: KV cache positions "
            "allocated at most (rows x longest reservation); requests wait for room beyond it.")] = 8192,
        prefill_chunk: Annotated[int, typer.Option("--prefill-chunk", min=1, help="Decoders: prompt tokens read "
            "between two decode steps (bounds how long a newcomer stalls the running streams).")] = 64,
        max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1, help="Decoders: max_tokens of a "
            "request that gives none.")] = 512,
        drain_seconds: Annotated[float, typer.Option("--drain-seconds", min=0, help="After SIGTERM: how long /health "
            "says 503 while requests are still accepted and answered, before the listener closes (decoders: new "
            "requests get 503, running streams may finish, then end with finish_reason 'length') "
            f"[default: {ENCODER_DRAIN_S:g} for encoders, {DecoderSettings.drain_s:g} for decoders].")] = None,
        require_batching: Annotated[bool, typer.Option("--require-batching", help="Decoders: refuse (exit 2) a graph "
            "that cannot be batched continuously instead of serving it one request at a time.")] = False,
        quiet: opt.Quiet = False,
    ) -> None:
        """Serve an artifact over HTTP: dynamic batching for encoders, continuous batching for decoders."""

        decoder = decoder_spec(artifact) is not None
        unbatched = batching_mode(artifact, 1)["reason"] if decoder else None
        if unbatched and require_batching:
            raise InputError(f"{artifact}: --require-batching: {unbatched}")
        drain_s = drain_seconds if drain_seconds is not None else DecoderSettings.drain_s if decoder else ENCODER_DRAIN_S
        config = build_config(artifact, threads, max_batch, max_wait_ms, cache_size, api_key_env, max_queue,
                              timeout_ms, max_inputs, max_body_bytes, int8_scales, max_queue_ms,
                              decoder_settings(max_batch, max_queue, timeout_ms, max_kv_tokens, prefill_chunk,
                                               max_new_tokens, drain_s))
        warning = server.open_bind_warning(host, config.api_key is not None)
        if warning:
            output.stderr.print(warning, style="bold red", highlight=False, markup=False)
        if replicas > 1 and ray is None:
            raise InputError("--replicas needs --ray ADDRESS (one process serves one replica)")
        if ray is not None:
            from xformopt.serve import ray_serve

            ray_serve.run(config, address=ray, host=host, port=port, replicas=replicas)
            return

        app = create_app(config)
        batching = "batching measured at start-up" if max_batch is None or max_wait_ms is None else \
            f"max batch {max_batch}, max wait {max_wait_ms:g} ms"
        if decoder:
            batching = "batching off: one request at a time, see the warning below" if unbatched else \
                f"continuous batching, up to {config.decoder.max_streams} streams"
        output.log(f"serving {artifact} on http://{host}:{port} ({batching}, cache {cache_size}); SIGTERM or Ctrl-C "
                   "drains and stops")
        if not server.run(app, host, port, json_logs, drain_s):
            raise PassFailed(f"the server did not start on {host}:{port} (see the log above)")


def build_config(artifact: Path, threads, max_batch, max_wait_ms, cache_size, api_key_env, max_queue, timeout_ms,
                 max_inputs, max_body_bytes, int8_scales="per-token", max_queue_ms=1000.0,
                 decoder: DecoderSettings | None = None):

    # bad artifacts fail here, before anything binds
    decoder_spec(artifact) or seq2seq_spec(artifact) or artifact_spec(artifact)
    key = None
    if api_key_env is not None:
        key = os.environ.get(api_key_env)
        if not key:
            raise InputError(f"--api-key-env {api_key_env}: that environment variable is unset or empty; "
                             f"export {api_key_env}=KEY first")
    if int8_scales not in INT8_SCALES:
        raise InputError(f"--int8-scales {int8_scales}: choose one of {', '.join(INT8_SCALES)}")
    if max_batch is not None and max_queue < max_batch:
        raise InputError(f"--max-queue {max_queue} is smaller than --max-batch {max_batch}; give a queue of at least one batch")
    settings = Settings(max_batch=max_batch, max_wait_ms=max_wait_ms, max_queue=max_queue,
                        max_queue_s=max_queue_ms / 1000, timeout_s=timeout_ms / 1000, cache_size=cache_size)
    return ServeConfig(str(Path(artifact).resolve()), threads or usable_cpus(), settings, key, max_body_bytes, max_inputs,
                       Path(artifact).resolve().name, int8_scales, decoder or DecoderSettings())


def decoder_settings(max_batch, max_queue, timeout_ms, max_kv_tokens, prefill_chunk, max_new_tokens,
                     drain_seconds) -> DecoderSettings:
    """For decoders --max-batch is the sequences decoding together, --max-queue the requests waiting for
    one of them, --timeout-ms how long a request may wait for it."""
    return DecoderSettings(max_streams=max_batch or DecoderSettings.max_streams, max_waiting=max_queue,
                           max_kv_tokens=max_kv_tokens,
                           prefill_chunk=prefill_chunk, default_max_tokens=max_new_tokens,
                           queue_timeout_s=timeout_ms / 1000, drain_s=drain_seconds)
