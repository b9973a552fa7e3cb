"""The decoder routes of ``xformopt serve``: OpenAI's ``/v1/chat/completions``, ``/v1/completions`` and
``/v1/models``, streamed as server-sent events (``data: {chunk}`` per token, ``data: [DONE]`` last),
over the continuous-batching scheduler (:mod:`.decoder_scheduler`) and one of three engines
(:func:`batching_mode`): GroupQueryAttention graphs share one KV buffer (:mod:`xformopt.runtime.batch_decoder`),
the plain dynamo export's graphs (Qwen3.5's linear-attention states included) batch left-padded rows
(:mod:`xformopt.runtime.padded_batch_decoder`), and any other graph (GPT-2's own layout) is served one
request at a time on the single-stream runner (:mod:`xformopt.runtime.serial_decoder`): same routes, bounds
and drain; the start-up log and /info say so.

A streamed response starts (status 200, headers) only when the first token is there, so a request
refused before it got a KV row still gets a real status (503 + Retry-After) instead of a broken
stream. A client that goes away is noticed while it waits (its request leaves the queue) and while
it streams (Starlette cancels the response; the engine frees its row at the next step).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from xformopt import models
from xformopt.decoder.generate import Sampling, TokenPicker, context_window, eos_token_ids
from xformopt.decoder.generator import open_decoder
from xformopt.errors import InputError
from xformopt.runtime.batch_decoder import BatchDecoder, unbatchable_reason
from xformopt.runtime.padded_batch_decoder import PaddedBatchDecoder, left_padded_batchable
from xformopt.runtime.serial_decoder import SerialDecoder
from xformopt.serve.decoder_metrics import DecoderMetrics
from xformopt.serve.decoder_scheduler import DecoderScheduler, DecoderSettings, Done, Job, Rejected, Token
from xformopt.serve.decoder_schemas import ChatCompletionRequest, CompletionRequest

WARMUP_TEXT = "warm-up: the first session calls allocate buffers and pick kernels, before any client waits"
GENERATION_KEYS = ("temperature", "top_p", "top_k")  # sampling defaults read from generation_config.json
_log = logging.getLogger(__name__)


def decoder_spec(artifact: str | Path):
    """The artifact's spec when its task (its manifest's, else detected from its config) is text
    generation, else None: the encoder routes serve it (and refuse what they cannot)."""
    path = Path(artifact)
    if not (path / "model.onnx").is_file():
        return None
    task = models.artifact_task(path)
    if task is None or not task.decoder:
        return None
    return open_decoder(path)


@dataclass
class DecoderService:
    """What the decoder routes run on: tokenizer, engine and scheduler, and the model's facts."""

    path: Path
    tokenizer: object
    scheduler: DecoderScheduler
    eos: set
    max_length: int  # the context window (also what /info shows as max_tokens)
    defaults: dict  # sampling defaults from generation_config.json
    batching: dict  # what /info shows: {"mode": "continuous" | "one at a time", "engine", "max_streams", "reason"}


ENGINES = {"shared KV buffer": BatchDecoder, "left-padded": PaddedBatchDecoder, "single-stream": SerialDecoder}


def batching_mode(path: Path, max_streams: int) -> dict:
    """How the decoder in ``path`` is served: continuous batching in a shared GroupQueryAttention buffer, or
    in left-padded rows (the plain dynamo export, Qwen3.5's states included), else one request at a time
    on the single-stream runner, and why."""
    reason = unbatchable_reason(path)
    if reason is None:
        return {"mode": "continuous", "engine": "shared KV buffer", "max_streams": max_streams, "reason": None}
    if left_padded_batchable(path):
        return {"mode": "continuous", "engine": "left-padded", "max_streams": max_streams, "reason": None}
    return {"mode": "one at a time", "engine": "single-stream", "max_streams": 1, "reason": reason}


