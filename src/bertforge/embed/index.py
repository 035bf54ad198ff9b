"""A FAISS vector index on disk, tied to the model that made its vectors.

Layout of an index directory:
  index.faiss   the FAISS index (row r = r-th document), inner product on L2-normalised vectors (= cosine)
  docs.jsonl    {"id", "text"} per row, in row order
  meta.json     kind, dim, count, model path, pooling, the model fingerprint, and the sha256 of the two files above

meta.json is written last, so it only ever describes complete files; load() verifies the checksums (a bit flip in
index.faiss is an error, not wrong answers). Indexes written before checksums were recorded still load.
The fingerprint (sha256 of the encoder weights + pooling/head config, see `SentenceEncoder.fingerprint`) is checked
on every add and query, so an index never mixes vectors of two models.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.embed.modules import SentenceEncoder
from bertforge.errors import BertforgeError
from bertforge.io.write import atomic_write, atomic_write_text
from bertforge.io.rundir import is_locked

INDEX_TYPES = ("flat", "hnsw", "ivf")
CHECKED_FILES = ("index.faiss", "docs.jsonl")
HNSW_M, HNSW_EF_CONSTRUCTION, HNSW_EF_SEARCH = 32, 200, 128


def _faiss():
    try:
        import faiss
    except ImportError:
        raise BertforgeError("faiss is not installed: pip install 'bertforge[embed]' (or faiss-cpu)") from None
    return faiss


def require_faiss() -> None:
    """Fail at once, before a model is loaded or a corpus embedded, when faiss is missing."""
    _faiss()


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def ivf_lists(n: int) -> int:
    """IVF list count: about 4 sqrt(n), but at least 39 training points per list (FAISS's k-means minimum)."""
    return max(1, min(int(4 * math.sqrt(n)), n // 39))


def make_index(kind: str, dim: int, train: np.ndarray | None = None):
    """An empty (trained, for IVF) inner-product index of the given kind."""
    faiss = _faiss()
    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        index.hnsw.efSearch = HNSW_EF_SEARCH
        return index
    if kind == "ivf":
        if train is None or len(train) == 0:
            raise BertforgeError("an IVF index is trained on its first vectors: build it from a non-empty corpus")
        nlist = ivf_lists(len(train))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(np.ascontiguousarray(train, dtype=np.float32))
        index.nprobe = default_nprobe(nlist)
        return index
    raise BertforgeError(f"unknown index kind {kind!r} (expected {', '.join(INDEX_TYPES)})")


def default_nprobe(nlist: int) -> int:
    """Lists visited per query: a quarter of them (>= 0.95 recall@10 on our benchmark), at least 8."""
    return min(nlist, max(8, nlist // 4))


@dataclass
class Hit:
    rank: int
    score: float
    id: str
    text: str
    rerank_score: float | None = None

    def as_dict(self) -> dict[str, Any]:
        d = {"rank": self.rank, "score": round(self.score, 6), "id": self.id, "text": self.text}
        if self.rerank_score is not None:
            d["rerank_score"] = round(self.rerank_score, 6)
        return d


class VectorIndex:
    """An index directory loaded in memory: FAISS index + documents + metadata."""

    def __init__(self, path: Path, index, ids: list[str], texts: list[str], meta: dict[str, Any]):
        self.path, self.index, self.ids, self.texts, self.meta = path, index, ids, texts, meta

    def __len__(self) -> int:
        return len(self.ids)

    # ---- build / load / save -----------------------------------------------------------------------------------
    @classmethod
    def build(cls, path: str | Path, model: SentenceEncoder, ids: list[str], texts: list[str], kind: str = "flat",
              batch_size: int = 32, precision: str = "fp32", progress: bool = True) -> "VectorIndex":
        if kind not in INDEX_TYPES:
            raise BertforgeError(f"unknown index kind {kind!r} (expected {', '.join(INDEX_TYPES)})")
        path = Path(path)
        if (path / "meta.json").exists():
            raise BertforgeError(f"{path}: an index already exists there (use `index add`, or another --out)")
        _check_ids(ids, set())
        vectors = model.encode(texts, batch_size=batch_size, precision=precision, normalize=True, progress=progress)
        index = make_index(kind, vectors.shape[1], train=vectors)
        index.add(vectors)
        meta = {"kind": kind, "dim": int(vectors.shape[1]), "count": len(ids), "metric": "inner_product",
                "normalized": True, "fingerprint": model.fingerprint(),
                "model": str(model.source.resolve()) if model.source else None,
                "pooling": model.pooling.modes if model.pooling else None, "precision": precision}
        if kind == "ivf":
            meta["nlist"], meta["nprobe"] = int(index.nlist), int(index.nprobe)
        if kind == "hnsw":
            meta["hnsw"] = {"M": HNSW_M, "efConstruction": HNSW_EF_CONSTRUCTION, "efSearch": HNSW_EF_SEARCH}
        out = cls(path, index, list(ids), list(texts), meta)
        out.save()
        return out

    @classmethod
    def load(cls, path: str | Path) -> "VectorIndex":
        faiss = _faiss()
        path = Path(path)
        meta_path = path / "meta.json"
        if not meta_path.is_file():
            raise BertforgeError(f"{path}: not an index directory (no meta.json)")
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise BertforgeError(f"{meta_path}: not valid JSON ({err})") from None
        missing = [k for k in ("kind", "count", "fingerprint") if k not in meta]
        if missing:
            raise BertforgeError(f"{meta_path}: missing field {missing[0]!r}")
        for name, want in (meta.get("checksums") or {}).items():  # before faiss parses a damaged file
            if name in CHECKED_FILES and (path / name).is_file() and sha256_file(path / name) != want:
                if is_locked(path):  # files are replaced one by one; meta.json comes last
                    raise BertforgeError(f"{path}: another bertforge run is writing this index (index add); "
                                         "try again when it has finished")
                raise BertforgeError(f"{path / name}: checksum mismatch, the file is damaged; rebuild with "
                                     "bertforge index build")
        try:
            index = faiss.read_index(str(path / "index.faiss"))
        except RuntimeError as err:
            raise BertforgeError(f"{path / 'index.faiss'}: cannot be read ({str(err).splitlines()[0]})") from None
        ids, texts = [], []
        docs = path / "docs.jsonl"
        if not docs.is_file():
            raise BertforgeError(f"{docs}: missing (an index keeps its texts beside the vectors)")
        with open(docs, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                try:
                    rec = json.loads(line)
                    ids.append(rec["id"])
                    texts.append(rec["text"])
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise BertforgeError(f"{docs}:{n}: expected a JSON object with id and text") from None
        if not (index.ntotal == len(ids) == meta["count"]):
            raise BertforgeError(f"{path}: index.faiss has {index.ntotal} vectors, docs.jsonl {len(ids)} documents, "
                                 f"meta.json says {meta['count']} (interrupted write?)")
        if meta["kind"] == "hnsw":
            index.hnsw.efSearch = meta["hnsw"]["efSearch"]
        if meta["kind"] == "ivf":
            index.nprobe = meta["nprobe"]
        return cls(path, index, ids, texts, meta)

    def save(self) -> None:
        """Write index, documents, then metadata (each atomically; meta.json last, so it only ever describes
        complete files)."""
        faiss = _faiss()
        checksums = {}

        def write_index(tmp: str) -> None:
            faiss.write_index(self.index, tmp)
            checksums["index.faiss"] = sha256_file(tmp)  # of the bytes that are renamed into place

        atomic_write(self.path / "index.faiss", write_index)
        docs = "".join(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n" for i, t in zip(self.ids, self.texts))
        atomic_write_text(self.path / "docs.jsonl", docs)
        checksums["docs.jsonl"] = hashlib.sha256(docs.encode("utf-8")).hexdigest()
        self.meta["count"] = len(self.ids)
        self.meta["checksums"] = checksums
        atomic_write_text(self.path / "meta.json", json.dumps(self.meta, indent=2) + "\n")

    # ---- use ---------------------------------------------------------------------------------------------------
    def check_model(self, model: SentenceEncoder) -> None:
        fp = model.fingerprint()
        if fp != self.meta["fingerprint"]:
            raise BertforgeError(
                f"{self.path}: built with model fingerprint {self.meta['fingerprint'][:12]} "
                f"({self.meta.get('model')}), but {model.source or 'the given model'} has {fp[:12]}: "
                "an index never mixes models (rebuild it, or pass the model it was built with)")

    def load_model(self, model_dir: str | Path | None = None) -> SentenceEncoder:
        """The index's model (its recorded path, or `model_dir`) with the recorded pooling; fingerprint-checked."""
        source = model_dir or self.meta.get("model")
        if not source:
            raise BertforgeError(f"{self.path}: no model path recorded; pass --model")
        model = SentenceEncoder.from_pretrained(source, pooling=self.meta.get("pooling"))
        self.check_model(model)
        return model

    def add(self, model: SentenceEncoder, ids: list[str], texts: list[str], batch_size: int = 32,
            progress: bool = True) -> int:
        self.check_model(model)
        _check_ids(ids, set(self.ids))
        vectors = model.encode(texts, batch_size=batch_size, precision=self.meta.get("precision", "fp32"),
                               normalize=True, progress=progress)
        self.index.add(vectors)
        self.ids.extend(ids)
        self.texts.extend(texts)
        self.save()
        return len(ids)

    def search(self, model: SentenceEncoder, queries: list[str], k: int = 10) -> list[list[Hit]]:
        self.check_model(model)
        q = model.encode(queries, precision=self.meta.get("precision", "fp32"), normalize=True, progress=False)
        return self.search_vectors(q, k)

    def search_vectors(self, q: np.ndarray, k: int = 10) -> list[list[Hit]]:
        scores, rows = self.index.search(np.ascontiguousarray(q, dtype=np.float32), min(k, len(self)))
        return [[Hit(r + 1, float(s), self.ids[i], self.texts[i]) for r, (s, i) in enumerate(zip(srow, irow)) if i >= 0]
                for srow, irow in zip(scores, rows)]


def rerank(hits: list[Hit], query: str, cross_encoder, batch_size: int = 32) -> list[Hit]:
    """Re-order a bi-encoder's hits by cross-encoder score (ranks renumbered; the bi-encoder score kept)."""
    if not hits:
        return hits
    scores = cross_encoder.predict([query] * len(hits), [h.text for h in hits], batch_size=batch_size)
    order = np.argsort(-np.asarray(scores), kind="stable")
    return [Hit(r + 1, hits[i].score, hits[i].id, hits[i].text, float(scores[i])) for r, i in enumerate(order)]


def _check_ids(ids: list[str], existing: set[str]) -> None:
    seen = set(existing)
    for i in ids:
        if i in seen:
            raise BertforgeError(f"document id {i!r} is already in the index (ids must be unique)")
        seen.add(i)
