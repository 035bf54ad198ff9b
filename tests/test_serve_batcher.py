"""The dynamic batcher on its own (no HTTP): what runs together, in which order, and when."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from bertforge.server.batcher import Batcher
from bertforge.server.registry import Operation


class Recorder:
    """An operation that doubles numbers, records each call's inputs and can be held inside a call."""

    def __init__(self, name: str = "double", batchable: bool = True) -> None:
        self.calls: list[list[int]] = []
        self.release = threading.Event()
        self.entered = threading.Event()
        self.op = Operation(name, self.run, batchable)

    def run(self, inputs: list[int]) -> list[int]:
        self.calls.append(list(inputs))
        if -1 in inputs:
            self.entered.set()
            self.release.wait(10)
        if 13 in inputs:
            raise ValueError("unlucky input")
        return [2 * x for x in inputs]


async def _wait_until(flag: threading.Event) -> None:
    for _ in range(1000):
        if flag.is_set():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the worker never started the call")


def _run_while_busy(max_in_flight: int, max_wait_ms: float) -> tuple[Recorder, list]:
    """Job [-1] holds the worker; three single jobs arrive meanwhile; then the worker is let go."""
    rec = Recorder()

    async def main():
        b = Batcher(max_batch_tokens=1000, max_wait_ms=max_wait_ms, max_in_flight=max_in_flight)
        b.start()
        blocker = asyncio.create_task(b.submit(rec.op, [-1], [1]))
        await _wait_until(rec.entered)
        waiting = [asyncio.create_task(b.submit(rec.op, [x], [1])) for x in (1, 2, 3)]
        await asyncio.sleep(0.05)  # the three are queued (and, with 2 in flight, handed over) while the worker is held
        rec.release.set()
        jobs = [await blocker] + [await t for t in waiting]
        await b.stop()
        return jobs

    return rec, asyncio.run(main())


@pytest.mark.parametrize("max_in_flight", [1, 2])
def test_requests_arriving_while_the_worker_computes_form_the_next_batch(max_in_flight):
    rec, jobs = _run_while_busy(max_in_flight, max_wait_ms=2.0)
    assert rec.calls == [[-1], [1, 2, 3]]
    assert [j.results for j in jobs] == [[-2], [2], [4], [6]]
    assert [j.batch_rows for j in jobs] == [1, 3, 3, 3]


def test_with_two_in_flight_the_next_batch_starts_as_soon_as_the_worker_is_free():
    # a long max_wait shows the difference: with one batch in flight, the next batch forms only after the first is
    # answered, and waits max_wait for company; with two, it was handed over while the first computed
    _, jobs = _run_while_busy(2, max_wait_ms=300.0)
    assert jobs[1].started - jobs[0].finished < 0.1
    _, jobs = _run_while_busy(1, max_wait_ms=300.0)
    assert jobs[1].started - jobs[0].finished >= 0.25


def test_a_batch_stays_open_for_arrivals_until_the_worker_takes_it():
    rec = Recorder()

    async def main():
        b = Batcher(max_batch_tokens=1000, max_wait_ms=1.0, max_in_flight=2)
        b.start()
        blocker = asyncio.create_task(b.submit(rec.op, [-1], [1]))
        await _wait_until(rec.entered)
        first = asyncio.create_task(b.submit(rec.op, [1], [1]))
        await asyncio.sleep(0.05)  # handed over, open: the worker is still held
        later = [asyncio.create_task(b.submit(rec.op, [x], [1])) for x in (2, 3)]
        await asyncio.sleep(0.05)
        rec.release.set()
        await asyncio.gather(blocker, first, *later)
        await b.stop()

    asyncio.run(main())
    assert rec.calls == [[-1], [1, 2, 3]]


def test_token_budget_and_operation_split_batches_and_longest_inputs_run_first():
    rec, other = Recorder(), Recorder("other")

    async def main():
        b = Batcher(max_batch_tokens=12, max_wait_ms=1.0, max_in_flight=2)
        b.start()
        blocker = asyncio.create_task(b.submit(rec.op, [-1], [1]))
        await _wait_until(rec.entered)
        # 2 rows x width 4 = 8 fits; a third row of width 5 would make 3 x 5 = 15 > 12
        a = asyncio.create_task(b.submit(rec.op, [1, 2], [2, 4]))
        c = asyncio.create_task(b.submit(rec.op, [3], [5]))
        d = asyncio.create_task(b.submit(other.op, [4], [1]))
        await asyncio.sleep(0.05)
        rec.release.set()
        out = await asyncio.gather(blocker, a, c, d)
        await b.stop()
        return out

    _, a, c, d = asyncio.run(main())
    assert rec.calls == [[-1], [2, 1], [3]]  # sorted longest first within the batch; results back in order
    assert other.calls == [[4]]
    assert a.results == [2, 4] and c.results == [6] and d.results == [8]


def test_one_bad_input_fails_only_its_own_request():
    rec = Recorder()

    async def main():
        b = Batcher(max_batch_tokens=1000, max_wait_ms=20.0)
        b.start()
        tasks = [asyncio.create_task(b.submit(rec.op, [x], [1])) for x in (1, 13, 3)]
        out = await asyncio.gather(*tasks, return_exceptions=True)
        await b.stop()
        return out

    good1, bad, good3 = asyncio.run(main())
    assert isinstance(bad, ValueError)
    assert good1.results == [2] and good3.results == [6]


def test_stop_runs_every_queued_job_first():
    rec = Recorder()

    async def main():
        b = Batcher(max_batch_tokens=2, max_wait_ms=0.0, max_in_flight=2)  # 2 tokens: one job per batch
        b.start()
        blocker = asyncio.create_task(b.submit(rec.op, [-1], [1]))
        await _wait_until(rec.entered)
        tasks = [asyncio.create_task(b.submit(rec.op, [x], [2])) for x in range(1, 6)]
        await asyncio.sleep(0.02)
        stopping = asyncio.create_task(b.stop())
        await asyncio.sleep(0.02)
        rec.release.set()
        await stopping
        return await asyncio.gather(blocker, *tasks)

    t0 = time.perf_counter()
    jobs = asyncio.run(main())
    assert time.perf_counter() - t0 < 5
    assert [j.results for j in jobs] == [[-2], [2], [4], [6], [8], [10]]
    assert rec.calls == [[-1], [1], [2], [3], [4], [5]]


def test_batches_in_flight_must_be_positive():
    with pytest.raises(ValueError, match="max_in_flight"):
        Batcher(max_in_flight=0)
