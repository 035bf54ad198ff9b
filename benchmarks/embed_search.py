"""Approximate vs exact search: recall@10 of HNSW and IVF against exact inner product, and query latency.

Vectors: N unit vectors of dimension 384 drawn around a few hundred random centres (clustered, like real sentence
embeddings, unlike uniform noise on which every ANN method degrades), queries drawn the same way. Writes
benchmarks/results/embed_search.json.

    python benchmarks/embed_search.py [--n 100000] [--queries 1000] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bertforge.embedding.index import default_nprobe, ivf_lists, make_index

ROOT = Path(__file__).resolve().parent.parent


def clustered(n: int, dim: int, centres: np.ndarray, rng: np.random.Generator, spread: float = 0.6) -> np.ndarray:
    x = centres[rng.integers(0, len(centres), n)] + spread * rng.normal(size=(n, dim)) / np.sqrt(dim)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth)]))


def main() -> None:
    import faiss

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/embed_search.json"))
    args = ap.parse_args()
    faiss.omp_set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(500, args.dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    docs = clustered(args.n, args.dim, centres, rng)
    queries = clustered(args.queries, args.dim, centres, rng)
    k = 10

    rows = []
    truth = None
    for kind in ("flat", "hnsw", "ivf"):
        t = time.perf_counter()
        index = make_index(kind, args.dim, train=docs)
        index.add(docs)
        build_s = time.perf_counter() - t
        settings = [None]
        if kind == "ivf":
            settings = sorted({default_nprobe(index.nlist), 8, 16, 64})
        for setting in settings:
            if setting is not None:
                index.nprobe = setting
            index.search(queries[:10], k)  # warm-up
            t = time.perf_counter()
            _, found = index.search(queries, k)
            batch_s = time.perf_counter() - t
            t = time.perf_counter()
            for q in queries[:200]:  # one query at a time: the interactive latency
                index.search(q[None], k)
            single_ms = (time.perf_counter() - t) / 200 * 1000
            if truth is None:
                truth = found
            row = {"kind": kind, "build_s": round(build_s, 2), "recall@10": recall_at_k(found, truth),
                   "latency_ms_single": round(single_ms, 3), "qps_batched": round(len(queries) / batch_s)}
            if kind == "ivf":
                row.update(nlist=int(index.nlist), nprobe=int(setting), default=setting == default_nprobe(index.nlist))
            rows.append(row)
    result = {"n": args.n, "dim": args.dim, "queries": args.queries, "threads": args.threads,
              "ivf_nlist": ivf_lists(args.n), "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"{args.n} clustered unit vectors, dim {args.dim}, {args.queries} queries, {args.threads} threads")
    print(f"{'kind':6} {'setting':>12} {'recall@10':>9} {'ms/query':>9} {'batched q/s':>11} {'build s':>8}")
    for r in rows:
        setting = f"nprobe {r['nprobe']}" if "nprobe" in r else ("M 32 ef 128" if r["kind"] == "hnsw" else "exact")
        print(f"{r['kind']:6} {setting:>12} {r['recall@10']:9.4f} {r['latency_ms_single']:9.3f} "
              f"{r['qps_batched']:11d} {r['build_s']:8.1f}")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
