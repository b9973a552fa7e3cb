"""Dynamic batching: requests wait (at most ``max_wait_ms`` after the first) until ``max_batch`` inputs
are queued, then run together, the way Triton's dynamic batcher and Ray Serve's ``@serve.batch`` do.

One batch is worked in one worker thread (off the event loop): its inputs missing from the
tokenization cache are tokenized in one fast-tokenizer call; rows (one per sequence the graph sees)
are sorted by token length and cut into groups whose padding stays under ``max_padding`` of the
positions fed, so a long input does not make 31 short ones pay for its length; each group is one
session call. Each request gets its own rows back, in order.

The queue is bounded in inputs and in seconds of work (inputs over the rate batches ran at lately): a
request that would overflow it is refused at once (``Overloaded``: 503 with Retry-After), never
buffered without bound. Until a batch has run, the rate is the one measured at start-up, so a burst
right after start-up is bounded too; and the queue never takes more work than the request deadline
(``timeout_s``) allows: a request the backlog cannot reach in time is refused at once (503), not left
to time out (504). A request still unanswered at its deadline gets ``DeadlineExceeded`` (504) and its
inputs are dropped from any batch not yet started. A session call that raises fails only that batch's
requests; the scheduler keeps serving. Each outcome is delivered only to a request still waiting for it
(a future whose request left is cancelled), so no exception is left unretrieved.

The batching settings are measured at start-up (xformopt.serve.autotune). While idle, the scheduler
times one batch-1 call of the probe row every ``CANARY_S``; when their median drifts past ``DRIFT`` x
the measured call (or the start-up measurement was marked busy), it measures again in the background,
one pair of calls between batches, and serves on with the new settings (flags stay as given).

Results are cached per input (the exact input and the options that change its answer), so a repeated
input is answered without queueing; tokenized inputs are cached too, so a repeated text with new
options is not tokenized again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import statistics
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from xformopt.errors import InputError
from xformopt.serve import autotune
from xformopt.serve.caches import MISSING, LRUCache, input_key

_log = logging.getLogger(__name__)

CANARY_S = 5.0  # while idle, one batch-1 probe call this often (how the drift is seen)
CANARY_WINDOW = 9  # probe calls whose median is compared with the measured call
DRIFT = 2.0  # a median this many times slower or faster than measured starts a re-measurement
RETUNE_COOLDOWN_S = 60.0  # at most one re-measurement per this long


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
    truncate: bool | str  # True, False, or "left" (TEI's truncation_direction)
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
        self._rate = 0.0  # inputs per second lately (for Retry-After and the admission bounds)
        self._running = 0  # inputs in the batch the worker runs now
        self.in_flight = 0
        self.tuning: autotune.Choice | None = None  # how max_batch / max_wait_ms were chosen
        self.retunes = 0
        self._flags = (settings.max_batch, settings.max_wait_ms)  # what the flags pinned (None: measured)
        self._reference_ms: float | None = None
        self._probe = None  # the probe row (canary calls and re-measurements)
        self._canaries: deque[float] = deque(maxlen=CANARY_WINDOW)
        self._next_canary = math.inf
        self._tuned_at = 0.0
        self._retune: autotune.Measurement | None = None
        self._retune_reason = ""

    # ------------------------------------------------------------------ lifecycle

    async def start(self, warmup_inputs: list | None = None, reference_ms: float | None = None) -> None:
        """Warm up, measure the batching settings the flags left open (``reference_ms``: the artifact's
        recorded batch-1 latency, a sanity bound for the measurement), start the batch loop."""
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._reference_ms = reference_ms
        if warmup_inputs:  # first session calls are slow (allocations, kernel choice): not a client's
            probe = Job(list(warmup_inputs), True, {}, 0.0, math.inf, loop.create_future())
            started = time.perf_counter()
            outcome = await loop.run_in_executor(self._executor, self._work, [probe])
            if isinstance(outcome[0], Exception):
                raise outcome[0]
            # a first, slow call: a low rate to start from when nothing is measured (it admits less, not more)
            self._rate = len(warmup_inputs) / max(time.perf_counter() - started, 1e-6)
        sample = warmup_inputs[0] if warmup_inputs and isinstance(warmup_inputs[0], dict) else None
        self._probe = await loop.run_in_executor(self._executor, autotune.probe_row, self.predictor, sample)
        choice = await loop.run_in_executor(self._executor, autotune.tune, self.predictor, *self._flags, sample,
                                            reference_ms)
        self._apply(choice)
        self._task = asyncio.create_task(self._loop(), name="xformopt-scheduler")

    def _apply(self, choice: autotune.Choice) -> None:
        self.tuning = choice
        self.settings = replace(self.settings, max_batch=choice.max_batch, max_wait_ms=choice.max_wait_ms)
        if not choice.call_ms:
            return
        if choice.reason == "start-up":  # the rate batches run at, until they have run (then: as they ran)
            self._rate = choice.rows_per_s() or self._rate
        self._tuned_at = time.monotonic()
        self._canaries.clear()
        self._next_canary = time.monotonic() + CANARY_S
        timings = ", ".join(f"{b}: {t:.2f}" for b, t in choice.call_ms.items())
        busy = " (busy: over the artifact's recorded latency; measured again when idle)" if choice.busy else ""
        _log.info(f"batching ({choice.reason}): max batch {choice.max_batch} ({choice.source['max_batch']}), max wait "
                 f"{choice.max_wait_ms:g} ms ({choice.source['max_wait_ms']}); quiet session call ms by batch size at "
                 f"{choice.probe_tokens} tokens: {timings}; {choice.pairs} pairs in {choice.seconds:.1f} s, "
                 f"{choice.dropped} dropped as disturbed{busy}")

    async def stop(self) -> None:
        """Finish every queued batch, then stop."""
        self._stopping = True
        if self._wake is not None:
            self._wake.set()
        if self._task is not None:
            await self._task
        self._executor.shutdown(wait=True)

    # ------------------------------------------------------------------ requests

    async def submit(self, items: list, *, truncate: bool | str = True, cache: bool = True, **finish) -> list[tuple]:
        """(answer, tokens) per input, in order; raises Overloaded, DeadlineExceeded, BatchFailed,
        InputError (an input the model cannot take). ``cache=False``: answers too large to keep (every
        token's vector) are neither looked up nor kept."""
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        options = (truncate, tuple(sorted(finish.items())))
        keys = [(input_key(item), options) for item in items]
        answers = [self.results.get(k) if cache else MISSING for k in keys]
        hits = sum(a is not MISSING for a in answers)
        self.metrics.cache.labels("hit").inc(hits)
        self.metrics.cache.labels("miss").inc(len(items) - hits if self.results.capacity and cache else 0)
        missing = [i for i, a in enumerate(answers) if a is MISSING]
        if not missing:
            return answers
        if self._stopping:
            raise Overloaded(1)
        if self._queued + len(missing) > self.settings.max_queue or self._backlog_s(len(missing)) > \
                (self.settings.max_queue_s or math.inf) or self._ahead_s() > self.settings.timeout_s:
            raise Overloaded(self._retry_after())
        job = Job([items[i] for i in missing], truncate, finish, arrived, arrived + self.settings.timeout_s,
                  loop.create_future())
        self._pending.append(job)
        self._queued += len(job.items)
        self.metrics.queue_depth.set(self._queued)
        self._wake.set()
        self.in_flight += 1
        try:
            # asyncio.wait, not wait_for(shield(...)): a shield cancelled before its future is done drops
            # the callback that reads the future's outcome, and an exception set later is "never retrieved"
            done, _ = await asyncio.wait((job.future,), timeout=max(0.0, job.deadline - loop.time()))
        finally:
            job.cancelled = True  # a batch not yet started skips it (answered, timed out or disconnected)
            self.in_flight -= 1
            if not job.future.done():
                job.future.cancel()  # nobody waits for it any more: no outcome is set on it, none left unread
        if not done:
            raise DeadlineExceeded(f"not answered within {self.settings.timeout_s:g} s")
        computed = job.future.result()  # the batch's exception, if it failed
        for i, answer, key in zip(missing, computed, (keys[i] for i in missing)):
            answers[i] = answer
            if cache:
                self.results.put(key, answer)
        return answers

    def _backlog_s(self, more: int) -> float:
        """Seconds of work queued with ``more`` inputs, at the rate batches ran lately (0 before any ran).
        Bounding it keeps the backlog an overload leaves behind short: the server is back to normal
        latency within about that long after the overload ends (1024 queued inputs were 4-5 s of work)."""
        return (self._queued + more) / self._rate if self._rate > 0 else 0.0

    def _ahead_s(self) -> float:
        """Seconds of work ahead of a new request (queued and running), at the recent rate: when it is
        over the deadline, the request could only time out, so it is refused at once instead."""
        return (self._queued + self._running) / self._rate if self._rate > 0 else 0.0

    def _retry_after(self) -> int:
        return max(1, math.ceil(self._queued / self._rate)) if self._rate > 0 else 1

    # ------------------------------------------------------------------ the batch loop

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                if self._stopping:
                    return
                if await self._idle_work():
                    continue
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), max(0.0, self._next_canary - time.monotonic())
                                           if self._next_canary < math.inf else None)
            wait_s = self.settings.max_wait_ms / 1000.0  # a re-measurement may have changed it
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
            inputs = sum(len(j.items) for j in live)
            self._running = inputs
            try:
                outcomes = await loop.run_in_executor(self._executor, self._work, live)
            except Exception as exc:  # noqa: BLE001  (a failing batch must not stop the server)
                self.metrics.batch_failures.inc()
                outcomes = [BatchFailed(f"the model failed on this batch ({type(exc).__name__}: {exc})")] * len(live)
            finally:
                self._running = 0
            elapsed = time.perf_counter() - started
            self._rate = 0.8 * self._rate + 0.2 * (inputs / max(elapsed, 1e-6)) if self._rate else inputs / max(elapsed, 1e-6)
            self.metrics.batch_inputs.observe(inputs)
            for job, outcome in zip(live, outcomes):
                if job.future.done():
                    continue
                if isinstance(outcome, Exception):
                    job.future.set_exception(outcome)
                else:
                    job.future.set_result(outcome)

    # ------------------------------------------------------------------ drift and re-measurement (idle time)

    async def _idle_work(self) -> bool:
        """One step of idle-time work, if any is due: a step of a re-measurement, or a probe call."""
        loop = asyncio.get_running_loop()
        if self._retune is not None:
            try:
                more = await loop.run_in_executor(self._executor, self._retune.step)
            except Exception as exc:  # noqa: BLE001  (a failed re-measurement keeps the settings in use)
                _log.warning(f"re-measuring the batching failed ({type(exc).__name__}: {exc}); settings kept")
                self._retune, self._next_canary = None, time.monotonic() + RETUNE_COOLDOWN_S
                return True
            if not more:
                measurement, self._retune = self._retune, None
                self.retunes += 1
                self._apply(autotune.settle(measurement, self._probe.length, *self._flags, reason=self._retune_reason))
            return True
        if time.monotonic() < self._next_canary:
            return False
        try:
            ms = await loop.run_in_executor(self._executor, self._probe_call)
        except Exception:  # noqa: BLE001  (a failing session shows on the next batch, as a 500)
            self._next_canary = math.inf
            return True
        self._canaries.append(ms)
        self._next_canary = time.monotonic() + CANARY_S
        self._maybe_retune()
        return True

    def _probe_call(self) -> float:
        started = time.perf_counter()
        self.predictor.run_rows([self._probe])
        return (time.perf_counter() - started) * 1000

    def _maybe_retune(self) -> None:
        tuning = self.tuning
        if time.monotonic() - self._tuned_at < RETUNE_COOLDOWN_S:
            return
        measured = tuning.typical_ms.get(1, 0.0)
        if tuning.busy:
            reason = "the last measurement was over the artifact's recorded latency"
        elif len(self._canaries) == self._canaries.maxlen and measured > 0 and \
                not measured / DRIFT <= (now := statistics.median(self._canaries)) <= measured * DRIFT:
            reason = f"drift: an idle batch-1 call takes {now:.2f} ms, {measured:.2f} ms when measured"
        else:
            return
        _log.info(f"batching: measuring again in idle time ({reason})")
        self._retune_reason = reason
        self._retune = autotune.Measurement(self.predictor.run_rows, self._probe, autotune.tuned_sizes(self._flags[0]),
                                            reference_ms=self._reference_ms)

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
        for truncate in dict.fromkeys(job.truncate for job in jobs):  # True, False or "left": one call each
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
