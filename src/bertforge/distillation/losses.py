"""Distillation losses and the teacher-outputs cache they share.

    soft = kd_loss(student_logits, teacher_logits, T=2.0)     # KL(teacher_T || student_T) * T^2 (Hinton et al.)
    cos = cosine_loss(student_hidden, teacher_hidden, mask)   # 1 - cos over real tokens (DistilBERT's L_cos)
    mse = logit_mse(student_logits, teacher_logits)           # Tang et al. 2019: MSE on the raw logits

`TeacherCache` runs the frozen teacher under `inference_mode` once per unique input and keeps its logits, so the
epochs after the first (and every loss that reads them) cost no teacher forward passes.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 2.0,
            mask: torch.Tensor | None = None) -> torch.Tensor:
    """Hinton et al.'s soft-target loss: KL(softmax(t/T) || softmax(s/T)) * T^2, averaged over rows.

    The T^2 factor keeps the soft-target gradients the same size as the hard-label ones when T changes.
    `mask` (bool, the logits' leading shape) keeps only some rows (real tokens when tagging)."""
    s, t = student_logits.float(), teacher_logits.float()
    if mask is not None:
        s, t = s[mask], t[mask]
    s, t = s.reshape(-1, s.shape[-1]), t.reshape(-1, t.shape[-1])
    if s.shape[0] == 0:
        return student_logits.sum() * 0.0
    log_p_s = F.log_softmax(s / temperature, dim=-1)
    log_p_t = F.log_softmax(t / temperature, dim=-1)
    kl = (log_p_t.exp() * (log_p_t - log_p_s)).sum(-1)
    return kl.mean() * temperature ** 2


def logit_mse(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
              mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean squared error between raw logits (Tang et al. 2019; also the soft loss for regression)."""
    s, t = student_logits.float(), teacher_logits.float()
    if mask is not None:
        s, t = s[mask], t[mask]
    if s.numel() == 0:
        return student_logits.sum() * 0.0
    return F.mse_loss(s, t)


def cosine_loss(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """DistilBERT's L_cos: mean of 1 - cos(h_s, h_t) over the real (unpadded) tokens."""
    s, t = student_hidden.float(), teacher_hidden.float()
    if attention_mask is not None:
        keep = attention_mask.bool()
        s, t = s[keep], t[keep]
    s, t = s.reshape(-1, s.shape[-1]), t.reshape(-1, t.shape[-1])
    return (1.0 - F.cosine_similarity(s, t, dim=-1)).mean()


def soft_target_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, kind: str,
                     temperature: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The soft loss for a task kind: KL at temperature T for classification / tagging, MSE for regression."""
    if kind == "regress":
        return logit_mse(student_logits, teacher_logits, mask)
    return kd_loss(student_logits, teacher_logits, temperature, mask)


class TeacherCache:
    """Teacher outputs by input key: the teacher runs (under inference_mode) only on keys it has not seen.

    `fn(indices)` computes a batch of outputs for the given example indices (each row its own tensor, padding
    trimmed); `get(keys, indices)` returns them in order, computing the missing ones in one call. `calls` and
    `computed` count teacher batches and rows (the tests check each unique input is computed once).

    `block` (the keys being the indices 0..total-1): a missing index brings in its whole block of `block`
    consecutive indices, in one call. Every row is then computed in the same company (the same padding, the same
    matrix shapes) whichever training batch first asked for it, so its logits do not depend on the order of the
    batches: a run resumed with an empty cache reproduces the uninterrupted run's losses bit for bit.

    `blocks` (a partition of the indices, e.g. the first epoch's batches in the loader's order): a missing index
    brings in its own block instead. With the first epoch's batches, that epoch computes exactly the rows it trains
    on, step by step (not a whole fixed block for every row of a shuffled batch), and a row is still always computed
    in the same company, whichever epoch or resumed run asks for it first."""

    def __init__(self, fn: Callable[[list[int]], list[torch.Tensor]], block: int | None = None,
                 total: int | None = None, blocks: Sequence[Sequence[int]] | None = None):
        if block is not None and total is None:
            raise ValueError("a blocked TeacherCache needs the number of rows (total)")
        self.fn, self.block, self.total = fn, block, total
        self.blocks = [[int(i) for i in b] for b in blocks] if blocks is not None else None
        self.block_of = {i: j for j, b in enumerate(self.blocks) for i in b} if self.blocks is not None else None
        self.store: dict[Hashable, torch.Tensor] = {}
        self.calls = 0
        self.computed = 0

    def get(self, keys: Sequence[Hashable], indices: Sequence[int]) -> list[torch.Tensor]:
        missing = [(k, i) for k, i in zip(keys, indices) if k not in self.store]
        # the same key twice in one batch is computed once
        todo = list(dict(missing).items())
        if todo and self.block_of is not None:
            for b in sorted({self.block_of[i] for _, i in todo}):
                self._compute([(i, i) for i in self.blocks[b]])  # type: ignore[index]
        elif todo and self.block is not None:
            for b in sorted({i // self.block for _, i in todo}):
                rows = range(b * self.block, min((b + 1) * self.block, self.total))
                self._compute([(i, i) for i in rows])
        elif todo:
            self._compute(todo)
        return [self.store[k] for k in keys]

    def _compute(self, todo: list[tuple[Hashable, int]]) -> None:
        with torch.inference_mode():
            outs = self.fn([i for _, i in todo])
        self.calls += 1
        self.computed += len(todo)
        for (k, _), out in zip(todo, outs):
            self.store[k] = out.detach().float().cpu().clone()

    def __len__(self) -> int:
        return len(self.store)
