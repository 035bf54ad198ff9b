"""Dynamic batching: requests wait in a bounded queue; one worker thread runs them in batches.

    job = await batcher.submit(op, inputs, lengths)   # raises QueueFull at once when the queue is full (-> 429)
    job.results                                       # one result per input, in order

The collector (a task on the event loop) takes the oldest job and starts a batch with it. When the worker is idle,
it keeps adding jobs of the same operation that are already queued, or arrive within `max_wait_ms`, while the padded
batch (rows x longest input) stays within `max_batch_tokens`, then hands the batch over. When the worker is busy,
the batch is handed over at once but stays open: jobs that arrive while the worker computes join it until the
worker takes it (up to `max_in_flight` batches are handed over: the one computing and the one filling). So the
event loop answers one batch's requests and reads the next requests while the worker computes, and while requests
keep coming the worker does not wait for the loop between batches. A batch's inputs are sorted by length (longest
first), run in one call of the operation on the single inference thread, and the results are scattered back to
each job. A job that fails inside a batch of several is re-run alone, so one bad input fails only its own request.
`stop()` drains: every job queued before it still runs. A job whose request was cancelled (its client went away,
see `server.app.Around`) is dropped wherever it waits: taken from the queue, or when the worker takes its batch.
"""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bertforge.server.registry import Operation


class QueueFull(Exception):
    """The queue holds max_queue requests already (back-pressure: the caller answers 429)."""


@dataclass(eq=False)
class Job:
    op: Operation
    inputs: list[Any]
    lengths: list[int]
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)
    started: float = 0.0
    finished: float = 0.0
    batch_rows: int = 0       # inputs in the batch this job ran in
    results: list[Any] | None = None

    @property
    def width(self) -> int:
        return max(self.lengths, default=1)

    @property
    def queue_s(self) -> float:
        return self.started - self.enqueued

    @property
    def compute_s(self) -> float:
        return self.finished - self.started


class _Batch:
    """Jobs of one operation that run together. Open until the worker takes it (`take`): the collector may add
    jobs from the event loop while it waits in the worker's queue; the lock orders an add against the take."""

    def __init__(self, first: Job) -> None:
        self.jobs = [first]
        self.rows, self.width = len(first.inputs), first.width
        self._lock = threading.Lock()
        self._taken = False

    def add(self, job: Job, max_tokens: int) -> bool:
        """Add `job` if the batch is still open, of its operation and within the token budget."""
        op = self.jobs[0].op
        with self._lock:
            if (self._taken or job.op is not op or not op.batchable
                    or (self.rows + len(job.inputs)) * max(self.width, job.width) > max_tokens):
                return False
            self.jobs.append(job)
            self.rows, self.width = self.rows + len(job.inputs), max(self.width, job.width)
            return True

    def take(self) -> list[Job]:
        with self._lock:
            self._taken = True
            return list(self.jobs)


