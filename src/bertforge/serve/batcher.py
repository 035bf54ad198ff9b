"""Dynamic batching: requests wait in a bounded queue; one worker thread runs them in batches.

    job = await batcher.submit(op, inputs, lengths)   # raises QueueFull at once when the queue is full (-> 429)
    job.results                                       # one result per input, in order

The collector (a task on the event loop) takes the oldest job, then keeps adding jobs of the same operation that
are already queued, or arrive within `max_wait_ms`, while the padded batch (rows x longest input) stays within
`max_batch_tokens`. The batch's inputs are sorted by length (longest first), run in one call of the operation on
the single inference thread, and the results are scattered back to each job. A job that fails inside a batch of
several is re-run alone, so one bad input fails only its own request. While the worker computes, new requests
pile up in the queue and form the next batch: under load batches fill by themselves, with no waiting.
`stop()` drains: every job queued before it still runs.
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bertforge.serve.registry import Operation


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


class Batcher:
    def __init__(self, max_batch_tokens: int = 16384, max_wait_ms: float = 2.0, max_queue: int = 256,
                 on_batch: Any = None):
        self.max_batch_tokens = max_batch_tokens
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self.on_batch = on_batch  # callback(op_name, rows, padded_tokens) for metrics, run on the event loop
        self._queue: asyncio.Queue[Job | None] | None = None
        self._held: Job | None = None  # taken from the queue but left for the next batch (other op / too big)
        self._task: asyncio.Task | None = None
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
        """The next queued job, None for the stop sentinel, False when nothing came within `timeout`."""
        try:
            return self._queue.get_nowait()
        except asyncio.QueueEmpty:
            if timeout is not None and timeout <= 0:
                return False
        try:
            return await asyncio.wait_for(self._queue.get(), timeout)
        except asyncio.TimeoutError:
            return False

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        stopping = False
        while True:
            first = self._held if self._held is not None else (None if stopping else await self._next(None))
            self._held = None
            if first is None:
                return
            batch, rows, width = [first], len(first.inputs), first.width
            deadline = time.perf_counter() + self.max_wait_s
            while first.op.batchable and not stopping:
                nxt = await self._next(deadline - time.perf_counter())
                if nxt is False:
                    break
                if nxt is None:
                    stopping = True
                    break
                if nxt.op is not first.op or (rows + len(nxt.inputs)) * max(width, nxt.width) > self.max_batch_tokens:
                    self._held = nxt
                    break
                batch.append(nxt)
                rows, width = rows + len(nxt.inputs), max(width, nxt.width)
            if self.on_batch is not None:
                self.on_batch(first.op.name, rows, rows * width)
            outcomes = await loop.run_in_executor(self._pool, _run_batch, batch)
            for job, outcome in zip(batch, outcomes):
                if job.future.done():  # the client went away (its request task was cancelled)
                    continue
                if isinstance(outcome, BaseException):
                    job.future.set_exception(outcome)
                else:
                    job.results = outcome
                    job.future.set_result(None)


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
