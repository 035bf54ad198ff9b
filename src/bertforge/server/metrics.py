"""Prometheus metrics in the text exposition format (version 0.0.4), written by hand: no client library needed.

Counters and histograms keyed by label values; `render()` is the body of GET /metrics.
"""
from __future__ import annotations

import bisect
import threading
from collections import defaultdict

TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(x: float) -> str:
    return repr(float(x)) if x != int(x) else str(int(x))


class Counter:
    def __init__(self, name: str, help_text: str, labels: tuple[str, ...] = ()):
        self.name, self.help, self.label_names = name, help_text, labels
        self.values: dict[tuple[str, ...], float] = defaultdict(float)

    def inc(self, *labels: str, by: float = 1.0) -> None:
        self.values[labels] += by

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        out += [f"{self.name}{_labels(self.label_names, k)} {_num(v)}" for k, v in sorted(self.values.items())]
        return out


class Histogram:
    def __init__(self, name: str, help_text: str, labels: tuple[str, ...] = (),
                 buckets: tuple[float, ...] = TIME_BUCKETS):
        self.name, self.help, self.label_names, self.buckets = name, help_text, labels, buckets
        self.counts: dict[tuple[str, ...], list[int]] = {}
        self.sums: dict[tuple[str, ...], float] = defaultdict(float)

    def observe(self, value: float, *labels: str) -> None:
        counts = self.counts.setdefault(labels, [0] * (len(self.buckets) + 1))
        counts[bisect.bisect_left(self.buckets, value)] += 1  # le semantics: value <= bound
        self.sums[labels] += value

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for key, counts in sorted(self.counts.items()):
            total = 0
            for bound, c in zip((*self.buckets, float("inf")), counts):
                total += c
                le = "+Inf" if bound == float("inf") else _num(bound)
                bucket_label = 'le="' + le + '"'
                out.append(f"{self.name}_bucket{_labels(self.label_names, key, bucket_label)} {total}")
            out.append(f"{self.name}_sum{_labels(self.label_names, key)} {self.sums[key]!r}")
            out.append(f"{self.name}_count{_labels(self.label_names, key)} {total}")
        return out


class Metrics:
    """What the server counts: requests, their durations, queue and compute time, batch sizes and tokens."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # sync routes run in a thread pool
        self.requests = Counter("bertforge_requests_total", "HTTP requests by route and status",
                                ("route", "status"))
        self.duration = Histogram("bertforge_request_duration_seconds", "Request wall time", ("route",))
        self.queue = Histogram("bertforge_queue_seconds", "Time a request waited before its batch ran", ("op",))
        self.compute = Histogram("bertforge_compute_seconds", "Inference time of the batch a request ran in",
                                 ("op",))
        self.batch_rows = Histogram("bertforge_batch_size", "Inputs per inference batch", ("op",), SIZE_BUCKETS)
        self.busy = Counter("bertforge_inference_busy_seconds_total",
                            "Time the inference thread spent running batches (its rate is the thread's utilisation)",
                            ("op",))
        self.tokens = Counter("bertforge_tokens_total", "Input tokens processed", ("op",))
        self.inputs = Counter("bertforge_inputs_total", "Inputs processed", ("op",))
        self.in_flight = 0  # requests being handled now (a gauge)
        self.rejected = Counter("bertforge_queue_rejections_total", "Requests refused with 429 (queue full)")

    def request(self, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests.inc(route, str(status))
            self.duration.observe(seconds, route)

    def job(self, op: str, queue_s: float, compute_s: float, inputs: int, tokens: int) -> None:
        with self._lock:
            self.queue.observe(queue_s, op)
            self.compute.observe(compute_s, op)
            self.inputs.inc(op, by=inputs)
            self.tokens.inc(op, by=tokens)

    def batch(self, op: str, rows: int, _padded_tokens: int, seconds: float) -> None:
        with self._lock:
            self.batch_rows.observe(rows, op)
            self.busy.inc(op, by=seconds)

    def render(self, queue_depth: int) -> str:
        with self._lock:
            lines = []
            for m in (self.requests, self.duration, self.queue, self.compute, self.batch_rows, self.busy,
                      self.tokens, self.inputs, self.rejected):
                lines += m.render()
        lines += ["# HELP bertforge_requests_in_flight Requests being handled (this scrape not counted)",
                  "# TYPE bertforge_requests_in_flight gauge", f"bertforge_requests_in_flight {self.in_flight}"]
        lines += ["# HELP bertforge_queue_depth Requests waiting for the inference worker",
                  "# TYPE bertforge_queue_depth gauge", f"bertforge_queue_depth {queue_depth}"]
        return "\n".join(lines) + "\n"
