"""Hybrid retrieval: one ranked list from a dense and a sparse one.

Each list is a query's candidates as (row, score) best first, taken deeper than the k asked for
(`candidate_depth`: max(4k, 100), at most the corpus), so a passage ranked low by one method but high by the
other can still reach the top k.

- weighted: each list's scores min-max normalised over that query's candidates, (s - min) / (max - min) (a list
  whose candidates all score the same: 1 for each), then alpha * dense + (1 - alpha) * sparse, a candidate
  missing from one list counting 0 there (it scored at most that list's minimum);
- rrf: reciprocal-rank fusion (Cormack, Clarke and Buettcher 2009): sum over lists of 1 / (60 + rank), rank
  counting from 1; scores are ignored, so the two scales never need to agree.

Ties go to the earlier row (the order passages were indexed in), so a fused list is deterministic.
"""
from __future__ import annotations

from collections.abc import Sequence

from bertforge.errors import BertforgeError

FUSIONS = ("weighted", "rrf")
RRF_K = 60
Ranked = Sequence[tuple[int, float]]  # (row, score), best first


def candidate_depth(k: int, count: int) -> int:
    """How deep each list is taken before fusing the top `k` of a corpus of `count` passages."""
    return min(count, max(4 * k, 100))


def check_alpha(alpha: float) -> float:
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0.0 <= alpha <= 1.0:
        raise BertforgeError(f"alpha must be a number from 0 to 1 (the dense list's weight), got {alpha!r}")
    return float(alpha)


def minmax(ranked: Ranked) -> dict[int, float]:
    """{row: normalised score} of one query's list."""
    if not ranked:
        return {}
    scores = [s for _, s in ranked]
    low, high = min(scores), max(scores)
    if high == low:
        return {row: 1.0 for row, _ in ranked}
    return {row: (s - low) / (high - low) for row, s in ranked}


def weighted(dense: Ranked, sparse: Ranked, alpha: float) -> list[tuple[int, float]]:
    d, s = minmax(dense), minmax(sparse)
    fused = {row: alpha * d.get(row, 0.0) + (1.0 - alpha) * s.get(row, 0.0) for row in {*d, *s}}
    return _ordered(fused)


def rrf(dense: Ranked, sparse: Ranked, k: int = RRF_K) -> list[tuple[int, float]]:
    fused: dict[int, float] = {}
    for ranked in (dense, sparse):
        for rank, (row, _) in enumerate(ranked, 1):
            fused[row] = fused.get(row, 0.0) + 1.0 / (k + rank)
    return _ordered(fused)


def fuse(dense: Ranked, sparse: Ranked, fusion: str, alpha: float, k: int) -> list[tuple[int, float]]:
    """The top `k` (row, fused score) of a query, best first."""
    if fusion == "weighted":
        return weighted(dense, sparse, alpha)[:k]
    if fusion == "rrf":
        return rrf(dense, sparse)[:k]
    raise BertforgeError(f"unknown fusion {fusion!r} (expected {', '.join(FUSIONS)})")


def _ordered(fused: dict[int, float]) -> list[tuple[int, float]]:
    return sorted(fused.items(), key=lambda item: (-item[1], item[0]))