class Batcher:
    def __init__(self, max_batch_tokens: int = 16384, max_wait_ms: float = 2.0, max_queue: int = 256,
                 on_batch: Any = None, max_in_flight: int = 2):
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.max_batch_tokens = max_batch_tokens
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self.max_in_flight = max_in_flight  # 1: a batch forms only after the previous one is answered
        self.on_batch = on_batch  # callback(op_name, rows, padded_tokens, seconds) for metrics, on the event loop
        self._queue: asyncio.Queue[Job | None] | None = None
        self._held: Job | None = None  # taken from the queue but left for the next batch (other op / too big)
        self._task: asyncio.Task | None = None
        self._in_flight = 0  # batches handed to the worker and not yet answered
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertforge-infer")

    # ---- lifecycle -----------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._queue = asyncio.Queue(maxsize=self.max_queue)
        self._task = asyncio.get_running_loop().create_task(self._collect())

    async def stop(self) -> None:
        """Run every queued job, then end the collector and the worker thread."""
        if self._task is None:
            return
        await self._queue.put(None)  # FIFO: the jobs before the sentinel still run
        await self._task
        self._task = None
        self._pool.shutdown(wait=True)

    @property
    def depth(self) -> int:
        return (self._queue.qsize() if self._queue is not None else 0) + (self._held is not None)

    # ---- the API -------------------------------------------------------------------------------------------------
    async def submit(self, op: Operation, inputs: list[Any], lengths: list[int]) -> Job:
        """Queue one request's inputs and wait for their results (the job carries timings too)."""
        if self._queue is None or self._task is None:
            raise RuntimeError("the batcher is not running")
        job = Job(op, inputs, lengths, asyncio.get_running_loop().create_future())
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            raise QueueFull(f"the queue is full ({self.max_queue} requests waiting)") from None
        await job.future
        return job

    # ---- the collector -------------------------------------------------------------------------------------------
    async def _next(self, timeout: float | None) -> Job | None | bool:
        """The next queued job whose client still waits, None for the stop sentinel, False when nothing came within
        `timeout`."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        while True:
            try:
                job = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                left = None if deadline is None else deadline - time.perf_counter()
                if left is not None and left <= 0:
                    return False
                try:
                    job = await asyncio.wait_for(self._queue.get(), left)
                except asyncio.TimeoutError:
                    return False
            if job is None or not job.future.done():
                return job

    async def _collect(self) -> None:
        slots = asyncio.Semaphore(self.max_in_flight)
        running: set[asyncio.Task] = set()
        stopping = False
        while True:
            first = self._held if self._held is not None else (None if stopping else await self._next(None))
            self._held = None
            if first is None:
                break
            batch = _Batch(first)
            await slots.acquire()
            worker_idle = self._in_flight == 0
            deadline = time.perf_counter() + self.max_wait_s
            while not stopping and self._held is None and first.op.batchable:
                # idle worker: gather for max_wait_ms, then hand over; busy worker: hand over now (below) and
                # keep filling until the worker takes the batch
                nxt = await self._next(deadline - time.perf_counter() if worker_idle else 0)
                if nxt is False:
                    break
                if nxt is None:
                    stopping = True
                elif not batch.add(nxt, self.max_batch_tokens):
                    self._held = nxt
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._dispatch(batch, slots))
            running.add(task)
            task.add_done_callback(running.discard)
            while not worker_idle and not stopping and self._held is None and first.op.batchable:
                nxt = await self._next(None)  # the batch waits for the worker: arrivals join it
                if nxt is None:
                    stopping = True
                elif not batch.add(nxt, self.max_batch_tokens):
                    self._held = nxt  # taken by the worker already, or full: it starts the next batch
        if running:
            await asyncio.gather(*running)

    async def _dispatch(self, batch: _Batch, slots: asyncio.Semaphore) -> None:
        try:
            jobs, outcomes = await asyncio.get_running_loop().run_in_executor(self._pool, _take_and_run, batch)
        finally:
            self._in_flight -= 1
            slots.release()
        if self.on_batch is not None and jobs:  # the rows that ran
            seconds = max(job.finished for job in jobs) - min(job.started for job in jobs)
            rows, width = sum(len(job.inputs) for job in jobs), max(job.width for job in jobs)
            self.on_batch(jobs[0].op.name, rows, rows * width, seconds)
        for job, outcome in zip(jobs, outcomes):
            if job.future.done():  # the client went away (its request task was cancelled)
                continue
            if isinstance(outcome, BaseException):
                job.future.set_exception(outcome)
            else:
                job.results = outcome
                job.future.set_result(None)


def _take_and_run(batch: _Batch) -> tuple[list[Job], list[list[Any] | BaseException]]:
    """On the inference thread: close the batch to further jobs, drop those whose request was cancelled while the
    batch waited (reading a future's state from this thread is safe; a cancel that comes later only wastes the
    work), then run it."""
    jobs = [job for job in batch.take() if not job.future.done()]
    return jobs, _run_batch(jobs) if jobs else []


def _run_batch(batch: list[Job]) -> list[list[Any] | BaseException]:
    """On the inference thread: run the batch's inputs sorted by length, scatter results back per job."""
    start = time.perf_counter()
    flat = [(job_i, k, length) for job_i, job in enumerate(batch) for k, length in enumerate(job.lengths)]
    flat.sort(key=lambda t: -t[2])  # stable: equal lengths keep their arrival order
    try:
        results = batch[0].op.run([batch[j].inputs[k] for j, k, _ in flat])
        if len(results) != len(flat):
            raise RuntimeError(f"{batch[0].op.name} returned {len(results)} results for {len(flat)} inputs")
        per_job: list[list[Any] | BaseException] = [[None] * len(job.inputs) for job in batch]
        for (j, k, _), res in zip(flat, results):
            per_job[j][k] = res
    except Exception as err:  # noqa: BLE001 - handed to the request(s) that caused it
        if len(batch) == 1:
            per_job = [err]
        else:
            per_job = [_run_batch([job])[0] for job in batch]  # one bad input fails only its own request
    end = time.perf_counter()
    rows = sum(len(job.inputs) for job in batch)
    for job in batch:
        job.started = job.started or start
        job.finished = job.finished or end
        job.batch_rows = job.batch_rows or rows
    return per_job
