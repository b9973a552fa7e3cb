"""The HTTP app: routes for the artifact's task, the batch scheduler behind them, metrics, safety.

FastAPI (see docs/architecture.md): the pydantic request models validate each body and are the
OpenAPI schema, and Ray Serve takes the same app as its ingress. The app is built from a plain
``ServeConfig`` (picklable, so Ray can ship it to replicas); the model opens in the app's lifespan,
in the process that serves, and /health says 200 only after a warm-up batch ran.

Encoder routes follow text-embeddings-inference's layout (``router/src/http/server.rs``): the task's
main route (``/embed``, ``/predict``, ``/rerank``) also at ``POST /`` and ``POST /invocations`` (the
SageMaker contract), health at ``GET /health``, ``/`` and ``/ping``; for feature-extraction
``/v1/embeddings`` and ``/embeddings`` (OpenAI), ``/embed_all``, ``/similarity``
(xformopt/serve/embedding_routes.py); ``/tokenize`` and ``/decode`` for every encoder
(xformopt/serve/tokenizer_routes.py); ``/info``, ``/metrics``, ``/openapi.json``. Errors are one JSON
line with TEI's status codes and bodies (xformopt/serve/replies.py).
"""

import contextlib
import hmac
import inspect
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from xformopt import tasks
from xformopt.models.matryoshka import declared_dimensions
from xformopt.runtime.predictor import artifact_spec, load_predictor
from xformopt.serve import (
    autotune,
    decoder_routes,
    embedding_routes,
    rerank_routes,
    seq2seq_routes,
    tokenizer_routes,
)
from xformopt.serve.decoder_scheduler import DecoderSettings
from xformopt.serve.metrics import CONTENT_TYPE_LATEST, Metrics
from xformopt.serve.replies import (
    HTTPFailure,
    check_inputs,
    error_response,
    inputs_of,
    json_response,
    runner,
    truncation,
)
from xformopt.serve.scheduler import Scheduler, Settings
from xformopt.version import __version__

HEALTH_PATHS = ("/health", "/", "/ping")  # TEI's three; load balancers probe them without a key (GET only)
MAIN_ALIASES = ("/", "/invocations")  # POST: the task's main route, as TEI and SageMaker place it
# FastAPI >= 0.16x looks up OpenTelemetry providers on every request (3 % of the event loop's time under
# load); /metrics is this server's telemetry. Older FastAPI has no such option.
_NO_TELEMETRY = ({"telemetry": {"tracing": False, "metrics": False, "logs": False}}
                 if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {})
WARMUP_TEXT = "warm-up: the first session calls allocate and pick kernels"


@dataclass(frozen=True)
class ServeConfig:
    artifact: str
    threads: int | None = None
    scheduler: Settings = field(default_factory=Settings)
    api_key: str | None = None
    max_body_bytes: int = 1 << 20
    max_inputs: int = 256  # inputs per request
    model_name: str | None = None  # what /v1/embeddings and /info call the model [default: the folder name]
    int8_scales: str = "per-token"  # dynamic INT8 graphs: per-token scales (batch-independent) or as exported
    decoder: DecoderSettings = field(default_factory=DecoderSettings)  # text-generation artifacts

    def public(self) -> dict:
        """The settings /info shows (never the key)."""
        out = asdict(self)
        out.pop("api_key")
        out["auth"] = self.api_key is not None
        return out


# --------------------------------------------------------------------------- ASGI middlewares
# Plain ASGI (not BaseHTTPMiddleware): they wrap every request, and the plain form adds no task hop.


