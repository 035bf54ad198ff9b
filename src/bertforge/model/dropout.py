"""Dropout with the same distribution as torch's, drawn faster on the CPU.

On the CPU, `torch.bernoulli_` (behind `nn.Dropout` and the dropout inside `scaled_dot_product_attention`) draws
its masks at about half the speed of `torch.rand`; in a bert-mini pretraining step that is 14% of the time
(13 masks a step). bertforge's dropout keeps an element where a uniform draw u in [0, 1) has u >= p, which
happens with probability 1 - p, exactly as Bernoulli(1 - p), and scales the kept ones by 1 / (1 - p): the same
random function, drawn from torch's generator (so `torch.manual_seed` still makes runs repeat), but not the same
masks as torch's for a given seed. On a GPU torch's own kernels are used (its Philox draws are fast).

`torch_masks()` switches back to torch's masks, for comparisons that need bit-identical draws with another
library under the same seed (`benchmarks/finetune.py`).
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

_torch_masks = False


@contextmanager
def torch_masks(enabled: bool = True) -> Iterator[None]:
    """Within the block, dropout draws its masks as torch does (`F.dropout`, SDPA's own dropout)."""
    global _torch_masks
    before, _torch_masks = _torch_masks, enabled
    try:
        yield
    finally:
        _torch_masks = before


def uniform_masks(x: torch.Tensor) -> bool:
    """Whether dropout on `x` draws its masks from `torch.rand` (the CPU, unless `torch_masks()` is on)."""
    return x.device.type == "cpu" and not _torch_masks


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    if not uniform_masks(x) or p >= 1.0:
        return F.dropout(x, p, True)
    keep = torch.rand(x.shape, device=x.device) >= p  # fp32 draws whatever x's dtype: P(keep) is exactly 1 - p
    return x * keep * (1.0 / (1.0 - p))  # autograd keeps the bool mask for backward, as torch's dropout does


class Dropout(nn.Dropout):
    """`nn.Dropout` drawing its masks with `dropout` above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
