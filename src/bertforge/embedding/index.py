"""A FAISS vector index on disk, tied to the model that made its vectors.

Layout of an index directory:
  meta.json       kind, dim, count, model path, pooling, the model fingerprint, the generation G, and the sha256
                  of the generation's two files:
  index.G.faiss   the FAISS index (row r = r-th document), inner product on L2-normalised vectors (= cosine); IVF-PQ
                  uses L2 on them (meta.json "metric": "l2"), which ranks the same, and reports 1 - d / 2
  docs.G.jsonl    {"id", "text"} per row, in row order

A save is one commit: generation G+1's files are written under their own names beside G's (never over a file
meta.json names), then meta.json naming G+1 is renamed into place (the commit: one pointer), then the files of every
other generation are removed. load() follows meta.json. So any number of kills at any moment leaves the last
committed index: before the commit meta.json names G, whose files nothing has touched; after it, G+1, complete.
What an interrupted save left is removed by the next save. A bit flip is an error, not wrong answers. An index
written by an older version (index.faiss, docs.jsonl, maybe a pending *.next) still loads; its next save rewrites it
in this layout.
The fingerprint (sha256 of the encoder weights + pooling/head config, see `SentenceEncoder.fingerprint`) is checked
on every add and query, so an index never mixes vectors of two models.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.embedding.modules import SentenceEncoder
from bertforge.errors import BertforgeError
from bertforge.io.manifest import sha256_file
from bertforge.io.read import read_json
from bertforge.io import generations
from bertforge.io.rundir import is_locked

INDEX_TYPES = ("flat", "hnsw", "ivf", "ivf-pq")
CHECKED_FILES = ("index.faiss", "docs.jsonl")  # the names of an older version's layout (one generation, no number)
NEXT = ".next"  # the older layout's suffix of a committed file not yet renamed
# every name a generation, an older layout or an interrupted save leaves (temporaries aside)
_INDEX_FILE = re.compile(r"^(?:index\.(\d+)\.faiss|docs\.(\d+)\.jsonl|index\.faiss(?:\.next)?|docs\.jsonl(?:\.next)?)$")
HNSW_M, HNSW_EF_CONSTRUCTION, HNSW_EF_SEARCH = 32, 200, 128
PQ_BITS = 8  # 256 centroids per sub-quantiser: one byte of code each
PQ_MIN_DIMS = 4  # dimensions per sub-quantiser, at least (4: recall@10 >= 0.8 of flat on MiniLM vectors)


def _faiss():
    try:
        import faiss
    except ImportError:
        raise BertforgeError("faiss is not installed: pip install 'bertforge[embed]' (or faiss-cpu)") from None
    return faiss


def require_faiss() -> None:
    """Fail at once, before a model is loaded or a corpus embedded, when faiss is missing."""
    _faiss()


def ivf_lists(n: int) -> int:
    """IVF list count: about 4 sqrt(n), but at least 39 training points per list (FAISS's k-means minimum)."""
    return max(1, min(int(4 * math.sqrt(n)), n // 39))


def pq_subquantisers(dim: int) -> int:
    """IVF-PQ's sub-quantiser count m: the most that divide `dim` with at least PQ_MIN_DIMS dimensions each (dim 384:
    96, so 96 bytes a vector instead of 1536)."""
    return max([m for m in range(1, dim // PQ_MIN_DIMS + 1) if dim % m == 0] or [1])


def make_index(kind: str, dim: int, train: np.ndarray | None = None, count: int | None = None):
    """An empty (trained, for IVF) inner-product index of the given kind. IVF kinds are trained on `train`; their
    list count is sized for `count` vectors (default: as many as `train` holds)."""
    faiss = _faiss()
    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        index.hnsw.efSearch = HNSW_EF_SEARCH
        return index
    if kind in ("ivf", "ivf-pq"):
        if train is None or len(train) == 0:
            raise BertforgeError(f"an {kind.upper()} index is trained on a sample of its vectors: build it from a "
                                 "non-empty corpus")
        if kind == "ivf-pq" and len(train) < 2 ** PQ_BITS:
            raise BertforgeError(f"an IVF-PQ index trains {2 ** PQ_BITS} centroids per sub-quantiser: it needs at "
                                 f"least {2 ** PQ_BITS} passages (got {len(train)}); use --kind flat or ivf")
        nlist = min(ivf_lists(count or len(train)), ivf_lists(len(train)))
        if kind == "ivf":
            index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        else:
            # L2 on unit vectors ranks as cosine (|x - q|^2 = 2 - 2 cos), and FAISS's residual PQ is far more
            # accurate under L2 (recall@10 against flat 0.55 vs 0.27 on clustered unit vectors, dim 64, m 16):
            # searches report 1 - d / 2, the cosine (see `search_vectors`)
            index = faiss.IndexIVFPQ(faiss.IndexFlatL2(dim), dim, nlist, pq_subquantisers(dim), PQ_BITS,
                                     faiss.METRIC_L2)
        index.train(np.ascontiguousarray(train, dtype=np.float32))
        index.nprobe = default_nprobe(nlist)
        return index
    raise BertforgeError(f"unknown index kind {kind!r} (expected {', '.join(INDEX_TYPES)})")


def index_meta(kind: str, index) -> dict[str, Any]:
    """The kind's search settings that meta.json records (and `load` restores)."""
    meta: dict[str, Any] = {}
    if kind in ("ivf", "ivf-pq"):
        meta["nlist"], meta["nprobe"] = int(index.nlist), int(index.nprobe)
    if kind == "ivf-pq":
        meta["pq"] = {"m": int(index.pq.M), "bits": int(index.pq.nbits)}
        meta["metric"] = "l2"  # on unit vectors; scores are reported as cosines
    if kind == "hnsw":
        meta["hnsw"] = {"M": HNSW_M, "efConstruction": HNSW_EF_CONSTRUCTION, "efSearch": HNSW_EF_SEARCH}
    return meta


def default_nprobe(nlist: int) -> int:
    """Lists visited per query: a quarter of them (>= 0.95 recall@10 on our benchmark), at least 8."""
    return min(nlist, max(8, nlist // 4))


@dataclass(slots=True)
class Hit:
    """One search result, of a sentence index or of a passage index (which also gives each passage's title)."""
    rank: int
    score: float  # the method's score: cosine (dense), BM25 (bm25), the fused score (hybrid)
    id: str
    text: str
    title: str | None = None  # None: the index keeps no titles (a sentence index); a passage index gives "" or one
    rerank_score: float | None = None

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"rank": self.rank, "score": round(self.score, 6), "id": self.id}
        if self.title is not None:
            d["title"] = self.title
        d["text"] = self.text
        if self.rerank_score is not None:
            d["rerank_score"] = round(self.rerank_score, 6)
        return d

    def to_dict(self) -> dict[str, Any]:  # the name the public API's result objects share
        return self.as_dict()


def recorded_model(meta: dict[str, Any], path: Path | None, model_dir: str | Path | None = None) -> SentenceEncoder:
    """The model an index folder records (or `model_dir`), with the pooling it was built with; unchecked."""
    source = model_dir or meta.get("model")
    if not source:
        raise BertforgeError(f"{path or 'the index'}: no model path recorded; pass the model")
    return SentenceEncoder.from_pretrained(source, pooling=meta.get("pooling"))


class VectorIndex:
    """An index directory loaded in memory: FAISS index + documents + metadata."""

    def __init__(self, path: Path | None, index, ids: list[str], texts: list[str], meta: dict[str, Any]):
        self.path, self.index, self.ids, self.texts, self.meta = path, index, ids, texts, meta

    def __len__(self) -> int:
        return len(self.ids)

    # ---- build / load / save -----------------------------------------------------------------------------------
    @classmethod
    def build(cls, path: str | Path | None, model: SentenceEncoder, ids: list[str], texts: list[str],
              kind: str = "flat", batch_size: int = 32, precision: str = "fp32", progress: bool = True
              ) -> "VectorIndex":
        """Embed `texts` with `model` into a new index, saved in `path` (None: kept in memory until `save`)."""
        if kind not in INDEX_TYPES:
            raise BertforgeError(f"unknown index kind {kind!r} (expected {', '.join(INDEX_TYPES)})")
        path = Path(path) if path is not None else None
        if path is not None and (path / "meta.json").exists():
            raise BertforgeError(f"{path}: an index already exists there (use `index add`, or another --out)")
        _check_ids(ids, set())
        vectors = model.encode(texts, batch_size=batch_size, precision=precision, normalize=True, progress=progress)
        index = make_index(kind, vectors.shape[1], train=vectors)
        index.add(vectors)
        meta = {"kind": kind, "dim": int(vectors.shape[1]), "count": len(ids), "metric": "inner_product",
                "normalized": True, "fingerprint": model.fingerprint(),
                "model": str(model.source.resolve()) if model.source else None,
                "pooling": model.pooling.modes if model.pooling else None, "precision": precision}
        meta.update(index_meta(kind, index))
        out = cls(path, index, list(ids), list(texts), meta)
        if path is not None:
            out.save()
        return out

    @classmethod
    def load(cls, path: str | Path) -> "VectorIndex":
        faiss = _faiss()
        path = Path(path)
        meta_path = path / "meta.json"
        if not meta_path.is_file():
            raise BertforgeError(f"{path}: not an index directory (no meta.json)")
        for attempt in range(5):  # another process may commit a save (and remove our generation) meanwhile
            meta = _read_meta(meta_path)
            try:
                files = _committed_files(path, meta)  # checked before faiss parses a damaged file
                return cls._read(path, files, meta, faiss)
            except (BertforgeError, FileNotFoundError):
                if attempt == 4 or _read_meta(meta_path) == meta:
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def _read(cls, path: Path, files: dict[str, Path], meta: dict[str, Any], faiss) -> "VectorIndex":
        try:
            index = faiss.read_index(str(files["index.faiss"]))
        except RuntimeError as err:
            raise BertforgeError(f"{files['index.faiss']}: cannot be read ({str(err).splitlines()[0]})") from None
        ids, texts = [], []
        docs = files["docs.jsonl"]
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
            raise BertforgeError(f"{path}: {files['index.faiss'].name} has {index.ntotal} vectors, {docs.name} "
                                 f"{len(ids)} documents, meta.json says {meta['count']} (interrupted write?)")
        if meta["kind"] == "hnsw":
            index.hnsw.efSearch = meta["hnsw"]["efSearch"]
        if meta["kind"] in ("ivf", "ivf-pq"):
            index.nprobe = meta["nprobe"]
        return cls(path, index, ids, texts, meta)

    def save(self) -> None:
        """Write the next generation's files, commit by replacing meta.json, then remove the other generations'
        files (see the module docstring: any number of kills at any moment leaves the last committed index)."""
        if self.path is None:
            raise BertforgeError("this index is held in memory only: give it a folder to save to")

        def write_docs(fh) -> None:
            for i, t in zip(self.ids, self.texts):
                fh.write(doc_line(i, t))

        self.meta = commit_generation(self.path, self.meta, self.index, write_docs)

    # ---- use ---------------------------------------------------------------------------------------------------
    def check_model(self, model: SentenceEncoder) -> None:
        fp = model.fingerprint()
        if fp != self.meta["fingerprint"]:
            raise BertforgeError(
                f"{self.path or 'the index'}: built with model fingerprint {self.meta['fingerprint'][:12]} "
                f"({self.meta.get('model')}), but {model.source or 'the given model'} has {fp[:12]}: "
                "an index never mixes models (rebuild it, or pass the model it was built with)")

    def load_model(self, model_dir: str | Path | None = None) -> SentenceEncoder:
        """The index's model (its recorded path, or `model_dir`) with the recorded pooling; fingerprint-checked."""
        model = recorded_model(self.meta, self.path, model_dir)
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
        if self.path is not None:
            self.save()
        return len(ids)

    def search(self, model: SentenceEncoder, queries: list[str], k: int = 10) -> list[list[Hit]]:
        self.check_model(model)
        q = model.encode(queries, precision=self.meta.get("precision", "fp32"), normalize=True, progress=False)
        return self.search_vectors(q, k)

    def search_vectors(self, q: np.ndarray, k: int = 10) -> list[list[Hit]]:
        scores, rows = self.index.search(np.ascontiguousarray(q, dtype=np.float32), min(k, len(self)))
        if self.meta.get("metric") == "l2":  # squared distances between unit vectors: the cosine is 1 - d / 2
            scores = 1.0 - scores / 2.0
        return [[Hit(r + 1, float(s), self.ids[i], self.texts[i]) for r, (s, i) in enumerate(zip(srow, irow)) if i >= 0]
                for srow, irow in zip(scores, rows)]


def doc_line(pid: str, text: str) -> bytes:
    """One row of docs.G.jsonl."""
    return (json.dumps({"id": pid, "text": text}, ensure_ascii=False) + "\n").encode("utf-8")


def commit_generation(path: Path, meta: dict[str, Any], index, write_docs) -> dict[str, Any]:
    """Save one generation after `meta`'s (io.generations.commit): the FAISS `index`, then docs.jsonl, whose rows
    `write_docs(fh)` writes to a binary file (streamed, so a corpus is never held twice). Returns the committed
    meta."""
    faiss = _faiss()
    generation = _generation(meta) + 1
    names = _names(generation)
    count = [0]

    class _Hashing:  # the docs' sha256 and rows as they are written (no second read of a large file)
        def __init__(self, fh):
            self.fh, self.h = fh, hashlib.sha256()

        def write(self, data: bytes) -> None:
            self.fh.write(data)
            self.h.update(data)
            count[0] += data.count(b"\n")

    def docs(tmp: str) -> str:
        with open(tmp, "wb") as fh:
            hashing = _Hashing(fh)
            write_docs(hashing)
        return hashing.h.hexdigest()

    def same_count() -> None:
        if count[0] != index.ntotal:
            raise BertforgeError(f"{path}: {index.ntotal} vectors but {count[0]} documents (nothing committed)")

    return generations.commit(path, {**meta, "count": index.ntotal, "generation": generation},
                              {names["index.faiss"]: lambda tmp: faiss.write_index(index, tmp),
                               names["docs.jsonl"]: docs}, _INDEX_FILE, check=same_count)


def _names(generation: int) -> dict[str, str]:
    return {"index.faiss": f"index.{generation}.faiss", "docs.jsonl": f"docs.{generation}.jsonl"}


def _generation(meta: dict[str, Any]) -> int:
    """The committed generation (0: an index of the older layout, whose files carry no number)."""
    return meta.get("generation", 0)


def _read_meta(meta_path: Path) -> dict[str, Any]:
    meta = read_json(meta_path)
    missing = [k for k in ("kind", "count", "fingerprint") if k not in meta]
    if missing:
        raise BertforgeError(f"{meta_path}: missing field {missing[0]!r}")
    generation = meta.get("generation", 0)
    if type(generation) is not int or generation < 0:
        raise BertforgeError(f"{meta_path}: generation must be a whole number >= 0 (got {generation!r})")
    if not isinstance(meta.get("checksums") or {}, dict):
        raise BertforgeError(f"{meta_path}: checksums must be an object")
    return meta


def _committed_files(path: Path, meta: dict[str, Any]) -> dict[str, Path]:
    """{role: file} of the generation meta.json commits, each checked against its recorded sha256."""
    sums = meta.get("checksums") or {}
    generation = _generation(meta)
    if generation:
        files = {}
        for role, name in _names(generation).items():
            files[role] = path / name
            if not files[role].is_file():
                raise BertforgeError(f"{files[role]}: missing (meta.json commits generation {generation}); "
                                     "rebuild with bertforge index build")
            if sha256_file(files[role]) != sums.get(name):
                raise _damaged(path, files[role])
        return files
    return {name: _committed_legacy(path, name, sums.get(name)) for name in CHECKED_FILES}


def _committed_legacy(path: Path, name: str, want: str | None) -> Path:
    """An older version's layout: `name`, or `name`.next between its commit and its rename."""
    if want is None:  # an index from before checksums
        return path / name
    for candidate in (path / name, path / (name + NEXT), path / name):  # the rename may happen meanwhile
        if candidate.is_file() and sha256_file(candidate) == want:
            return candidate
    raise _damaged(path, path / name)


def _damaged(path: Path, file: Path) -> BertforgeError:
    if is_locked(path):
        return BertforgeError(f"{path}: another bertforge run is writing this index (index add); "
                              "try again when it has finished")
    return BertforgeError(f"{file}: checksum mismatch, the file is damaged; rebuild with bertforge index build")


def _check_ids(ids: list[str], existing: set[str]) -> None:
    seen = set(existing)
    for i in ids:
        if i in seen:
            raise BertforgeError(f"document id {i!r} is already in the index (ids must be unique)")
        seen.add(i)
