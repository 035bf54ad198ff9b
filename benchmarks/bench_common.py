"""What several benchmark scripts share: the machine-wide benchmark lock, the best-of-N timer and the atomic
JSON write.

Scripts run as `python benchmarks/NAME.py`, so this module imports as `bench_common`."""
from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK = "/tmp/bertforge-bench.lock"  # timed sections of different benchmarks never overlap (flock(1) semantics)


@contextmanager
def bench_lock() -> Iterator[None]:
    """The shared benchmark lock: wait for it, hold it, release it. BERTFORGE_BENCH_LOCK=off: no lock (a smoke run
    of gpu_check.sh --quick, whose figures are not figures, waits for nobody)."""
    if os.environ.get("BERTFORGE_BENCH_LOCK", "").lower() == "off":
        yield
        return
    with open(LOCK, "a") as f:
        t = time.time()
        fcntl.flock(f, fcntl.LOCK_EX)
        print(f"benchmark lock taken after {time.time() - t:.0f} s wait", flush=True)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def save(path: Path, result: dict) -> None:
    """Write `result` as JSON through a temporary file, so an interrupted run never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, path)


def timed(fn: Callable[[], object], device) -> float:
    """Seconds of one call of `fn`, the GPU's queued work included (a torch.device of type "cuda" is synchronised
    before and after)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t


def best_time(fn: Callable[[], object], repeats: int, warmup: int = 0) -> float:
    """The fastest of `repeats` timed calls of `fn` (after `warmup` untimed ones), in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def book_words(path: Path) -> list[str]:
    """A Project Gutenberg book's words between its header and footer (the whole text where they are absent)."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    start = next((i + 1 for i, line in enumerate(lines) if re.match(r"\*\*\* ?START OF", line)), 0)
    end = next((i for i, line in enumerate(lines) if re.match(r"\*\*\* ?END OF", line)), len(lines))
    return " ".join(lines[start:end]).split()