class BodyLimit:
    """413 for a body over the limit, by its Content-Length or by what arrives."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")

        def too_big():  # built only when needed: a JSONResponse per request was 5 % of the event loop's time
            return error_response(413, f"request body over {self.limit} bytes; send fewer or shorter inputs",
                                  "Validation")

        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await too_big()(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return await too_big()(scope, receive, send)
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()  # after the body: the disconnect
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


class BearerAuth:
    """401 unless ``Authorization: Bearer KEY`` (compared in constant time); ``GET`` of the health paths
    stays open (``POST /`` is the model's main route: it needs the key)."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and not (scope["method"] == "GET" and scope["path"] in HEALTH_PATHS):
            header = dict(scope.get("headers") or []).get(b"authorization", b"")
            scheme, _, given = header.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.key):
                response = error_response(401, "missing or wrong API key; send Authorization: Bearer KEY",
                                          "Unauthorized", {"WWW-Authenticate": "Bearer"})
                return await response(scope, receive, send)
        return await self.app(scope, receive, send)


class CloseWhileDraining:
    """While the server drains (after SIGTERM), every answer carries ``Connection: close``: a client's
    pool then opens a new connection for its next request, which the listener still accepts during the
    grace period, instead of reusing one the server is about to close (a reset)."""

    def __init__(self, app, state: dict):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def sending(message):
            if message["type"] == "http.response.start" and self.state["draining"]:
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        return await self.app(scope, receive, sending)


class RequestMetrics:
    """Requests by route and status, and their latency (received to answered), for /metrics."""

    def __init__(self, app, metrics: Metrics, routes: set[str]):
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = 500

        async def sending(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = scope["path"] if scope["path"] in self.routes else "other"
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - started)


# --------------------------------------------------------------------------- helpers


def _validation_message(exc: RequestValidationError) -> tuple[int, str]:
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":
        return 400, "the body is not valid JSON; send a JSON object"
    loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    if not loc and first.get("type") in ("model_attributes_type", "dict_type"):
        return 400, "the body must be a JSON object"
    return 422, f"{loc or 'body'}: {first.get('msg', 'invalid')}" + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")


def _info(config: ServeConfig, spec, predictor, scheduler=None) -> dict:
    path = Path(config.artifact)
    report = _read(path / "report.json")
    manifest = _read(path / "manifest.json")
    headline = report.get("headline_metric")
    artifact = report.get("artifact") if isinstance(report.get("artifact"), dict) else {}
    metric = (artifact.get("metrics") or {}).get(headline) if headline else None
    target = manifest.get("target")
    return {
        "model": config.model_name or path.name,
        "task": spec.task,
        "model_type": spec.model_type,
        "target": target.get("name") if isinstance(target, dict) else report.get("target"),
        "headline": {"metric": headline, "value": metric.get("value") if isinstance(metric, dict) else None},
        "latency": artifact.get("latency"),
        "max_tokens": predictor.max_length if predictor is not None else None,
        "labels": spec.id2label or None,
        "settings": config.public(),
        # TEI's names for what its clients read: the served name, the token limit, inputs per request
        "model_id": config.model_name or path.name,
        "max_input_length": predictor.max_length if predictor is not None else None,
        "max_client_batch_size": config.max_inputs,
        "version": __version__,
        **_embedding_info(config, spec),
        "batching": {**tuning.public(), "remeasured": scheduler.retunes}
        if (tuning := getattr(scheduler, "tuning", None))
        else getattr(predictor, "batching", None),  # decoders: continuous, or one at a time and why
    }


def _embedding_info(config: ServeConfig, spec) -> dict:
    """An embedder's width and the Matryoshka sizes its config or card declares (what ``dimensions`` may
    ask for with the accuracy the model was trained for; None: none declared)."""
    task = tasks.TASKS.get(spec.task)
    if task is None or task.head is None or not task.head.embeds:
        return {}
    return {"dimensions": spec.hidden_size,
            "matryoshka_dimensions": declared_dimensions(config.artifact, spec.hidden_size)}


