"""The encoder-decoder route of ``xformopt serve``: OpenAI's ``/v1/completions`` with the source text as
the prompt (a string, or a list of sources answered in one call), batched across requests.

Why this route: it is the one OpenAI clients and load tools already speak, the decoder artifacts serve
it too, and a text-to-text request is a prompt in, a completion out. Extensions in the body, as
vLLM and TGI add theirs: ``num_beams`` and ``length_penalty`` (the model's generation config otherwise).

Batching: requests queue; one worker thread takes the first and, for up to ``max_wait_ms``, every
other waiting request with the same generation settings, up to ``max_batch`` sources, and runs them
as one padded batch (greedy or beam search over the two graphs). Streaming is not offered: beam search
knows its output only at the end.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from xformopt import models
from xformopt.errors import InputError
from xformopt.seq2seq.text import Text2TextModel, is_seq2seq_artifact

DEFAULT_MAX_BATCH = 16
DEFAULT_WAIT_MS = 5.0


class Seq2SeqCompletionRequest(BaseModel):
    """OpenAI completions with the source text as the prompt (a list: one completion per source)."""

    model_config = ConfigDict(extra="ignore")
    prompt: str | list[str]
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1, description="tokens to generate at most [default: the model's]")
    num_beams: int | None = Field(None, ge=1, le=16, description="beam width [default: the model's generation config]")
    length_penalty: float | None = None
    stream: bool = False


def seq2seq_spec(artifact: str | Path):
    """The artifact's spec when it is an encoder-decoder (both graphs present), else None."""
    path = Path(artifact)
    if not is_seq2seq_artifact(path):
        return None
    return models.describe(path, models.artifact_task(path).name)


@dataclass(eq=False)
class _Job:
    sources: list[str]
    key: tuple
    settings: object
    future: asyncio.Future
    results: list = field(default_factory=list)


class Seq2SeqService:
    """The model and its batching worker."""

    def __init__(self, model: Text2TextModel, max_batch: int, max_wait_ms: float):
        self.model, self.max_batch, self.max_wait = model, max_batch, max_wait_ms / 1e3
        self.max_length = model.max_length
        self.queue: asyncio.Queue[_Job] = asyncio.Queue()
        self.worker: asyncio.Task | None = None
        self.batches: list[int] = []  # sources per session batch, for /info and the tests

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.model.generate, ["warm up"])  # first calls pick kernels
        self.worker = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self.worker is not None:
            self.worker.cancel()

    async def submit(self, sources: list[str], settings) -> list:
        key = (settings.num_beams, settings.max_new_tokens, settings.length_penalty)
        job = _Job(sources, key, settings, asyncio.get_running_loop().create_future())
        await self.queue.put(job)
        return await job.future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        held: list[_Job] = []
        while True:
            first = held.pop(0) if held else await self.queue.get()
            batch, size = [first], len(first.sources)
            deadline = loop.time() + self.max_wait
            while size < self.max_batch:
                try:
                    job = await asyncio.wait_for(self.queue.get(), max(0.0, deadline - loop.time()))
                except asyncio.TimeoutError:
                    break
                if job.key == first.key and size + len(job.sources) <= self.max_batch:
                    batch.append(job)
                    size += len(job.sources)
                else:
                    held.append(job)  # other settings, or too many: the next batch
            sources = [s for job in batch for s in job.sources]
            try:
                out = await loop.run_in_executor(None, self.model.generate, sources, first.settings)
            except Exception as exc:  # noqa: BLE001 - answered to each waiting request
                for job in batch:
                    job.future.set_exception(exc)
                continue
            self.batches.append(len(sources))
            start = 0
            for job in batch:
                job.future.set_result(out[start:start + len(job.sources)])
                start += len(job.sources)


async def start_service(config) -> Seq2SeqService:
    loop = asyncio.get_running_loop()
    model = await loop.run_in_executor(None, Text2TextModel, config.artifact, config.threads)
    service = Seq2SeqService(model, config.scheduler.max_batch or DEFAULT_MAX_BATCH,
                             config.scheduler.max_wait_ms if config.scheduler.max_wait_ms is not None else DEFAULT_WAIT_MS)
    await service.start()
    return service


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": message, "error_type": kind}, status_code=status,
                        headers={"Retry-After": "1"} if status == 503 else None)


def add_routes(app, config, state: dict) -> set[str]:
    """Register ``/v1/completions`` and ``/v1/models`` on ``app``; the paths, for the request metrics."""
    model_name = config.model_name or Path(config.artifact).name

    @app.post("/v1/completions", summary="OpenAI completions: the prompt is the source text (translation, summary)")
    async def completions(body: Seq2SeqCompletionRequest):
        service: Seq2SeqService | None = state.get("predictor")
        if not state["ready"] or service is None:
            return _error(503, "the model is still loading; retry shortly", "Unhealthy")
        if body.stream:
            return _error(422, "stream: encoder-decoder completions are answered whole (beam search ends together); "
                               "send stream: false", "Validation")
        sources = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
        if not sources or len(sources) > config.max_inputs:
            return _error(422, f"prompt: send 1 to {config.max_inputs} source texts", "Validation")
        try:
            settings = service.model.options(num_beams=body.num_beams, max_new_tokens=body.max_tokens,
                                             length_penalty=body.length_penalty)
            if any(not s.strip() for s in sources):
                raise InputError("prompt: every source text must be non-empty")
            started = time.perf_counter()
            out = await service.submit(sources, settings)
        except InputError as exc:
            return _error(422, exc.message, "Validation")
        choices = [{"index": i, "text": g.text, "finish_reason": "stop" if g.stopped == "eos" else "length",
                    "logprobs": None} for i, g in enumerate(out)]
        prompt_tokens, completion_tokens = sum(g.source_tokens for g in out), sum(len(g.ids) for g in out)
        return JSONResponse({"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion",
                             "created": int(time.time()), "model": body.model or model_name, "choices": choices,
                             "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                       "total_tokens": prompt_tokens + completion_tokens},
                             "xformopt": {"num_beams": settings.num_beams,
                                          "seconds": round(time.perf_counter() - started, 6)}})

    @app.get("/v1/models", summary="OpenAI model list: this artifact")
    async def list_models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "xformopt"}]}

    return {"/v1/completions", "/v1/models"}
