"""Turning next-token logits into a choice: repetition penalty, temperature, top-k, top-p.

The maths and the order are transformers' (RepetitionPenaltyLogitsProcessor, then the Temperature, TopK and TopP
warpers), so that the same logits and the same random stream pick the same token.
"""
from __future__ import annotations

import torch


def repetition_penalty(scores: torch.Tensor, sequences: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's penalty on every token already in `sequences` [B, T]: a positive score is divided by `penalty`, a
    negative one multiplied (so the token always becomes less likely for penalty > 1). scores [B, V]."""
    if penalty == 1.0:
        return scores
    seen = scores.gather(1, sequences)
    seen = torch.where(seen < 0, seen * penalty, seen / penalty)
    return scores.scatter(1, sequences, seen)


def warp(scores: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Sampling scores [B, V]: divided by `temperature`, then all but the `top_k` best (0: no limit) and all outside
    the nucleus of probability `top_p` set to -inf. The most likely token always survives."""
    if temperature != 1.0:
        scores = scores / temperature
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        # Ascending sort: drop the least likely tokens while their cumulative probability stays <= 1 - top_p.
        sorted_scores, order = torch.sort(scores, descending=False)
        drop = sorted_scores.softmax(-1).cumsum(-1) <= 1 - top_p
        drop[..., -1:] = False
        scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return scores
