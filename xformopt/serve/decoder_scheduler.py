"""Continuous batching for decoders: requests join the running batch at the next step and leave it
when done, each in its own KV row (:class:`~xformopt.runtime.batch_decoder.BatchDecoder`).

One engine thread owns the model. Each turn of its loop:

1. takes new requests into the waiting queue, drops streams whose client went away (their rows are
   freed here, at the next step), and refuses waiting requests past their queue deadline;
2. admits waiting requests in arrival order while a KV row is free and the buffer's bound holds (a
   request reserves prompt + max_tokens positions; the head of the queue is never overtaken, so a
   long request is not starved by short ones);
3. reads newcomers' prompts: separate calls, one row each, up to ``prefill_chunk`` prompt tokens per
   turn in all (a long prompt is read a chunk per turn). Prefill is its own call because the graph
   takes one new-token count per call: joining it to the decode call would pad every decoding row to
   the prompt's length. The chunk bounds how long a newcomer's prompt stalls the running streams;
4. runs one decode step of every decoding row in one call, picks each row's token with that
   request's own sampler (its seed), and streams it out.

Memory never grows without bound: rows and cached positions are capped (``max_streams``,
``max_kv_tokens``), and the waiting queue is capped (``max_waiting``): a request beyond it gets 503
with Retry-After at once. SIGTERM (:meth:`DecoderScheduler.begin_drain`) refuses the waiting requests
(503: nothing was sent to them yet), lets running streams finish within ``drain_s``, and ends those
still running then with finish_reason "length" and a clean end of stream.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from xformopt.decoder.generate import TokenPicker
from xformopt.serve.decoder_text import IncrementalText

IDLE_WAIT_S = 0.05  # the engine's nap when there is nothing to do (also how soon it sees a drain)


@dataclass(frozen=True)
class DecoderSettings:
    max_streams: int = 16  # sequences decoding together: rows per decode call
    max_waiting: int = 64  # requests queued for a row; more get 503 at once
    max_kv_tokens: int = 8192  # KV positions allocated at most (rows x capacity)
    prefill_chunk: int = 64  # prompt tokens read per engine turn, between decode steps (README: 32-256 measured)
    default_max_tokens: int = 512  # max_tokens when a request gives none (capped by the context window)
    queue_timeout_s: float = 30.0  # a request waiting longer for a row gets 503
    drain_s: float = 20.0  # after SIGTERM, how long running streams may go on


class Rejected(Exception):
    """Refused before generation started: an HTTP status, a message, and Retry-After seconds."""

    def __init__(self, status: int, message: str, kind: str, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.retry_after = status, message, kind, retry_after


@dataclass
class Token:
    text: str  # the text this token makes safe to send ("" while held back)
    token_id: int


@dataclass
class Done:
    finish_reason: str  # "stop" (EOS or a stop string), "length" (max_tokens, context, or drain)
    prompt_tokens: int
    completion_tokens: int
    text: str = ""  # what the last token released (held-back text at the end)


@dataclass(eq=False)
class Job:
    prompt_ids: list[int]
    max_tokens: int
    picker: TokenPicker
    text: IncrementalText
    eos: frozenset
    queue: asyncio.Queue
    arrived: float
    deadline: float
    slot: object = None
    read: int = 0  # prompt tokens read
    new_ids: list[int] = field(default_factory=list)
    last_token_at: float = 0.0
    cancelled: bool = False  # set by the event loop (client gone); seen by the engine at its next turn
    ended: bool = False

    @property
    def reserved(self) -> int:
        return len(self.prompt_ids) + self.max_tokens


    async def events(self):
        """Token, then Done or Rejected, as the engine sends them."""
        while True:
            event = await self.queue.get()
            yield event
            if isinstance(event, (Done, Rejected)):
                return

    def cancel(self) -> None:
        self.cancelled = True


def _deliver(batch: list) -> None:
    for queue, event in batch:
        queue.put_nowait(event)


class DecoderScheduler:
    def __init__(self, engine, tokenizer, settings: DecoderSettings, metrics):
        self.engine, self.tokenizer, self.settings, self.metrics = engine, tokenizer, settings, metrics
        self._inbox: deque[Job] = deque()
        self._waiting: deque[Job] = deque()
        self._prefilling: list[Job] = []
        self._decoding: list[Job] = []
        self._job_of: dict = {}  # engine slot -> job
        self._outbox: list[tuple[asyncio.Queue, object]] = []  # events of this turn, sent together
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._drain_at: float | None = None  # monotonic time of SIGTERM (a plain store: signal-handler safe)
        self._duration = 0.0  # recent generation time per request (for Retry-After)
        self.metrics.kv_limit.set(engine.max_kv_tokens)

    # ------------------------------------------------------------------ lifecycle

    async def start(self, warmup_ids: list[int] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        if warmup_ids:
            await asyncio.get_running_loop().run_in_executor(None, self._warm_up, list(warmup_ids))
        self._thread = threading.Thread(target=self._run, name="xformopt-decoder", daemon=True)
        self._thread.start()

    def begin_drain(self) -> None:
        """SIGTERM: stop admitting; the running streams get ``drain_s`` to finish."""
        if self._drain_at is None:
            self._drain_at = time.monotonic()

    async def stop(self) -> None:
        self.begin_drain()
        self._stop = True
        with self._wake:
            self._wake.notify()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)

    @property
    def draining(self) -> bool:
        return self._drain_at is not None

    # ------------------------------------------------------------------ requests (event loop side)

    def submit(self, prompt_ids: list[int], max_tokens: int, picker: TokenPicker, stop: list[str] | None,
               eos: set[int]) -> Job:
        """Queue one generation; Rejected (503) when draining or the queue is full."""
        if self.draining:
            self.metrics.rejected.labels("draining").inc()
            raise Rejected(503, "the server is shutting down; retry on another replica", "Unavailable", 1)
        queued = len(self._inbox) + len(self._waiting)
        if queued >= self.settings.max_waiting:
            self.metrics.rejected.labels("queue_full").inc()
            raise Rejected(503, f"{queued} requests are waiting for a free slot (the limit); retry later",
                           "Overloaded", self._retry_after(queued))
        now = time.monotonic()
        job = Job(list(prompt_ids), int(max_tokens), picker, IncrementalText(self.tokenizer, stop), frozenset(eos),
                  asyncio.Queue(), now, now + self.settings.queue_timeout_s)
        with self._wake:
            self._inbox.append(job)
            self._wake.notify()
        return job

    def _retry_after(self, queued: int) -> int:
        per_slot = self._duration or 1.0
        return max(1, math.ceil(per_slot * queued / self.settings.max_streams))

    # ------------------------------------------------------------------ the engine thread

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._inbox:
                    self._waiting.append(self._inbox.popleft())
                idle = not (self._waiting or self._prefilling or self._decoding)
                if idle and self._stop:
                    return
                if idle:
                    self._wake.wait(IDLE_WAIT_S)
                    continue
            now = time.monotonic()
            self._drop_cancelled()
            self._refuse_waiting(now)
            self._admit()
            self._prefill_turn()
            self._decode_turn()
            if self._drain_at is not None and now - self._drain_at >= self.settings.drain_s:
                for job in self._prefilling + self._decoding:
                    self._finish(job, "length")
            self._flush()
            self._gauges()

    def _drop_cancelled(self) -> None:
        for job in [j for j in self._waiting if j.cancelled]:
            self._waiting.remove(job)
            self.metrics.finished.labels("cancelled").inc()
        for job in [j for j in self._prefilling + self._decoding if j.cancelled]:
            self._release(job)
            self.metrics.finished.labels("cancelled").inc()

    def _refuse_waiting(self, now: float) -> None:
        while self._waiting and (self._drain_at is not None or now >= self._waiting[0].deadline):
            job = self._waiting.popleft()
            if self._drain_at is not None:
                self.metrics.rejected.labels("draining").inc()
                self._post(job, Rejected(503, "the server is shutting down; retry on another replica", "Unavailable", 1))
            else:
                self.metrics.rejected.labels("queue_timeout").inc()
                self._post(job, Rejected(503, f"no free slot within {self.settings.queue_timeout_s:g} s; retry later",
                                  "Overloaded", self._retry_after(len(self._waiting) + 1)))

    def _admit(self) -> None:
        while self._waiting and len(self._prefilling) + len(self._decoding) < self.settings.max_streams:
            job = self._waiting[0]
            if not self.engine.fits(job.reserved):
                break  # the head waits for rows to free up; nobody overtakes it
            self._waiting.popleft()
            job.slot = self.engine.open(job.reserved)
            self._job_of[job.slot] = job
            self._prefilling.append(job)

    def _prefill_turn(self) -> None:
        budget = self.settings.prefill_chunk
        for job in list(self._prefilling):
            if budget <= 0:
                break
            chunk = job.prompt_ids[job.read: job.read + budget]
            started = time.perf_counter()
            try:
                logits = self.engine.prefill(job.slot, chunk)
            except Exception as exc:  # noqa: BLE001  (one failing call must not stop the server)
                self._fail([job], exc)
                continue
            self._flush()  # the decode step follows: send what is ready first
            self.metrics.step.labels("prefill").observe(time.perf_counter() - started)
            self.metrics.prefill_tokens.observe(len(chunk))
            self.metrics.prompt_tokens.inc(len(chunk))
            job.read += len(chunk)
            budget -= len(chunk)
            if job.read == len(job.prompt_ids):
                self._prefilling.remove(job)
                self.engine.start_decoding(job.slot)
                self._decoding.append(job)
                self._accept(job, logits)

    def _decode_turn(self) -> None:
        if not self._decoding:
            return
        jobs = [self._job_of[slot] for slot in self.engine.decoding]  # the engine's row order
        started = time.perf_counter()
        try:
            logits = self.engine.decode([j.new_ids[-1] for j in jobs])
        except Exception as exc:  # noqa: BLE001
            self._fail(jobs, exc)
            return
        self.metrics.step.labels("decode").observe(time.perf_counter() - started)
        self.metrics.batch_size.observe(len(jobs))
        for job, row in zip(jobs, logits):
            self._accept(job, row)

    def _accept(self, job: Job, logits: np.ndarray) -> None:
        """Pick the job's next token from its logits, send it, and end the job when it is done."""
        sequence = np.asarray(job.prompt_ids + job.new_ids, dtype=np.int64) if job.picker.sampling.do_sample else None
        token = job.picker(sequence, logits)
        now = time.monotonic()
        if job.new_ids:
            self.metrics.inter_token.observe(now - job.last_token_at)
        else:
            self.metrics.ttft.observe(now - job.arrived)
        job.new_ids.append(token)
        job.last_token_at = now
        self.metrics.generated.inc()
        delta = job.text.add(job.new_ids)
        if job.text.stop_hit is not None or token in job.eos:
            self._finish(job, "stop", delta)
        elif len(job.new_ids) >= job.max_tokens:
            self._finish(job, "length", delta)
        else:
            self._post(job, Token(delta, token))

    def _finish(self, job: Job, reason: str, delta: str = "") -> None:
        if job.ended:
            return
        self._release(job)
        job.ended = True
        self._post(job, Done(reason, len(job.prompt_ids), len(job.new_ids), delta + job.text.flush()))
        self.metrics.finished.labels(reason).inc()
        elapsed = time.monotonic() - job.arrived
        self._duration = 0.8 * self._duration + 0.2 * elapsed if self._duration else elapsed

    def _fail(self, jobs: list[Job], exc: Exception) -> None:
        for job in jobs:
            self._release(job)
            job.ended = True
            self._post(job, Rejected(500, f"the model failed ({type(exc).__name__}: {exc})", "Backend"))
            self.metrics.finished.labels("error").inc()

    def _release(self, job: Job) -> None:
        for group in (self._prefilling, self._decoding):
            if job in group:
                group.remove(job)
        if job.slot is not None:
            self.engine.close(job.slot)
            self._job_of.pop(job.slot, None)
            job.slot = None

    def _post(self, job: Job, event) -> None:
        self._outbox.append((job.queue, event))

    def _flush(self) -> None:
        """Hand this turn's events to the event loop in one call (one wake-up per step, not one per stream)."""
        if not self._outbox:
            return
        batch, self._outbox = self._outbox, []
        try:
            self._loop.call_soon_threadsafe(_deliver, batch)
        except RuntimeError:  # the event loop is gone (process ending): nobody is listening
            pass

    def _gauges(self) -> None:
        m = self.metrics
        m.running.set(len(self._prefilling) + len(self._decoding))
        m.waiting.set(len(self._waiting) + len(self._inbox))
        m.kv_tokens.set(self.engine.cached_positions)
        m.kv_allocated.set(self.engine.allocated_positions)

    def _warm_up(self, ids: list[int]) -> None:
        """First calls allocate and pick kernels: run a few prompts and decode steps before /health says 200."""
        rows = max(1, min(self.settings.max_streams, 4))
        ids = ids[: max(1, min(len(ids), self.engine.max_kv_tokens // rows - 2))]
        slots = [self.engine.open(len(ids) + 2) for _ in range(rows)]
        for slot in slots:
            self.engine.prefill(slot, ids)
            self.engine.start_decoding(slot)
        self.engine.decode([ids[-1]] * rows)
        self.engine.decode([ids[-1]] * rows)
        for slot in slots:
            self.engine.close(slot)
