"""Dynamic batching: requests wait (at most ``max_wait_ms`` after the first) until ``max_batch`` inputs
are queued, then run together, the way Triton's dynamic batcher and Ray Serve's ``@serve.batch`` do.

One batch is worked in one worker thread (off the event loop): its inputs missing from the
tokenization cache are tokenized in one fast-tokenizer call; rows (one per sequence the graph sees)
are sorted by token length and cut into groups whose padding stays under ``max_padding`` of the
positions fed, so a long input does not make 31 short ones pay for its length; each group is one
session call. Each request gets its own rows back, in order.

The queue is bounded in inputs and in seconds of work (inputs over the rate batches ran at lately): a
request that would overflow it is refused at once (``Overloaded``: 503 with Retry-After), never
buffered without bound. A request still unanswered at its deadline gets
``DeadlineExceeded`` (504) and its inputs are dropped from any batch not yet started. A session call
that raises fails only that batch's requests; the scheduler keeps serving.

Results are cached per input (the exact input and the options that change its answer), so a repeated
input is answered without queueing; tokenized inputs are cached too, so a repeated text with new
options is not tokenized again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from xformopt.errors import InputError
from xformopt.serve import autotune
from xformopt.serve.caches import MISSING, LRUCache, input_key

log = logging.getLogger("xformopt.serve")


class Overloaded(Exception):
    """The queue is full: retry after ``retry_after`` seconds."""

    def __init__(self, retry_after: int):
        super().__init__(f"the server's queue is full; retry after {retry_after} s")
        self.retry_after = retry_after


class DeadlineExceeded(Exception):
    """The request was not answered within its deadline."""


class BatchFailed(Exception):
    """The session call that carried this request raised (the server keeps serving)."""


@dataclass(frozen=True)
class Settings:
    max_batch: int | None = None  # inputs per batch (and rows per session call); None: measured at start
    max_wait_ms: float | None = None  # how long a batch's first request may wait for others; None: measured
    max_queue: int = 1024  # inputs waiting, at most
    max_queue_s: float = 1.0  # ... and at most this much work waiting, at the measured rate (0: no such bound)
    timeout_s: float = 10.0  # a request's deadline, from arrival
    cache_size: int = 10_000  # results (and tokenized inputs) kept; 0: no caching
    max_padding: float = 0.25  # largest share of padding positions in one session call


@dataclass(eq=False)
class Job:
    items: list
    truncate: bool
    finish: dict  # options for Predictor.finish (normalize, raw_scores)
    arrived: float
    deadline: float
    future: asyncio.Future
    cancelled: bool = False
    results: list = field(default_factory=list)


def length_groups(lengths: list[int], max_rows: int, max_padding: float) -> list[list[int]]:
    """Indices into ``lengths`` cut into groups: ascending length, at most ``max_rows`` each, and the
    padding of each group (its rows padded to its longest) under ``max_padding`` of its positions."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    current: list[int] = []
    real = 0
    for i in order:
        n = lengths[i]
        if current:
            padded = n * (len(current) + 1)
            if len(current) >= max_rows or (padded - real - n) > max_padding * padded:
                groups.append(current)
                current, real = [], 0
        current.append(i)
        real += n
    if current:
        groups.append(current)
    return groups


