"""BigBird's random blocks in training mode, drawn exactly as transformers' `BigBirdBlockSparseAttention` draws them
(`_get_rand_attn_plan`, `_bigbird_block_rand_mask`, `_bigbird_block_rand_mask_with_head`,
`_get_single_block_row_attention`), which follow the original BigBird code (Zaheer et al. 2020, `bigbird/core`).

transformers seeds numpy's global generator with the layer index on every forward, so each layer has one fixed
plan, the same at every step; here a private `numpy.random.RandomState(layer)` gives the same numbers without
touching the global generator, and the plan is cached (it depends only on its arguments). Lengths of 1024, 3072
and 4096 tokens use the paper's old plan (`_bigbird_block_rand_mask`, drawn over `max_position_embeddings` and the
first 1024 tokens); other lengths the per-head plan. In eval mode transformers draws nothing (block 0 everywhere):
that is `block_sparse.BigBirdSelfAttention.random_blocks`'s business, not this module's.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

OLD_PLAN_LENGTHS = (1024, 3072, 4096)


def rand_attn_plan(length: int, block: int, r: int) -> tuple[list[int], list[int]]:
    """(ending lengths of the plan's parts, random blocks drawn from each part) (`_get_rand_attn_plan`)."""
    n = length // block
    if 2 * r + 5 < n:
        return [(2 * r + 5) * block, length], [r, 0]
    if r + 5 < n:
        return [(r + 5) * block, length], [r // 2, r - r // 2]
    return [length], [r]


def _old_plan(rng: np.random.RandomState, length: int, block: int, r: int, last_idx: int) -> np.ndarray:
    """`_bigbird_block_rand_mask` (training): [length // block - 2, r] random blocks of the middle rows."""
    n = length // block
    rand = np.zeros((n - 2, r), dtype=np.int32)
    middle = np.arange(1, n - 1, dtype=np.int32)
    last = n - 1
    if last_idx > 2 * block:
        last = last_idx // block - 1
    for i in range(1, n - 1):
        start, end = i - 2, i
        if i == 1:
            rand[i - 1] = rng.permutation(middle[2:last])[:r]
        elif i == 2:
            rand[i - 1] = rng.permutation(middle[3:last])[:r]
        elif i == n - 3 or i == n - 2:  # (the original's "missing -3 / -4" slices, kept)
            rand[i - 1] = rng.permutation(middle[:last])[:r]
        elif start > last:
            rand[i - 1] = rng.permutation(middle[:last])[:r]
        elif end + 1 == last:
            rand[i - 1] = rng.permutation(middle[:start])[:r]
        else:
            rand[i - 1] = rng.permutation(np.concatenate((middle[:start], middle[end + 1:last])))[:r]
    return rand


def _row(rng: np.random.RandomState, block_id: int, to_start: int, to_end: int, r: int) -> np.ndarray:
    """`_get_single_block_row_attention` with one window block either side and one global block each end."""
    perm = rng.permutation(np.arange(to_start, to_end, dtype=np.int32))
    illegal = list(range(block_id - 1, block_id + 2)) + [0] + [to_end - 1]
    if block_id == 1:
        illegal.append(to_end - 2)
    if block_id == to_end - 2:
        illegal.append(1)
    chosen = []
    for b in perm[: to_end - to_start]:
        if b not in illegal:
            chosen.append(b)
        if len(chosen) == r:
            break
    return np.array(chosen, dtype=np.int32)


def _head_plan(rng: np.random.RandomState, length: int, block: int, heads: int, plan_len: list[int],
               plan_r: list[int]) -> list[np.ndarray]:
    """`_bigbird_block_rand_mask_with_head` (training), one global block at each end: per head
    [length // block - 2, sum(plan_r)]."""
    n = length // block
    plan_blocks = np.array(plan_len) // block
    last_plan = plan_len.index(length)
    rand = [np.zeros((n, int(np.sum(plan_r[: last_plan + 1]))), dtype=np.int32) for _ in range(heads)]
    for p in range(last_plan + 1):
        lo = 0
        if p > 0:
            if plan_r[p] > 0:
                lo, hi = int(np.sum(plan_r[:p])), int(np.sum(plan_r[: p + 1]))
                for row in range(1, plan_blocks[p - 1]):
                    for h in range(heads):
                        rand[h][row, lo:hi] = _row(rng, row, plan_blocks[p - 1], plan_blocks[p], plan_r[p])
            for q in range(p):
                if plan_r[q] == 0:
                    continue
                for row in range(plan_blocks[p - 1], plan_blocks[p]):
                    lo, start = (int(np.sum(plan_r[:q])), plan_blocks[q - 1]) if q > 0 else (0, 0)
                    hi = int(np.sum(plan_r[: q + 1]))
                    for h in range(heads):
                        rand[h][row, lo:hi] = _row(rng, row, start, plan_blocks[q], plan_r[q])
        if plan_r[p] == 0:
            continue
        hi = int(np.sum(plan_r[: p + 1]))
        first_row, start = 1, 0
        if p > 0:
            lo = int(np.sum(plan_r[:p]))
            first_row = start = plan_blocks[p - 1]
        for row in range(first_row, plan_blocks[p]):
            for h in range(heads):
                rand[h][row, lo:hi] = _row(rng, row, start, plan_blocks[p], plan_r[p])
    return [r_[1: n - 1] for r_ in rand]


@lru_cache(maxsize=64)
def training_plan(layer: int, length: int, block: int, r: int, heads: int, max_length: int) -> np.ndarray:
    """[heads, length // block - 2, r] random key blocks of the middle query blocks, as transformers draws them in
    training mode for layer `layer` (seed = the layer index); read-only (cached)."""
    rng = np.random.RandomState(layer)
    if length in OLD_PLAN_LENGTHS:
        n = length // block
        plan = np.stack([_old_plan(rng, max_length, block, r, last_idx=1024)[: n - 2] for _ in range(heads)])
    else:
        plan_len, plan_r = rand_attn_plan(length, block, r)
        plan = np.stack(_head_plan(rng, length, block, heads, plan_len, plan_r))
    plan.setflags(write=False)
    return plan
