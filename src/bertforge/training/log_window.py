"""`LogWindow`: what the Trainer sums between two logged training records.

Scalar outputs are summed as (device) tensors, so no step waits for the host; the sums are reduced over ranks only
when a record is written. The window is part of a checkpoint (per rank), so a resumed run continues it exactly.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from bertforge.training import distributed as D


@dataclass
class WindowTotals:
    """One window reduced over ranks: the means of the logged scalars, tokens and seconds (for speed.jsonl), and
    the first step whose loss was not finite on any rank (0: none)."""

    means: dict[str, float]
    tokens: int
    seconds: float
    first_nonfinite: int


class LogWindow:
    def __init__(self, device: torch.device):
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, Any] = {}
        self.first_nonfinite: torch.Tensor | None = None  # step of the window's first NaN/inf loss, on the device
        self.micro = 0  # micro-batches
        self.tokens = 0
        self.start = time.perf_counter()
        self.carried = 0.0  # seconds the window ran before a resume

    def start_clock(self) -> None:
        """The window's time runs from now (plus what it ran before a resume): called as training starts."""
        self.start = time.perf_counter() - self.carried

    @property
    def empty(self) -> bool:
        return self.micro == 0

    def add(self, out: Mapping[str, Any], tokens: int | torch.Tensor) -> None:
        """Add one micro-batch's scalar outputs (tensors of ndim 0, ints, floats; the rest is not logged)."""
        for key, value in out.items():
            if isinstance(value, torch.Tensor):
                if value.ndim != 0:
                    continue  # logits and other non-scalars are not logged
                value = value.detach().double()
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            self.sums[key] = self.sums.get(key, 0.0) + value
        self.micro += 1
        self.tokens += tokens

    def add_grad_norm(self, norm: torch.Tensor) -> None:
        self.sums["grad_norm"] = self.sums.get("grad_norm", 0.0) + norm.detach().double()

    def watch_loss(self, loss: torch.Tensor, step: int) -> None:
        """Remember the first step (1-based `step`) of this window whose loss is not finite, without a host sync."""
        bad = torch.where(torch.isfinite(loss.detach().float()), 0, step)
        first = self.first_nonfinite
        self.first_nonfinite = bad if first is None else torch.where(first > 0, first, bad)

    def reduce(self, world_size: int, grad_accum: int) -> WindowTotals:
        """Means over ranks (grad_norm: per optimizer step), tokens summed over ranks; then a new window starts.
        Every rank must call it (an all-reduce)."""
        keys = sorted(self.sums)
        steps_in_window = max(1, -(-self.micro // grad_accum))
        vec = torch.tensor([float(self.sums[k]) for k in keys] + [self.micro, int(self.tokens)],
                           dtype=torch.float64, device=self.device)
        vec = D.all_reduce_sum(vec).tolist()
        total_micro, total_tokens = vec[-2], vec[-1]
        means = {}
        for key, total in zip(keys, vec):
            if key == "grad_norm":  # one value per optimizer step, identical on all ranks
                means[key] = total / (steps_in_window * world_size)
            else:
                means[key] = total / total_micro
        totals = WindowTotals(means, int(total_tokens), time.perf_counter() - self.start,
                              int(self.first_nonfinite) if self.first_nonfinite is not None else 0)
        self.reset()
        return totals

    def state_dict(self) -> dict[str, Any]:
        return {"sums": {k: float(v) for k, v in self.sums.items()}, "counts": [self.micro, int(self.tokens)],
                "time": time.perf_counter() - self.start}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sums = dict(state["sums"])
        self.micro, self.tokens = (int(x) for x in state["counts"])
        self.carried = float(state["time"])