class Scheduler:
    def __init__(self, predictor, settings: Settings, metrics):
        self.predictor = predictor
        self.settings = settings
        self.metrics = metrics
        self.results = LRUCache(settings.cache_size)
        self.tokens = LRUCache(settings.cache_size)
        self._pending: deque[Job] = deque()
        self._queued = 0  # inputs in _pending
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="xformopt-batch")
        self._rate = 0.0  # inputs per second lately (for Retry-After)
        self.in_flight = 0
        self.tuning: autotune.Choice | None = None  # how max_batch / max_wait_ms were chosen

    # ------------------------------------------------------------------ lifecycle

    async def start(self, warmup_inputs: list | None = None) -> None:
        self._wake = asyncio.Event()
        if warmup_inputs:  # first session calls are slow (allocations, kernel choice): not a client's
            probe = Job(list(warmup_inputs), True, {}, 0.0, math.inf, asyncio.get_running_loop().create_future())
            outcome = await asyncio.get_running_loop().run_in_executor(self._executor, self._work, [probe])
            if isinstance(outcome[0], Exception):
                raise outcome[0]
        sample = warmup_inputs[0] if warmup_inputs and isinstance(warmup_inputs[0], dict) else None
        self.tuning = await asyncio.get_running_loop().run_in_executor(
            self._executor, autotune.tune, self.predictor, self.settings.max_batch, self.settings.max_wait_ms, sample)
        self.settings = replace(self.settings, max_batch=self.tuning.max_batch, max_wait_ms=self.tuning.max_wait_ms)
        if self.tuning.call_ms:
            timings = ", ".join(f"{b}: {t:.2f}" for b, t in self.tuning.call_ms.items())
            log.info(f"batching: max batch {self.settings.max_batch} ({self.tuning.source['max_batch']}), max wait "
                     f"{self.settings.max_wait_ms:g} ms ({self.tuning.source['max_wait_ms']}); session call ms by "
                     f"batch size at {self.tuning.probe_tokens} tokens: {timings}")
        self._task = asyncio.create_task(self._loop(), name="xformopt-scheduler")

    async def stop(self) -> None:
        """Finish every queued batch, then stop."""
        self._stopping = True
        if self._wake is not None:
            self._wake.set()
        if self._task is not None:
            await self._task
        self._executor.shutdown(wait=True)

    # ------------------------------------------------------------------ requests

    async def submit(self, items: list, *, truncate: bool = True, **finish) -> list[tuple]:
        """(answer, tokens) per input, in order; raises Overloaded, DeadlineExceeded, BatchFailed,
        InputError (an input the model cannot take)."""
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        options = (truncate, tuple(sorted(finish.items())))
        keys = [(input_key(item), options) for item in items]
        answers = [self.results.get(k) for k in keys]
        hits = sum(a is not MISSING for a in answers)
        self.metrics.cache.labels("hit").inc(hits)
        self.metrics.cache.labels("miss").inc(len(items) - hits if self.results.capacity else 0)
        missing = [i for i, a in enumerate(answers) if a is MISSING]
        if not missing:
            return answers
        if self._stopping:
            raise Overloaded(1)
        if self._queued + len(missing) > self.settings.max_queue or self._backlog_s(len(missing)) > \
                (self.settings.max_queue_s or math.inf):
            raise Overloaded(self._retry_after())
        job = Job([items[i] for i in missing], truncate, finish, arrived, arrived + self.settings.timeout_s,
                  loop.create_future())
        self._pending.append(job)
        self._queued += len(job.items)
        self.metrics.queue_depth.set(self._queued)
        self._wake.set()
        self.in_flight += 1
        try:
            computed = await asyncio.wait_for(asyncio.shield(job.future), job.deadline - loop.time())
        except TimeoutError:
            raise DeadlineExceeded(f"not answered within {self.settings.timeout_s:g} s") from None
        finally:
            job.cancelled = True  # a batch not yet started skips it (answered, timed out or disconnected)
            self.in_flight -= 1
        for i, answer, key in zip(missing, computed, (keys[i] for i in missing)):
            answers[i] = answer
            self.results.put(key, answer)
        return answers

    def _backlog_s(self, more: int) -> float:
        """Seconds of work queued with ``more`` inputs, at the rate batches ran lately (0 before any ran).
        Bounding it keeps the backlog an overload leaves behind short: the server is back to normal
        latency within about that long after the overload ends (1024 queued inputs were 4-5 s of work)."""
        return (self._queued + more) / self._rate if self._rate > 0 else 0.0

    def _retry_after(self) -> int:
        return max(1, math.ceil(self._queued / self._rate)) if self._rate > 0 else 1

    # ------------------------------------------------------------------ the batch loop

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        wait_s = self.settings.max_wait_ms / 1000.0
        while True:
            while not self._pending:
                if self._stopping:
                    return
                self._wake.clear()
                await self._wake.wait()
            first = self._pending[0]
            while self._queued < self.settings.max_batch and not self._stopping:
                remaining = first.arrived + wait_s - loop.time()
                if remaining <= 0:
                    break
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), remaining)
                except TimeoutError:
                    break
            batch = self._take()
            now = loop.time()
            live = []
            for job in batch:
                if job.cancelled or job.future.done():
                    continue
                if now >= job.deadline:
                    job.future.set_exception(DeadlineExceeded("expired in the queue"))
                    continue
                live.append(job)
            if not live:
                continue
            started = time.perf_counter()
            try:
                outcomes = await loop.run_in_executor(self._executor, self._work, live)
            except Exception as exc:  # noqa: BLE001  (a failing batch must not stop the server)
                self.metrics.batch_failures.inc()
                outcomes = [BatchFailed(f"the model failed on this batch ({type(exc).__name__}: {exc})")] * len(live)
            elapsed = time.perf_counter() - started
            inputs = sum(len(j.items) for j in live)
            self._rate = 0.8 * self._rate + 0.2 * (inputs / max(elapsed, 1e-6)) if self._rate else inputs / max(elapsed, 1e-6)
            self.metrics.batch_inputs.observe(inputs)
            for job, outcome in zip(live, outcomes):
                if job.future.done():
                    continue
                if isinstance(outcome, Exception):
                    job.future.set_exception(outcome)
                else:
                    job.future.set_result(outcome)

    def _take(self) -> list[Job]:
        """Jobs from the head of the queue up to max_batch inputs (always at least one job)."""
        batch, count = [], 0
        while self._pending and (not batch or count + len(self._pending[0].items) <= self.settings.max_batch):
            job = self._pending.popleft()
            batch.append(job)
            count += len(job.items)
        self._queued -= count
        self.metrics.queue_depth.set(self._queued)
        return batch

    # ------------------------------------------------------------------ the worker thread

    def _prepare(self, jobs: list[Job]) -> list:
        """Per job: its inputs' Prepared, or the InputError one of its inputs raised."""
        per_job: list = [[None] * len(job.items) for job in jobs]
        for truncate in (True, False):
            todo = []  # (job, item) not in the tokenization cache
            for j, job in enumerate(jobs):
                if job.truncate != truncate:
                    continue
                for k, item in enumerate(job.items):
                    cached = self.tokens.get((input_key(item), truncate))
                    if cached is MISSING:
                        todo.append((j, k))
                    else:
                        per_job[j][k] = cached
            self.metrics.token_cache.labels("hit").inc(sum(1 for j, job in enumerate(jobs) if job.truncate == truncate
                                                           for p in per_job[j] if p is not None))
            self.metrics.token_cache.labels("miss").inc(len(todo))
            if not todo:
                continue
            try:
                prepared = self.predictor.prepare([jobs[j].items[k] for j, k in todo], truncate)
            except InputError:
                # Rare: some input is refused. Tokenize job by job so the error names that job's input.
                prepared = []
                for j in sorted({j for j, _ in todo}):
                    try:
                        self.predictor.prepare(jobs[j].items, truncate)
                    except InputError as exc:
                        per_job[j] = exc
                todo = [(j, k) for j, k in todo if not isinstance(per_job[j], Exception)]
                prepared = self.predictor.prepare([jobs[j].items[k] for j, k in todo], truncate) if todo else []
            for (j, k), p in zip(todo, prepared):
                per_job[j][k] = p
                self.tokens.put((input_key(jobs[j].items[k]), truncate), p)
        return per_job

    def _work(self, jobs: list[Job]) -> list:
        """One batch: per job its list of (answer, tokens), or the exception it gets."""
        per_job = self._prepare(jobs)
        rows = [(j, k, r) for j, prepared in enumerate(per_job) if not isinstance(prepared, Exception)
                for k, p in enumerate(prepared) for r in range(len(p.rows))]
        lengths = [per_job[j][k].rows[r].length for j, k, r in rows]
        outputs: dict[tuple, object] = {}
        # before start-up has chosen max_batch (the warm-up batch), every row may share a call
        for group in length_groups(lengths, self.settings.max_batch or max(1, len(rows)), self.settings.max_padding):
            chosen = [rows[i] for i in group]
            result = self.predictor.run_rows([per_job[j][k].rows[r] for j, k, r in chosen])
            outputs.update(zip(chosen, result))
            self.metrics.batch_size.observe(len(group))
            self.metrics.tokens.inc(sum(lengths[i] for i in group))
            self.metrics.padded_tokens.inc(len(group) * max(lengths[i] for i in group))
        answers = []
        for j, (job, prepared) in enumerate(zip(jobs, per_job)):
            if isinstance(prepared, Exception):
                answers.append(prepared)
                continue
            answers.append([(self.predictor.finish(p, [outputs[(j, k, r)] for r in range(len(p.rows))], **job.finish),
                             sum(row.length for row in p.rows)) for k, p in enumerate(prepared)])
        return answers
