"""One index of passages, whatever the retrieval method, in one folder format (retrieval/store.py):

- dense: the passages embedded by a sentence encoder in a FAISS index (embedding.index: flat, hnsw, ivf), cosine;
- bm25: BM25 over their words (retrieval/sparse.py, on bm25s); no model;
- hybrid: both, each query's two candidate lists fused (retrieval/fusion.py: weighted min-max or RRF).

A passage is embedded and BM25-tokenised as `passages.with_title(title, text)`. Every add and search of a dense
or hybrid index checks the model (its embedding width, then its fingerprint) against the one that built it.

A two-tower retriever (a DPR-trained folder: question/ and passage/) is indexed with its passage tower and searched
with its question tower, by raw dot product as it was trained (unnormalised vectors; flat or hnsw): meta.json's
"retriever" records the folder and the question tower's fingerprint, which every search checks.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.embedding.index import Hit, VectorIndex, index_meta, make_index, recorded_model, require_faiss
from bertforge.embedding.modules import SentenceEncoder
from bertforge.errors import BertforgeError
from bertforge.io.read import jsonl_rows, read_json
from bertforge.retrieval import fusion as fusions
from bertforge.retrieval import store
from bertforge.retrieval.passages import Passages, with_title
from bertforge.retrieval.sparse import BM25Index, BM25Settings, bm25s_module


def require_method(method: str) -> None:
    """The libraries `method` needs, each one line naming its extra when missing (before any reading)."""
    store.check_method(method)
    if method != "bm25":
        require_faiss()
    if method != "dense":
        bm25s_module()


class RetrievalIndex:
    """An index folder in memory: its passages, the dense part (a VectorIndex held in memory, saved by this class),
    the BM25 part, and meta.json's fields."""

    def __init__(self, path: Path | None, meta: dict[str, Any], passages: Passages,
                 vectors: VectorIndex | None = None, bm25: BM25Index | None = None):
        self.path, self.meta, self.passages, self.vectors, self.bm25 = path, meta, passages, vectors, bm25

    @property
    def method(self) -> str:
        return store.method_of(self.meta)

    @property
    def needs_model(self) -> bool:
        return self.method != "bm25"

    def __len__(self) -> int:
        return len(self.passages)

    # ---- build / load / save -----------------------------------------------------------------------------------
    @classmethod
    def build(cls, path: str | Path | None, passages: Passages, *, method: str = "dense",
              model: SentenceEncoder | None = None, kind: str | None = None, stopwords: str = "en",
              fusion: str | None = None, alpha: float | None = None, batch_size: int = 32, precision: str = "fp32",
              progress: bool = True, question: SentenceEncoder | None = None,
              retriever: str | Path | None = None) -> "RetrievalIndex":
        """Index `passages` by `method` into a new index, saved in `path` (None: in memory until `save`).
        `question`: the question tower of a two-tower retriever whose passage tower is `model` (folder
        `retriever`): the index is searched with it by dot product."""
        settings = check_options(method, model, kind, fusion, alpha)
        path = Path(path) if path is not None else None
        if path is not None and (path / "meta.json").exists():
            raise BertforgeError(f"{path}: an index already exists there (use `index add`, or another --out)")
        meta: dict[str, Any] = {"method": method, "count": len(passages)}
        vectors = bm25 = None
        texts = [with_title(h, t) for h, t in zip(passages.titles, passages.texts)]
        if method != "bm25" and question is not None:
            vectors = _dot_vectors(model, passages.ids, texts, kind or "flat", batch_size, precision, progress)
        elif method != "bm25":
            vectors = VectorIndex.build(None, model, passages.ids, texts, kind=kind or "flat", batch_size=batch_size,
                                        precision=precision, progress=progress)
        if vectors is not None:
            vectors.ids, vectors.texts = passages.ids, passages.texts  # one copy of the corpus in memory
            meta = {"method": method, **vectors.meta}
        if vectors is not None and question is not None:
            meta["retriever"] = {"path": str(Path(retriever).resolve()) if retriever is not None else None,
                                 "question": str(question.source.resolve()) if question.source else None,
                                 "question_fingerprint": question.fingerprint(), "similarity": "dot"}
        if method != "dense":
            bm25 = BM25Index.build(texts, BM25Settings(stopwords=stopwords), progress=progress)
            meta["bm25"] = bm25.settings.to_dict()
        if method == "hybrid":
            meta["fusion"] = settings
        out = cls(path, meta, passages, vectors, bm25)
        if path is not None:
            out.save()
        return out

    @classmethod
    def load(cls, path: str | Path) -> "RetrievalIndex":
        path = Path(path)
        meta_path = path / "meta.json"
        if not meta_path.is_file():
            raise BertforgeError(f"{path}: not an index directory (no meta.json)")
        if "method" not in read_json(meta_path):  # written by embedding.index alone: a dense index, without titles
            vectors = VectorIndex.load(path)
            passages = Passages(vectors.ids, [""] * len(vectors.ids), vectors.texts)
            return cls(path, {"method": "dense", **vectors.meta}, passages, vectors)
        return store.load(path, lambda files, meta: cls._read(path, files, meta))

    @classmethod
    def _read(cls, path: Path, files: dict[str, Path], meta: dict[str, Any]) -> "RetrievalIndex":
        method = store.method_of(meta)
        require_method(method)
        passages = _read_docs(files["docs.jsonl"])
        if len(passages) != meta["count"]:
            raise BertforgeError(f"{path}: {files['docs.jsonl'].name} has {len(passages)} passages, meta.json says "
                                 f"{meta['count']}")
        vectors = bm25 = None
        if method != "bm25":
            import faiss

            vectors = VectorIndex._read(path, files, meta, faiss)  # its search settings (efSearch, nprobe) too
            vectors.ids, vectors.texts = passages.ids, passages.texts
        if method != "dense":
            settings = BM25Settings.from_dict(meta["bm25"], f"{path / 'meta.json'}: bm25")
            bm25 = BM25Index.read(files["bm25.npz"], files["bm25-vocab.json"], settings, meta["count"])
        return cls(path, meta, passages, vectors, bm25)

    def save(self) -> None:
        """Commit the next generation of the folder (retrieval/store.py: a kill at any moment leaves the last
        committed index)."""
        if self.path is None:
            raise BertforgeError("this index is held in memory only: give it a folder to save to")
        p = self.passages
        writers: dict[str, Any] = {}  # in this order: the largest file first, as embedding.index writes them
        if self.vectors is not None:
            import faiss

            writers["index.faiss"] = lambda tmp: faiss.write_index(self.vectors.index, tmp)
        writers["docs.jsonl"] = store.docs_bytes(p.ids, p.titles, p.texts)
        if self.bm25 is not None:
            writers["bm25.npz"] = self.bm25.arrays_bytes()
            writers["bm25-vocab.json"] = self.bm25.vocab_bytes()
        self.meta = store.commit(self.path, {**self.meta, "count": len(p)}, writers)

    # ---- the model ---------------------------------------------------------------------------------------------
    @property
    def two_towers(self) -> bool:
        """Built by a retriever's passage tower, searched with its question tower (dot product)."""
        return "retriever" in self.meta

    def check_model(self, model: SentenceEncoder | None, question: bool = False) -> None:
        """`model` is the one that built the index (`question`: the question tower a two-tower index records)."""
        where = self.path or "the index"
        if not self.needs_model:
            if model is not None:
                raise BertforgeError(f"{where}: a bm25 index embeds nothing; leave the model out")
            return
        if model is None:
            raise BertforgeError(f"{where}: a {self.method} index needs its sentence encoder (the model)")
        built = f"{self.meta['fingerprint'][:12]} ({self.meta.get('model')})"
        if model.dim != self.meta["dim"]:
            raise BertforgeError(f"{where}: holds vectors of width {self.meta['dim']} (model {built}), but "
                                 f"{model.source or 'the given model'} embeds in {model.dim}: pass the model it was "
                                 "built with")
        fp = model.fingerprint()
        if question and self.two_towers:
            recorded = self.meta["retriever"]["question_fingerprint"]
            if fp != recorded:
                raise BertforgeError(f"{where}: searched with question tower fingerprint {recorded[:12]} "
                                     f"({self.meta['retriever'].get('path')}), but {model.source or 'the given model'} "
                                     f"has {fp[:12]}: pass the retriever folder it was built with")
            return
        if fp != self.meta["fingerprint"]:
            raise BertforgeError(f"{where}: built with model fingerprint {built}, but "
                                 f"{model.source or 'the given model'} has {fp[:12]}: an index never mixes models "
                                 "(rebuild it, or pass the model it was built with)")

    def load_model(self, model_dir: str | Path | None = None) -> SentenceEncoder | None:
        """The index's model (its recorded path, or `model_dir`) with the recorded pooling, checked; None for bm25."""
        if not self.needs_model:
            if model_dir is not None:
                raise BertforgeError(f"{self.path or 'the index'}: a bm25 index embeds nothing; leave the model out")
            return None
        model = recorded_model(self.meta, self.path, model_dir)
        self.check_model(model)  # the width too: a passage index names the model a user passes
        return model

    def load_question_model(self, retriever_dir: str | Path | None = None) -> SentenceEncoder:
        """A two-tower index's question tower (of `retriever_dir`, else the recorded one), checked."""
        from bertforge.retrieval.towers import load_retriever

        if retriever_dir is not None:
            model = load_retriever(retriever_dir)[0]
        else:
            source = self.meta["retriever"].get("question")
            if not source:
                raise BertforgeError(f"{self.path or 'the index'}: no question tower recorded; pass the retriever")
            model = SentenceEncoder.from_pretrained(source)
        self.check_model(model, question=True)
        return model

    # ---- use ---------------------------------------------------------------------------------------------------
    def add(self, model: SentenceEncoder | None, passages: Passages, batch_size: int = 32,
            progress: bool = True) -> int:
        """Index `passages` (ids new to the index) and, with a folder, save at once. BM25's statistics are
        corpus-wide, so its part is rebuilt over every passage (equal to a build of the whole corpus)."""
        self.check_model(model)
        known = set(self.passages.ids)
        for pid in passages.ids:
            if pid in known:
                raise BertforgeError(f"passage id {pid!r} is already in the index (ids must be unique)")
            known.add(pid)
        texts = [with_title(h, t) for h, t in zip(passages.titles, passages.texts)]
        if self.vectors is not None:
            vectors = model.encode(texts, batch_size=batch_size, precision=self.meta.get("precision", "fp32"),
                                   normalize=self.meta.get("normalized", True), progress=progress)
            self.vectors.index.add(vectors)
        for i in range(len(passages)):
            self.passages.append(passages[i])
        if self.bm25 is not None:
            every = [with_title(h, t) for h, t in zip(self.passages.titles, self.passages.texts)]
            self.bm25 = BM25Index.build(every, self.bm25.settings, progress=progress)
        self.meta["count"] = len(self.passages)
        if self.path is not None:
            self.save()
        return len(passages)

    def search(self, model: SentenceEncoder | None, queries: list[str], k: int = 10, *, fusion: str | None = None,
               alpha: float | None = None) -> list[list[Hit]]:
        """The top `k` passages of each query, best first (k above the corpus size: the whole corpus, with a
        warning). `fusion` / `alpha` (hybrid only): other than the recorded ones for this search."""
        if k <= 0:
            raise BertforgeError(f"k must be positive, got {k}")
        n = len(self)
        if k > n:
            warnings.warn(f"k {k} is more than the {n} passages of {self.path or 'the index'}: at most {n} hits "
                          "a query", stacklevel=2)
            k = n
        if self.method != "hybrid" and (fusion is not None or alpha is not None):
            raise BertforgeError(f"fusion and alpha apply to a hybrid index; this one is {self.method}")
        self.check_model(model, question=True)
        if self.method == "dense":
            lists = self._dense(model, queries, k)
        elif self.method == "bm25":
            lists = self._sparse(queries, k)
        else:
            recorded = self.meta["fusion"]
            how = check_options("hybrid", model, None, fusion or recorded["method"],
                                recorded["alpha"] if alpha is None else alpha)
            depth = fusions.candidate_depth(k, n)
            dense, sparse = self._dense(model, queries, depth), self._sparse(queries, depth)
            lists = [fusions.fuse(d, s, how["method"], how["alpha"], k) for d, s in zip(dense, sparse)]
        ids, titles, texts = self.passages.ids, self.passages.titles, self.passages.texts
        return [[Hit(r, s, ids[i], texts[i], title=titles[i]) for r, (i, s) in enumerate(ranked, 1)] for ranked in lists]

    def _dense(self, model: SentenceEncoder, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        q = model.encode(queries, precision=self.meta.get("precision", "fp32"),
                         normalize=self.meta.get("normalized", True), progress=False)
        scores, rows = self.vectors.index.search(np.ascontiguousarray(q, dtype=np.float32), k)
        return [[(i, s) for s, i in zip(srow, irow) if i >= 0] for srow, irow in zip(scores.tolist(), rows.tolist())]

    def _sparse(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        rows, scores = self.bm25.search(queries, k)
        # a passage sharing no term with the query scores 0: never a hit
        return [[(i, s) for i, s in zip(irow, srow) if s > 0] for irow, srow in zip(rows.tolist(), scores.tolist())]


def save_locked(index: RetrievalIndex, what: str = "--index") -> None:
    """Save `index` into its own folder under the folder's lock (`io.rundir.lock_and_record`): one writer at a
    time."""
    from bertforge.io.rundir import lock_and_record

    lock = lock_and_record(index.path, what=what)
    try:
        index.save()
    finally:
        lock.release()


def add_locked(index: RetrievalIndex, model: SentenceEncoder | None, passages: Passages, batch_size: int = 32,
               progress: bool = True, what: str = "--index") -> tuple[RetrievalIndex, int]:
    """Add `passages` to the index in a folder and save it, under the folder's lock, as one step: when another
    process committed a newer generation since `index` was read, that generation is reloaded first, so its
    passages are kept (no lost update). Returns (the index added to, the number of passages added)."""
    from bertforge.io.rundir import lock_and_record

    lock = lock_and_record(index.path, what=what)
    try:
        committed = read_json(index.path / "meta.json").get("generation", 0)
        if committed != index.meta.get("generation", 0):
            index = RetrievalIndex.load(index.path)
        return index, index.add(model, passages, batch_size=batch_size, progress=progress)
    finally:
        lock.release()


def _dot_vectors(model: SentenceEncoder, ids: list[str], texts: list[str], kind: str, batch_size: int,
                 precision: str, progress: bool) -> VectorIndex:
    """A retriever's passage vectors as it scores them: raw dot products (no normalisation), flat or hnsw."""
    if kind not in ("flat", "hnsw"):
        raise BertforgeError(f"kind: a two-tower retriever's index is searched by dot product: flat or hnsw (got "
                             f"{kind!r})")
    vectors = model.encode(texts, batch_size=batch_size, precision=precision, normalize=False, progress=progress)
    index = make_index(kind, vectors.shape[1])
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    meta = {"kind": kind, "dim": int(vectors.shape[1]), "count": len(ids), "metric": "inner_product",
            "normalized": False, "fingerprint": model.fingerprint(),
            "model": str(model.source.resolve()) if model.source else None,
            "pooling": model.pooling.modes if model.pooling else None, "precision": precision}
    meta.update(index_meta(kind, index))
    return VectorIndex(None, index, list(ids), list(texts), meta)


def check_options(method: str, model: Any, kind: str | None, fusion: str | None, alpha: float | None
                  ) -> dict[str, Any]:
    """Refuse options that do not apply to `method`; the fusion settings a hybrid index records."""
    store.check_method(method)
    if method == "bm25":
        if kind is not None:
            raise BertforgeError("kind names the dense index structure (flat, hnsw, ivf); a bm25 index has none")
        if model is not None:
            raise BertforgeError("model: a bm25 index embeds nothing; leave the model out")
    elif model is None:
        raise BertforgeError(f"model: a {method} index needs a sentence encoder to embed the passages")
    if method != "hybrid":
        if fusion is not None or alpha is not None:
            raise BertforgeError(f"fusion and alpha apply to method 'hybrid', not {method!r}")
        return {}
    fusion = fusion or "weighted"
    if fusion not in fusions.FUSIONS:
        raise BertforgeError(f"unknown fusion {fusion!r} (expected {', '.join(fusions.FUSIONS)})")
    return {"method": fusion, "alpha": fusions.check_alpha(0.5 if alpha is None else alpha),
            "rrf_k": fusions.RRF_K}


def rerank(hits: list[Hit], query: str, cross_encoder: Any, batch_size: int = 32) -> list[Hit]:
    """Re-order hits by cross-encoder score over (query, title. text) (ranks renumbered; the method's score kept): a
    1-label model's logit, a 2-label model's label-1 logit (`CrossEncoder.relevance`; other label counts refused)."""
    cross_encoder.check_relevance()
    if not hits:
        return hits
    scores = cross_encoder.relevance([query] * len(hits), [with_title(h.title or "", h.text) for h in hits],
                                     batch_size=batch_size)
    order = np.argsort(-np.asarray(scores), kind="stable")
    return [Hit(r + 1, hits[i].score, hits[i].id, hits[i].text, title=hits[i].title, rerank_score=float(scores[i]))
            for r, i in enumerate(order)]


def _read_docs(docs: Path) -> Passages:
    out = Passages()
    for n, rec in jsonl_rows(docs):
        pid, text, title = rec.get("id"), rec.get("text"), rec.get("title", "")
        if not isinstance(pid, str) or not isinstance(text, str) or not isinstance(title, str):
            raise BertforgeError(f"{docs}:{n}: expected a JSON object with id, title and text")
        out.ids.append(pid)
        out.titles.append(title)
        out.texts.append(text)
    return out