def open_service(config, metrics, engine_factory=None) -> DecoderService:
    spec = open_decoder(Path(config.artifact))
    tokenizer = models.load_tokenizer(spec.path, spec.trust_remote_code)
    settings: DecoderSettings = config.decoder
    batching = batching_mode(spec.path, settings.max_streams)
    settings = replace(settings, max_streams=batching["max_streams"])  # 1 on the single-stream runner
    engine_factory = engine_factory or ENGINES[batching["engine"]]
    engine = engine_factory(spec.path, config.threads, settings.max_kv_tokens, settings.max_streams)
    limits = [n for n in (context_window(spec.path), engine.max_positions) if n]
    context = min(limits) if limits else settings.max_kv_tokens
    try:
        generation = json.loads((spec.path / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        generation = {}
    defaults = {k: generation[k] for k in GENERATION_KEYS if isinstance(generation.get(k), (int, float))}
    scheduler = DecoderScheduler(engine, tokenizer, settings, DecoderMetrics(metrics))
    return DecoderService(spec.path, tokenizer, scheduler, set(eos_token_ids(spec.path, tokenizer)), context, defaults,
                          batching)


async def start_service(config, metrics, engine_factory=None) -> DecoderService:
    service = await asyncio.get_running_loop().run_in_executor(None, open_service, config, metrics, engine_factory)
    if service.batching["reason"]:  # never a silent degrade: the operator reads why in the start-up log
        _log.warning(f"batching is off for {service.path.name}: {service.batching['reason']}; requests are served "
                     "one at a time by the single-stream runner (xformopt generate's)")
    warmup = list(service.tokenizer(WARMUP_TEXT)["input_ids"])
    await service.scheduler.start(warmup)
    return service


# --------------------------------------------------------------------------- helpers


def _error(status: int, message: str, kind: str, retry_after: int | None = None) -> JSONResponse:
    headers = {"Retry-After": str(retry_after)} if retry_after else None
    return JSONResponse({"error": message, "error_type": kind}, status_code=status, headers=headers)


class Refusal(Exception):
    def __init__(self, response: JSONResponse):
        super().__init__(response.status_code)
        self.response = response


def _picker(body, defaults: dict) -> TokenPicker:
    temperature = body.temperature if body.temperature is not None else defaults.get("temperature", 1.0)
    if temperature == 0:
        return TokenPicker(Sampling())  # greedy
    top_p = body.top_p if body.top_p is not None else defaults.get("top_p")
    top_k = int(defaults["top_k"]) if defaults.get("top_k") else None
    seed = body.seed if body.seed is not None else random.SystemRandom().randrange(2**31)
    return TokenPicker(Sampling(do_sample=True, temperature=float(temperature), top_k=top_k,
                                top_p=None if top_p is None or top_p >= 1 else float(top_p), seed=seed))


def _chat_prompt(service: DecoderService, body: ChatCompletionRequest) -> list[int]:
    tokenizer = service.tokenizer
    if not getattr(tokenizer, "chat_template", None):
        raise Refusal(_error(422, "this model has no chat template; use /v1/completions with a plain prompt",
                             "Validation"))
    messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # noqa: BLE001  (a template may refuse an order of roles)
        raise Refusal(_error(422, f"messages: the model's chat template refused them ({exc})", "Validation")) from None
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _completion_prompt(service: DecoderService, body: CompletionRequest) -> list[int]:
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        vocab = len(service.tokenizer)
        if any(not 0 <= t < vocab for t in prompt):
            raise Refusal(_error(422, f"prompt: token ids must be in [0, {vocab})", "Validation"))
        return list(prompt)
    text = prompt[0] if isinstance(prompt, list) else prompt
    if not text.strip():
        raise Refusal(_error(422, "prompt: empty; give the text to continue", "Validation"))
    return list(service.tokenizer(text)["input_ids"])


def _max_tokens(service: DecoderService, settings: DecoderSettings, prompt: list[int], asked: int | None) -> int:
    room = service.max_length - len(prompt)
    if not prompt:
        raise Refusal(_error(422, "the prompt tokenizes to no tokens", "Validation"))
    if room < 1:
        raise Refusal(_error(422, f"the prompt is {len(prompt)} tokens, the model's context window "
                             f"{service.max_length}; shorten it", "Validation"))
    if asked is not None and asked > room:
        raise Refusal(_error(422, f"max_tokens {asked} + the prompt's {len(prompt)} tokens exceed the context window "
                             f"of {service.max_length}; ask for at most {room}", "Validation"))
    wanted = asked if asked is not None else min(settings.default_max_tokens, room)
    if len(prompt) + wanted > settings.max_kv_tokens:
        raise Refusal(_error(422, f"the prompt ({len(prompt)} tokens) + max_tokens {wanted} exceed the server's KV "
                             f"bound of {settings.max_kv_tokens} positions; ask for fewer tokens", "Validation"))
    return wanted


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _first(job: Job, events, request: Request):
    """The job's first event, or None when the client went away first (the job is then cancelled)."""
    nxt = asyncio.ensure_future(events.__anext__())
    gone = asyncio.ensure_future(_until_disconnect(request))
    try:
        await asyncio.wait({nxt, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if nxt.done():
        return nxt.result()
    nxt.cancel()
    job.cancel()
    return None


def _sse(payload) -> bytes:
    return b"data: " + (payload if isinstance(payload, bytes) else json.dumps(payload).encode()) + b"\n\n"


# --------------------------------------------------------------------------- routes


def add_routes(app, config, state: dict) -> set[str]:
    """Register the decoder routes on ``app``; the paths, for the request metrics."""
    model_name = config.model_name or Path(config.artifact).name
    settings: DecoderSettings = config.decoder

    def service() -> DecoderService:
        if not state["ready"] or state.get("predictor") is None:
            raise Refusal(_error(503, "the model is still loading; retry shortly", "Unhealthy", 1))
        return state["predictor"]

    async def generate(request: Request, body, prompt_of, kind: str):
        try:
            svc = service()
            prompt = prompt_of(svc, body)
            asked = getattr(body, "max_completion_tokens", None) or body.max_tokens
            max_tokens = _max_tokens(svc, settings, prompt, asked)
            job = svc.scheduler.submit(prompt, max_tokens, _picker(body, svc.defaults), body.stop_list(),
                                       set() if body.ignore_eos else svc.eos)
        except Refusal as refusal:
            return refusal.response
        except Rejected as exc:
            return _error(exc.status, exc.message, exc.kind, exc.retry_after)
        except InputError as exc:
            return _error(422, exc.message, "Validation")
        events = job.events()
        first = await _first(job, events, request)
        if first is None:
            return _error(499, "the client closed the request", "Cancelled")
        if isinstance(first, Rejected):
            return _error(first.status, first.message, first.kind, first.retry_after)
        ident = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        chunk = _ChunkWriter(kind, ident, created, body.model or model_name)
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(_stream(job, first, events, chunk, usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _whole(job, first, events, chunk, request)

    @app.post("/v1/chat/completions", summary="OpenAI-compatible chat completions (streamed with stream: true)")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await generate(request, body, _chat_prompt, "chat")

    @app.post("/v1/completions", summary="OpenAI-compatible text completions (streamed with stream: true)")
    async def completions(body: CompletionRequest, request: Request):
        return await generate(request, body, _completion_prompt, "text")

    @app.get("/v1/models", summary="The one model this server serves")
    async def list_models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "xformopt", "max_model_len": state["predictor"].max_length
                                            if state.get("predictor") else None}]}

    return {"/v1/chat/completions", "/v1/completions", "/v1/models"}


@dataclass
class _ChunkWriter:
    """OpenAI's response and chunk objects for chat (``chat.completion``) and text (``text_completion``)."""

    kind: str
    ident: str
    created: int
    model: str

    def _head(self, obj: str) -> dict:
        return {"id": self.ident, "object": obj, "created": self.created, "model": self.model}

    def chunk(self, text: str | None, finish: str | None, role: bool = False) -> dict:
        if self.kind == "chat":
            delta = ({"role": "assistant"} if role else {}) | ({"content": text} if text is not None else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return self._head("chat.completion.chunk") | {"choices": [choice]}
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return self._head("text_completion") | {"choices": [choice]}

    def usage_chunk(self, done: Done) -> dict:
        head = self._head("chat.completion.chunk" if self.kind == "chat" else "text_completion")
        return head | {"choices": [], "usage": _usage(done)}

    def whole(self, text: str, done: Done) -> dict:
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": done.finish_reason}
            return self._head("chat.completion") | {"choices": [choice], "usage": _usage(done)}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": done.finish_reason}
        return self._head("text_completion") | {"choices": [choice], "usage": _usage(done)}


def _usage(done: Done) -> dict:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens}


async def _stream(job: Job, first, events, chunk: _ChunkWriter, usage: bool):
    """One SSE chunk per generated token (its text may be "" while held back), the finish chunk,
    the usage chunk when asked, then [DONE]. Cancelled (client gone): the job is cancelled."""
    try:
        if chunk.kind == "chat":
            yield _sse(chunk.chunk("", None, role=True))
        event = first
        while True:
            if isinstance(event, Token):
                yield _sse(chunk.chunk(event.text, None))
            elif isinstance(event, Done):
                if event.text:
                    yield _sse(chunk.chunk(event.text, None))
                yield _sse(chunk.chunk(None if chunk.kind == "chat" else "", event.finish_reason))
                if usage:
                    yield _sse(chunk.usage_chunk(event))
                break
            elif isinstance(event, Rejected):  # the model failed mid-stream: say so, then end the stream
                yield _sse({"error": {"message": event.message, "type": event.kind, "code": event.status}})
                break
            event = await events.__anext__()
        yield _sse(b"[DONE]")
    finally:
        job.cancel()  # a no-op for a finished job; frees the row of one whose client went away


async def _whole(job: Job, first, events, chunk: _ChunkWriter, request: Request):
    parts, event = [], first
    watcher = asyncio.ensure_future(_until_disconnect(request))
    try:
        while True:
            if isinstance(event, Token):
                parts.append(event.text)
            elif isinstance(event, Done):
                parts.append(event.text)
                return JSONResponse(chunk.whole("".join(parts), event))
            elif isinstance(event, Rejected):
                return _error(event.status, event.message, event.kind, event.retry_after)
            nxt = asyncio.ensure_future(events.__anext__())
            await asyncio.wait({nxt, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not nxt.done():
                nxt.cancel()
                return _error(499, "the client closed the request", "Cancelled")
            event = nxt.result()
    finally:
        watcher.cancel()
        job.cancel()
