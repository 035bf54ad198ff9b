"""Evaluation of sentence embeddings: STS correlation and retrieval (Recall@k, MRR@10)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import pearsonr, spearmanr

from bertforge.embedding.data import Dataset
from bertforge.errors import BertforgeError


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two [N, D] arrays."""
    a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return (a * b).sum(axis=1)


def sts_metrics(emb1: np.ndarray, emb2: np.ndarray, gold: Sequence[float]) -> dict[str, float]:
    """Spearman and Pearson correlation between cos(emb1_i, emb2_i) and the gold scores."""
    gold = np.asarray(gold, dtype=np.float64)
    if len(gold) < 2:
        raise BertforgeError("STS evaluation needs at least two scored pairs")
    sims = cosine_rows(emb1, emb2).astype(np.float64)
    return {"spearman": float(spearmanr(sims, gold).statistic), "pearson": float(pearsonr(sims, gold).statistic),
            "n": int(len(gold))}


def evaluate_sts(model, dataset: Dataset, batch_size: int = 32, precision: str = "fp32",
                 progress: bool = False) -> dict[str, float]:
    """Encode both columns of a scored-pair dataset with `model` and correlate cosine with the gold scores."""
    if dataset.kind != "scored":
        raise BertforgeError(f"STS evaluation needs scored pairs, the file holds {dataset.kind} examples")
    first = [ex.texts[0] for ex in dataset.examples]
    second = [ex.texts[1] for ex in dataset.examples]
    emb = model.encode(first + second, batch_size=batch_size, precision=precision, progress=progress)
    return sts_metrics(emb[:len(first)], emb[len(first):], [ex.label for ex in dataset.examples])


def retrieval_metrics(ranked: np.ndarray, relevant: Sequence[set[int]],
                      ks: Sequence[int] = (1, 5, 10, 100)) -> dict[str, float]:
    """Recall@k (fraction of a query's relevant items in its top k, averaged) and MRR@10 from ranked ids [Q, K]."""
    if len(ranked) != len(relevant):
        raise BertforgeError(f"{len(ranked)} ranked lists for {len(relevant)} queries")
    out: dict[str, float] = {}
    for k in ks:
        if k > ranked.shape[1]:
            continue
        hits = [len(rel & set(row[:k].tolist())) / max(len(rel), 1) for row, rel in zip(ranked, relevant)]
        out[f"recall@{k}"] = float(np.mean(hits))
    rr = []
    for row, rel in zip(ranked, relevant):
        rank = next((i for i, pid in enumerate(row[:10].tolist()) if pid in rel), None)
        rr.append(0.0 if rank is None else 1.0 / (rank + 1))
    out["mrr@10"] = float(np.mean(rr))
    out["queries"] = len(relevant)
    return out


def top_k(queries: np.ndarray, docs: np.ndarray, k: int, block: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k by inner product (cosine for unit vectors), blockwise to bound memory: (ids, scores)."""
    k = min(k, len(docs))
    ids = np.zeros((len(queries), k), dtype=np.int64)
    scores = np.zeros((len(queries), k), dtype=np.float32)
    for s in range(0, len(queries), block):
        sim = queries[s:s + block] @ docs.T
        part = np.argpartition(-sim, k - 1, axis=1)[:, :k]
        part_scores = np.take_along_axis(sim, part, axis=1)
        order = np.argsort(-part_scores, axis=1, kind="stable")
        ids[s:s + block] = np.take_along_axis(part, order, axis=1)
        scores[s:s + block] = np.take_along_axis(part_scores, order, axis=1)
    return ids, scores


def evaluate_retrieval(model, queries: Sequence[str], passages: Sequence[str], relevant: Sequence[set[int]],
                       ks: Sequence[int] = (1, 5, 10, 100), batch_size: int = 32, precision: str = "fp32",
                       progress: bool = False) -> dict[str, Any]:
    """Encode queries and passages (L2-normalised), rank passages by cosine, and score the ranking."""
    q = model.encode(list(queries), batch_size=batch_size, precision=precision, normalize=True, progress=progress)
    p = model.encode(list(passages), batch_size=batch_size, precision=precision, normalize=True, progress=progress)
    ranked, _ = top_k(q, p, max(max(ks), 10))
    out = retrieval_metrics(ranked, relevant, ks)
    out["passages"] = len(passages)
    return out