def _read(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


# --------------------------------------------------------------------------- the app


def create_app(config: ServeConfig, predictor_factory=None, engine_factory=None):
    """The ASGI app for ``config.artifact``; ``predictor_factory(path, threads, int8_scales)`` opens the
    model in the lifespan (default: xformopt.runtime.predictor.load_predictor); for a decoder,
    ``engine_factory(path, threads, max_kv_tokens, max_rows)`` (default: BatchDecoder)."""

    decoder = decoder_routes.decoder_spec(config.artifact)  # text generation: the decoder routes
    seq2seq = seq2seq_routes.seq2seq_spec(config.artifact)  # translation, summarization: /v1/completions
    spec = decoder or seq2seq or artifact_spec(config.artifact)  # refuses an unservable artifact before anything listens
    metrics = Metrics()
    state = {"ready": False, "draining": False, "scheduler": None, "predictor": None}
    if seq2seq is not None:
        lifespan = _seq2seq_lifespan(config, state)
    elif decoder is not None:
        lifespan = _decoder_lifespan(config, state, metrics, engine_factory)
    else:
        lifespan = _encoder_lifespan(config, spec, state, metrics, predictor_factory or load_predictor)
    app = FastAPI(title="xformopt serve", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  description=f"{spec.task} model {config.model_name or Path(config.artifact).name}",
                  **_NO_TELEMETRY)
    _add_error_handlers(app)
    routes = _add_common_routes(app, config, spec, state, metrics)
    if decoder is not None:
        routes |= decoder_routes.add_routes(app, config, state)
    elif seq2seq is not None:
        routes |= seq2seq_routes.add_routes(app, config, state)
    else:
        routes |= _add_encoder_routes(app, config, spec, runner(state))

    app.state.serve = state
    # pure ASGI middlewares; the last added runs first: metrics see every answer, auth runs before the body is read
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    if config.api_key:
        app.add_middleware(BearerAuth, key=config.api_key)
    app.add_middleware(RequestMetrics, metrics=metrics, routes=routes)
    app.add_middleware(CloseWhileDraining, state=state)
    return app


def _seq2seq_lifespan(config: ServeConfig, state: dict):
    @contextlib.asynccontextmanager
    async def lifespan(app):
        service = await seq2seq_routes.start_service(config)
        state.update(predictor=service, ready=True)
        try:
            yield
        finally:
            state["ready"] = False
            await service.stop()

    return lifespan


def _decoder_lifespan(config: ServeConfig, state: dict, metrics: Metrics, engine_factory):
    @contextlib.asynccontextmanager
    async def lifespan(app):
        service = await decoder_routes.start_service(config, metrics, engine_factory)
        state.update(predictor=service, scheduler=service.scheduler, ready=True)
        scheduler_drain = service.scheduler.begin_drain

        def begin_drain():  # serve.server calls it on SIGTERM (plain stores: signal-handler safe)
            state["draining"] = True
            scheduler_drain()

        app.state.begin_drain = begin_drain
        try:
            yield
        finally:
            state["ready"] = False
            await service.scheduler.stop()

    return lifespan


def _encoder_lifespan(config: ServeConfig, spec, state: dict, metrics: Metrics, factory):
    @contextlib.asynccontextmanager
    async def lifespan(app):
        predictor = factory(config.artifact, config.threads, config.int8_scales)
        scheduler = Scheduler(predictor, config.scheduler, metrics)
        warmup = [tasks.get(spec.task).serving.warmup(WARMUP_TEXT)]
        await scheduler.start(warmup * min(config.scheduler.max_batch or 8, 8),
                              autotune.recorded_latency_ms(config.artifact))
        state.update(predictor=predictor, scheduler=scheduler, ready=True)
        app.state.begin_drain = lambda: state.update(draining=True)  # SIGTERM: not ready, answers close
        try:
            yield
        finally:
            state["ready"] = False
            await scheduler.stop()  # every accepted request is answered first

    return lifespan


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(HTTPFailure)
    async def _failure(request, exc: HTTPFailure):
        return error_response(exc.status, exc.message, exc.kind, exc.headers, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        status, message = _validation_message(exc)
        return error_response(status, message, "Validation", path=request.url.path)

    @app.exception_handler(Exception)
    async def _crash(request, exc: Exception):
        return error_response(500, f"internal error ({type(exc).__name__}); the server logged it", "Backend",
                              path=request.url.path)


def _add_common_routes(app: FastAPI, config: ServeConfig, spec, state: dict, metrics: Metrics) -> set[str]:
    """/health, /info and /metrics, for every artifact; returns the routes the metrics label by name."""

    @app.get("/health", summary="200 once the model is loaded and warmed up; 503 before, and while draining")
    @app.get("/", summary="Health, as /health (TEI)")
    @app.get("/ping", summary="Health, as /health (TEI, SageMaker)")
    async def health():
        if state["draining"]:  # a load balancer stops sending here first; requests still get answers
            return error_response(503, "draining: shutting down, send requests elsewhere", "Unhealthy")
        if not state["ready"]:
            return error_response(503, "not ready", "Unhealthy")
        return {"status": "ok"}

    @app.get("/info", summary="Model, task, target, the artifact's headline accuracy and latency, settings")
    async def info():
        return _info(config, spec, state["predictor"], state["scheduler"])

    @app.get("/metrics", summary="Prometheus text format")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return {*HEALTH_PATHS, "/info", "/metrics", "/openapi.json"}


# TEI's model routes, and what it answers (424 Backend) where the model is not of the kind a route needs
OTHER_KIND = {**dict.fromkeys(embedding_routes.ROUTES, "an embedding"), "/predict": "a classifier",
              "/rerank": "a re-ranker"}


def _add_encoder_routes(app: FastAPI, config: ServeConfig, spec, run) -> set[str]:
    """The task's routes (by ``Serving.kind``), /tokenize and /decode, the task's main route again at POST /
    and /invocations, and TEI's 424 on the model routes of other kinds of model."""
    serving = tasks.get(spec.task).serving
    routes: set[str] = set()
    for add in ROUTE_SETS[serving.kind]:
        routes |= add(app, config, spec, run)
    routes |= tokenizer_routes.add_routes(app, config)
    main = next(r for r in app.router.routes if getattr(r, "path", None) == serving.main_route
                and "POST" in getattr(r, "methods", ()))
    for path in MAIN_ALIASES:
        app.add_api_route(path, main.endpoint, methods=["POST"], summary=f"{main.summary} (as {main.path})")
    for path, kind in OTHER_KIND.items():
        if path not in routes:
            app.add_api_route(path, _not_this_kind(kind), methods=["POST"], include_in_schema=False)
    return routes | set(MAIN_ALIASES)


def _not_this_kind(kind: str):
    async def refuse():
        raise HTTPFailure(424, f"model is not {kind} model", "Backend")

    return refuse


def _add_task_route(app: FastAPI, config: ServeConfig, spec, run) -> set[str]:
    """The task's own TEI-style route (its Task.serving says which, and the request body)."""
    serving = tasks.get(spec.task).serving
    request_model, route = serving.request_model(), serving.routes[0]

    async def predict(body):
        value = body.inputs
        if serving.two_texts_are_a_pair and isinstance(value, list) and len(value) == 2 \
                and all(isinstance(v, str) for v in value):
            value = tuple(value)  # TEI: a list of two texts is one pair
        items, single = inputs_of(value)
        if serving.structured:
            items = [q.model_dump() for q in items]
        else:  # a pair is a tuple for the predictor (a list there is a batch)
            items = [tuple(i) if isinstance(i, (list, tuple)) else i for i in items]
        check_inputs(items, config.max_inputs)
        options = {name: getattr(body, name) for name in serving.options}
        if "truncate" in options and hasattr(body, "truncation_direction"):
            options["truncate"] = truncation(options["truncate"], body.truncation_direction)
        answers = [a for a, _ in await run(items, **options)]
        return json_response(answers[0] if single else answers)

    predict.__annotations__ = {"body": request_model}  # the task's body model: validation and OpenAPI
    app.post(route, summary=f"{spec.task}: {request_model.__doc__.splitlines()[0]}")(predict)
    return {route}


ROUTE_SETS = {"embed": (embedding_routes.add_routes,), "predict": (_add_task_route,),
              "rerank": (_add_task_route, rerank_routes.add_routes)}  # by Serving.kind: the task's routes
