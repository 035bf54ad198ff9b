"""Merging embedding shards (`retrieval.shards`) into one index folder, the layout `embedding.index.VectorIndex` reads.

The shard set is checked first (every shard 0..N-1 committed, all of one model, width, pooling, precision, dtype,
chunk size and corpus, and of the same N): a shard missing or different is one line naming its folder. Then the
vectors stream into the FAISS index in corpus order (row r of the corpus is row r // N of shard r mod N), a block of
rows of every shard at a time, read through memory maps, while the documents stream into docs.G.jsonl: texts are
never held in memory, vectors only once (in the index itself for flat and HNSW; IVF-PQ's codes are a few bytes a
vector, so it stays far below). IVF and IVF-PQ are trained first on an evenly spaced sample of the rows
(`TRAIN_SAMPLE`). The folder is committed like `VectorIndex.save` (meta.json is the commit).
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.embedding.index import INDEX_TYPES, commit_generation, index_meta, ivf_lists, make_index, require_faiss
from bertforge.errors import BertforgeError
from bertforge.io.read import read_json
from bertforge.retrieval.shards import found_shards, shard_dir

BLOCK_ROWS = 1024  # rows of each shard per merge step: the fixed memory beyond the index
TRAIN_SAMPLE = 1 << 16  # IVF / IVF-PQ training rows, at least (or 40 per list, when more lists need more)
# the fields every shard of one set shares
_SAME = ("num_shards", "fingerprint", "dim", "pooling", "precision", "dtype", "chunk_size", "corpus")


def check_shards(out: str | Path, num_shards: int | None = None, fingerprint: str | None = None
                 ) -> list[dict[str, Any]]:
    """The committed shard.json of every shard 0..N-1 under `out`, checked to be one set (N: `num_shards`, else
    the one N the folders share); `fingerprint`: the model the merge is asked for."""
    found = found_shards(out)
    if num_shards is None:
        sizes = sorted({n for _, n, _ in found})
        if not sizes:
            raise BertforgeError(f"{Path(out) / 'shards'}: no shards to merge (build them with num_shards / "
                                 "--num-shards first)")
        if len(sizes) > 1:
            raise BertforgeError(f"{Path(out) / 'shards'}: shards of several shard counts ({', '.join(map(str, sizes))}"
                                 "); pass the one to merge (num_shards / --num-shards)")
        num_shards = sizes[0]
    other = next((d for _, n, d in found if n != num_shards), None)
    if other is not None:
        raise BertforgeError(f"{other}: a shard of another shard count than {num_shards}; remove it or merge with "
                             "its own count")
    shards = []
    for i in range(num_shards):
        folder = shard_dir(out, i, num_shards)
        if not (folder / "shard.json").is_file():
            state = "unfinished (no shard.json)" if folder.is_dir() else "missing"
            raise BertforgeError(f"{folder}: shard {i} of {num_shards} is {state}; build it (shard_id / --shard-id "
                                 f"{i}) before merging")
        shards.append(read_json(folder / "shard.json"))
    first = shards[0]
    if fingerprint is not None and first.get("fingerprint") != fingerprint:
        raise BertforgeError(f"{shard_dir(out, 0, num_shards)}: built with model fingerprint "
                             f"{str(first.get('fingerprint'))[:12]} ({first.get('model')}), not the given model's "
                             f"{fingerprint[:12]}")
    for i, shard in enumerate(shards):
        folder = shard_dir(out, i, num_shards)
        if shard.get("shard_id") != i:
            raise BertforgeError(f"{folder / 'shard.json'}: says shard {shard.get('shard_id')}, not {i}")
        for key in _SAME:
            if shard.get(key) != first.get(key):
                what = {"fingerprint": "model", "dim": "width", "num_shards": "shard count"}.get(key, key)
                raise BertforgeError(f"{folder}: built with another {what} than shard 0 ({_short(shard.get(key))} vs "
                                     f"{_short(first.get(key))}); rebuild it")
    total = first["corpus"]["passages"]
    if sum(s["count"] for s in shards) != total:
        raise BertforgeError(f"{Path(out) / 'shards'}: the shards hold {sum(s['count'] for s in shards)} passages, "
                             f"the corpus {total}")
    return shards


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text[:12] if isinstance(value, str) and len(value) == 64 else text


def _blocks(out: Path, shards: list[dict[str, Any]], with_docs: bool, with_vectors: bool = True
            ) -> Iterator[tuple[np.ndarray, list[bytes]]]:
    """(vectors, doc lines) of the corpus in order, BLOCK_ROWS rows of every shard at a time (the vectors read
    through memory maps: a pass for the documents alone touches only their row counts)."""
    n = len(shards)
    for c in range(max(s["chunks"] for s in shards)):
        maps, docs = [], []
        for i, shard in enumerate(shards):
            folder = shard_dir(out, i, n)
            if c < shard["chunks"]:
                maps.append(np.load(folder / f"chunk-{c:06d}.npy", mmap_mode="r", allow_pickle=False))
                docs.append(open(folder / f"chunk-{c:06d}.jsonl", "rb") if with_docs else None)
            else:
                maps.append(None)
                docs.append(None)
        try:
            rows = len(maps[0])  # shard 0 holds the most rows of every chunk
            dim = maps[0].shape[1]
            for start in range(0, rows, BLOCK_ROWS):
                stop = min(rows, start + BLOCK_ROWS)
                block = np.zeros((stop - start, n, dim if with_vectors else 0), dtype=np.float32)
                present = np.zeros((stop - start, n), dtype=bool)
                for i, m in enumerate(maps):
                    rows_i = 0 if m is None else max(0, min(stop, len(m)) - start)
                    present[:rows_i, i] = True
                    if with_vectors and rows_i:
                        block[:rows_i, i] = m[start:start + rows_i]
                lines = []
                if with_docs:  # row r of each shard, in shard order: corpus order
                    lines = [docs[i].readline() for r in range(stop - start) for i in range(n) if present[r, i]]
                yield block.reshape(len(present) * n, -1)[present.reshape(-1)], lines
        finally:
            for fh in docs:
                if fh is not None:
                    fh.close()
            del maps


def _sample(out: Path, shards: list[dict[str, Any]], total: int, want: int) -> np.ndarray:
    """Every ceil(total / want)-th row of the corpus: a deterministic, evenly spread training sample."""
    stride = max(1, -(-total // want))
    picked, seen = [], 0
    for block, _ in _blocks(out, shards, with_docs=False):
        rows = np.arange(seen, seen + len(block))
        picked.append(block[rows % stride == 0])
        seen += len(block)
    return np.concatenate(picked)


def merge_shards(out: str | Path, kind: str = "flat", *, num_shards: int | None = None,
                 fingerprint: str | None = None, overwrite: bool = False, progress: bool = True) -> dict[str, Any]:
    """Merge the shards under `out` into the index folder `out` (see the module docstring); the committed meta."""
    from tqdm.auto import tqdm

    if kind not in INDEX_TYPES:
        raise BertforgeError(f"unknown index kind {kind!r} (expected {', '.join(INDEX_TYPES)})")
    require_faiss()
    out = Path(out)
    previous: dict[str, Any] = {}
    if (out / "meta.json").is_file():
        if not overwrite:
            raise BertforgeError(f"{out}: an index already exists there (pass --overwrite to replace it with the "
                                 "merged shards)")
        previous = read_json(out / "meta.json")
    shards = check_shards(out, num_shards, fingerprint)
    first = shards[0]
    total, dim = first["corpus"]["passages"], first["dim"]
    if kind in ("ivf", "ivf-pq"):
        train = _sample(out, shards, total, max(TRAIN_SAMPLE, 40 * ivf_lists(total)))
        index = make_index(kind, dim, train=train, count=total)
        del train
    else:
        index = make_index(kind, dim)
    bar = tqdm(total=total, unit="passage", desc=f"merge {kind}", disable=not progress, leave=False)
    for block, _ in _blocks(out, shards, with_docs=False):
        index.add(block)
        bar.update(len(block))
    bar.close()
    if index.ntotal != total:
        raise BertforgeError(f"{out}: merged {index.ntotal} vectors, the shards say {total}")

    def write_docs(fh) -> None:  # the documents in the same order, straight from the shards' files
        for _, lines in _blocks(out, shards, with_docs=True, with_vectors=False):
            for line in lines:
                fh.write(line)

    meta = {"kind": kind, "dim": dim, "count": total, "metric": "inner_product", "normalized": True,
            "fingerprint": first["fingerprint"], "model": first["model"], "pooling": first["pooling"],
            "precision": first["precision"], "generation": previous.get("generation", 0), **index_meta(kind, index),
            "shards": {"num_shards": first["num_shards"], "dtype": first["dtype"], "corpus": first["corpus"]}}
    return commit_generation(out, meta, index, write_docs)
