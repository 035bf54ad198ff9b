"""`Index`: passages retrieved by a sentence encoder (method "dense": a FAISS index, exact "flat" or approximate
"hnsw" / "ivf", searched by cosine), by BM25 ("bm25", on bm25s: no model), or by both fused ("hybrid": weighted
min-max or reciprocal-rank fusion); kept in a folder (`bertforge index build / add / query` read and write the same
folders) or in memory until saved.

    index = bertforge.Index.build("sentence-transformers/all-MiniLM-L6-v2", passages, "runs/index")
    index.search("who wrote the novel?", k=5)       # [Hit(rank=1, score=0.71, id=..., title=..., text=...), ...]
    index.add(more_passages)                        # saved at once: the folder's next generation
    index = bertforge.Index.load("runs/index")      # the model recorded in it, fingerprint-checked
    sparse = bertforge.Index.build(None, passages, "runs/bm25", method="bm25")

An index never mixes models: every add and search checks the model's fingerprint against the one that built it.
A two-tower retriever folder (`bertforge retriever train`: question/ and passage/) as the model builds the index with
its passage tower and searches it with its question tower, by dot product (the question tower is checked too).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bertforge.api.embeddings import load_sentence_encoder
from bertforge.api.inputs import device_for, model_name, placed, read_texts
from bertforge.config.arguments import (BOOL, COUNT, COUNT0, DATA, DEVICE, FRACTION, MODEL, PATH, TEXT, TEXTS,
                                        check_args, maybe)
from bertforge.errors import ArgumentError, BertforgeError


class Index:
    """Passages and the way they are retrieved (dense, bm25 or hybrid; for dense and hybrid the sentence encoder
    they were embedded with). Build one with `Index.build`, open a folder with `Index.load`; `add`, `search` and
    `save` it."""

    def __init__(self, index: Any, model: Any = None, *, device: str | None = None, compile: bool = False):
        self._index = index      # bertforge.retrieval.index.RetrievalIndex
        self._model = model      # a loaded SentenceEncoder, a model name, or None: the one the index records
        self._device, self._compile = device, compile
        self._encoder = None
        self._question = None    # a two-tower index's question tower, loaded on first search

    # ---- what it holds -----------------------------------------------------------------------------------------
    @property
    def path(self) -> Path | None:
        """Its folder (None: held in memory only)."""
        return self._index.path

    @property
    def method(self) -> str:
        """dense, bm25 or hybrid."""
        return self._index.method

    @property
    def kind(self) -> str | None:
        """The dense structure (flat, hnsw, ivf); None for bm25."""
        return self._index.meta.get("kind")

    @property
    def dim(self) -> int | None:
        """The embedding width; None for bm25."""
        return self._index.meta.get("dim")

    @property
    def ids(self) -> list[str]:
        return list(self._index.passages.ids)

    @property
    def titles(self) -> list[str]:
        return list(self._index.passages.titles)

    @property
    def texts(self) -> list[str]:
        return list(self._index.passages.texts)

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        what = self.method if self.method == "bm25" else f"{self.method}, {self.kind}, dim {self.dim}"
        return f"Index({len(self)} passages, {what}, {self.path or 'in memory'})"

    @property
    def model(self):
        """The sentence encoder of the index (loaded on first use: the one given, else the one it records); None
        for a bm25 index."""
        if self._encoder is None and self._index.needs_model:
            from bertforge.embedding import SentenceEncoder

            if isinstance(self._model, SentenceEncoder):
                self._index.check_model(self._model)
                self._encoder = placed(self._model, self._device, self._compile)
            else:
                encoder = self._index.load_model(self._model)
                self._encoder = placed(encoder, self._device or "auto", self._compile, f"--model {encoder.source}")
        return self._encoder

    def _question_model(self):
        """What queries are embedded with: a two-tower index's question tower, else the index's model."""
        if not self._index.two_towers:
            return self.model
        if self._question is None:
            from bertforge.embedding import SentenceEncoder

            given = None if isinstance(self._model, SentenceEncoder) else self._model
            retriever = given if given is not None and _is_retriever(given) else None
            self._question = placed(self._index.load_question_model(retriever), self._device or "auto",
                                    self._compile, "--retriever")
        return self._question

    # ---- build / load / save -----------------------------------------------------------------------------------
    @classmethod
    def build(cls, model: Any, passages: Any, out: Any = None, *, method: str = "dense", ids: list[str] | None = None,
              kind: str | None = None, fusion: str | None = None, alpha: float | None = None,
              stopwords: str = "en", text_col: Any = None, id_col: Any = None, title_col: Any = None,
              require_ids: bool = False, data_split: str | None = None, data_config: str | None = None,
              batch_size: int = 32, device: str | None = None, precision: str = "fp32", pooling: Any = None,
              compile: bool = False, progress: bool = False, overwrite: bool = False,
              revision: str | None = None, num_shards: int | None = None, shard_id: int | None = None,
              ray: Any = None, shard_dtype: str = "float32", chunk_size: int = 4096, environ: bool = False) -> Any:
        """Index `passages` by `method` into a new index, saved in `out` (None: in memory until `save`; a folder
        that holds files is refused unless `overwrite`).

        `method`: "dense" (embedded by `model`, a folder, Hub id or loaded SentenceEncoder, into a FAISS index of
        `kind` flat / hnsw / ivf / ivf-pq, default flat; a two-tower retriever folder: its passage tower embeds the
        passages and its question tower the queries, by dot product, flat or hnsw), "bm25" (`model` None;
        `stopwords` "en" or "none") or "hybrid" (both; `fusion` "weighted" (default: `alpha` the dense list's
        weight, default 0.5) or "rrf").

        Sharded, dense only (docs/retrieval.md, "A corpus-scale index"): `num_shards` N with `shard_id` I embeds
        only shard I (passages at positions I mod N) into `out`/shards and returns a `ShardBuild`; N without I
        builds every shard in turn, then merges; `ray` (True, or a cluster address) builds the shards on Ray, then
        merges. Shards are written in chunks of `chunk_size` passages as `shard_dtype` vectors; a rerun resumes.
        `environ`: read N and I from torchrun's or a Slurm job array's environment when not given (the command
        line does).

        `passages`: a list of strings (with `ids`, else "texts:ROW"), or a file (one passage a line; a table with
        `text_col` and optional `id_col` (default: id, _id, doc_id, ...) and `title_col` (default: title)), a saved
        or Hub dataset, data in memory; `require_ids` refuses a table without ids. Empty passages are skipped,
        duplicate ids refused. `precision`: what the passages (and later queries) are embedded in."""
        from bertforge.io.rundir import claim_output_dir
        from bertforge.retrieval.index import RetrievalIndex, check_options, require_method

        check_args(locals(), model=maybe(MODEL), passages=DATA, out=maybe(PATH), method=TEXT, kind=maybe(TEXT),
                   fusion=maybe(TEXT), alpha=maybe(FRACTION), stopwords=TEXT, text_col=maybe(TEXT),
                   id_col=maybe(TEXT), title_col=maybe(TEXT), require_ids=BOOL, data_split=maybe(TEXT),
                   data_config=maybe(TEXT), batch_size=COUNT, device=maybe(DEVICE), precision=TEXT, compile=maybe(BOOL),
                   progress=BOOL, overwrite=BOOL, revision=maybe(TEXT), num_shards=maybe(COUNT),
                   shard_id=maybe(COUNT0), shard_dtype=TEXT, chunk_size=COUNT,
                   environ=BOOL)
        require_method(method)  # the libraries, before hours of embedding
        check_options(method, model, kind, fusion, alpha)
        if method != "bm25":
            device_for(device, precision)
        sharded = num_shards is not None or shard_id is not None or ray is not None
        if not sharded and environ and method == "dense":
            from bertforge.retrieval.shards import shard_plan

            sharded = shard_plan(env=None)[0] is not None
        if sharded:
            if _is_retriever(model):
                raise BertforgeError("model: a two-tower retriever's index is built whole (flat or hnsw), not in "
                                     "shards")
            if method != "dense":
                raise BertforgeError(f"method: a sharded build embeds passages, so it is dense only (got {method!r})")
            return _sharded(model, passages, out, num_shards, shard_id, ray, kind or "flat", ids, text_col, id_col,
                            title_col, data_split, data_config, batch_size, precision, shard_dtype, chunk_size,
                            pooling, device, compile, revision, overwrite, progress, environ)

        def make(folder: Path | None) -> "Index":
            found = _passages(passages, ids, text_col, id_col, title_col, require_ids, data_split, data_config)
            encoder = question = None
            if method != "bm25" and _is_retriever(model):
                question, encoder = _towers(model, pooling, device, compile)
            elif method != "bm25":
                encoder = load_sentence_encoder(model, pooling=pooling, device=device, compile=compile,
                                                revision=revision)
            built = RetrievalIndex.build(folder, found, method=method, model=encoder, kind=kind, stopwords=stopwords,
                                         fusion=fusion, alpha=alpha, batch_size=batch_size, precision=precision,
                                         progress=progress, question=question,
                                         retriever=model if question is not None else None)
            index = cls(built, model if question is not None else encoder, device=device, compile=compile)
            index._encoder, index._question = encoder, question
            return index

        if out is None:
            return make(None)
        out = Path(out)
        if (out / "meta.json").exists() and not overwrite:
            raise ArgumentError(f"{out}: an index already exists there (use Index.load(...).add, overwrite=True, or "
                                "another out)",
                                flag_message=f"{out}: an index already exists there (use `index add`, --overwrite, "
                                "or another --out)")
        # one writer per folder; a failed build leaves no empty folder behind
        with claim_output_dir(out, resume=False, overwrite=overwrite, what="--out", resume_flag=None):
            return make(out)

    @classmethod
    def merge(cls, out: Any, kind: str = "flat", *, model: Any = None, num_shards: int | None = None,
              pooling: Any = None, overwrite: bool = False, progress: bool = False,
              revision: str | None = None) -> "Index":
        """Merge the shards built into folder `out` (`build(..., num_shards=, shard_id=)`) into the index of `out`
        (flat, hnsw, ivf or ivf-pq), after checking they are one set (and, given `model`, of that model)."""
        from bertforge.api.shards import merge

        check_args(locals(), out=PATH, kind=TEXT, model=maybe(MODEL), num_shards=maybe(COUNT), overwrite=BOOL,
                   progress=BOOL, revision=maybe(TEXT))
        merge(out, kind, model=model, num_shards=num_shards, pooling=pooling, revision=revision,
              overwrite=overwrite, progress=progress)
        return cls.load(out, model, revision=revision)

    @classmethod
    def load(cls, path: Any, model: Any = None, *, device: str | None = None, compile: bool = False,
             revision: str | None = None) -> "Index":
        """The index in folder `path`; a dense or hybrid one searched and added to with `model` (default: the
        model recorded in it; either way fingerprint-checked), on `device` (default: auto)."""
        from bertforge.retrieval.index import RetrievalIndex

        check_args(locals(), path=PATH, model=maybe(MODEL), device=maybe(DEVICE), compile=maybe(BOOL),
                   revision=maybe(TEXT))
        if not Path(path).is_dir():
            raise ArgumentError(f"path={str(path)!r}: not an index directory",
                                flag_message=f"--index {path}: not an index directory")
        index = RetrievalIndex.load(path)
        if not index.needs_model:
            if model is not None:
                raise BertforgeError(f"{path}: a bm25 index embeds nothing; leave the model out")
            return cls(index)
        if device is not None:
            device_for(device)
        if index.two_towers and model is not None and not _is_retriever(model):
            raise BertforgeError(f"{path}: built by a two-tower retriever; give its retriever folder (question/ and "
                                 "passage/) as the model, or none")
        if index.two_towers and model is not None:
            from bertforge.retrieval.towers import load_retriever

            encoder = load_retriever(model)[1]
            index.check_model(encoder)
            out = cls(index, encoder, device=device, compile=compile)
            out._model = model  # the folder: its question tower is loaded (and checked) on first search
            out._encoder = placed(encoder, device or "auto", compile, "--model")
            return out
        chosen = model_name(model, revision) if model is not None else None
        return cls(index, chosen, device=device, compile=compile)

    def save(self, path: Any = None, *, overwrite: bool = False) -> Path:
        """Write the index to `path` (default: its own folder) as the folder's next generation (a crash at any
        moment leaves the last complete one). A new folder that holds files is refused unless `overwrite`."""
        from bertforge.io.rundir import claim_output_dir
        from bertforge.retrieval.index import save_locked

        check_args(locals(), path=maybe(PATH), overwrite=BOOL)
        if path is None or (self.path is not None and Path(path).resolve() == self.path.resolve()):
            if self.path is None:
                raise BertforgeError("this index is held in memory only: give save() a folder")
            save_locked(self._index)
            return self.path
        with claim_output_dir(path, resume=False, overwrite=overwrite, what="--out", resume_flag=None):
            self._index.path = Path(path)
            self._index.save()
        return self._index.path

    # ---- use ---------------------------------------------------------------------------------------------------
    def add(self, passages: Any, *, ids: list[str] | None = None, text_col: Any = None, id_col: Any = None,
            title_col: Any = None, require_ids: bool = False, data_split: str | None = None,
            data_config: str | None = None, batch_size: int = 32, progress: bool = False) -> int:
        """Index `passages` (as `build` takes them; ids must be new); an index with a folder is saved at once,
        under the folder's lock (an add another process committed meanwhile is kept). Returns the number of
        passages added."""
        from bertforge.retrieval.index import add_locked

        check_args(locals(), passages=DATA, text_col=maybe(TEXT), id_col=maybe(TEXT), title_col=maybe(TEXT),
                   require_ids=BOOL, data_split=maybe(TEXT), data_config=maybe(TEXT), batch_size=COUNT,
                   progress=BOOL)
        encoder = self.model  # checked before the passages are read
        found = _passages(passages, ids, text_col, id_col, title_col, require_ids, data_split, data_config,
                          seen=set(self._index.passages.ids))
        if self.path is None:
            return self._index.add(encoder, found, batch_size=batch_size, progress=progress)
        self._index, added = add_locked(self._index, encoder, found, batch_size=batch_size, progress=progress)
        return added

    def search(self, queries: str | list[str], k: int = 10, *, rerank: Any = None, fusion: str | None = None,
               alpha: float | None = None, revision: str | None = None):
        """The top `k` passages of each query, best first: a list of `Hit`s (rank, score, id, title, text) for one
        query, a list of such lists for a list of queries. The score is the method's: cosine, BM25, or the fused
        score. `k` above the number of passages returns them all, with a warning. `fusion` / `alpha` (a hybrid
        index): other than the recorded ones for this search. `rerank`: a cross-encoder (a folder, Hub id or loaded
        `CrossEncoder`) that re-orders each query's hits (its score in `Hit.rerank_score`)."""
        from bertforge.retrieval.index import rerank as rerank_hits

        check_args(locals(), queries=TEXTS, k=COUNT, rerank=maybe(MODEL), fusion=maybe(TEXT), alpha=maybe(FRACTION),
                   revision=maybe(TEXT))
        one = isinstance(queries, str)
        questions = [queries] if one else list(queries)
        cross = None if rerank is None else _cross_encoder(rerank, self._device, revision)  # refused before work
        results = self._index.search(self._question_model(), questions, k=k, fusion=fusion, alpha=alpha)
        if cross is not None:
            results = [rerank_hits(hits, q, cross) for q, hits in zip(questions, results)]
        return results[0] if one else results


def _is_retriever(model: Any) -> bool:
    from bertforge.retrieval.towers import is_retriever

    return is_retriever(model)


def _towers(folder: Any, pooling: Any, device: str | None, compile: bool):
    """(question tower, passage tower) of a retriever folder, placed on `device`."""
    from bertforge.retrieval.towers import load_retriever

    if pooling is not None:
        raise BertforgeError("pooling: a retriever folder keeps its towers' own pooling; leave it out")
    question, passage = load_retriever(folder)
    passage = placed(passage, device or "auto", compile, f"--model {folder}")
    question = passage if question is passage else placed(question, device or "auto", compile, f"--model {folder}")
    return question, passage


def _sharded(model, passages, out, num_shards, shard_id, ray, kind, ids, text_col, id_col, title_col, data_split,
             data_config, batch_size, precision, shard_dtype, chunk_size, pooling, device, compile, revision,
             overwrite, progress, environ):
    from bertforge.api.shards import build_sharded

    if ids is not None:
        raise BertforgeError("ids: a sharded build reads its ids from the passages (id_col); drop ids")
    result = build_sharded(
        model, passages, out, num_shards=num_shards, shard_id=shard_id, ray=ray, kind=kind,
        passage_options={"text_col": text_col, "id_col": id_col, "title_col": title_col, "split": data_split,
                         "config": data_config},
        shard_options={"chunk_size": chunk_size, "dtype": shard_dtype, "batch_size": batch_size,
                       "precision": precision},
        pooling=pooling, device=device, compile=compile, revision=revision, overwrite=overwrite, progress=progress,
        environ=environ)
    if isinstance(result, dict):  # merged: the index folder
        return Index.load(out, model if not isinstance(model, (str, Path)) else None, device=device,
                          compile=compile)
    return result


def _cross_encoder(model: Any, device: str | None, revision: str | None):
    from bertforge.embedding.cross_encoder import CrossEncoder

    if isinstance(model, CrossEncoder):
        model.check_relevance()
        return placed(model, device)
    name = model_name(model, revision, "rerank=")
    cross = CrossEncoder.from_pretrained(name)
    cross.source = f"--rerank {name}"
    cross.check_relevance()  # before any query runs
    return placed(cross, device or "auto", what=f"--rerank {name}")


def _passages(passages: Any, ids: list[str] | None, text_col: Any, id_col: Any, title_col: Any, require_ids: bool,
              data_split: Any, data_config: Any, seen: set[str] | None = None):
    """The passages to index (retrieval.passages: ids and titles kept, duplicates refused, empty ones skipped), or
    the texts paired with the `ids` given."""
    from bertforge.io.tables import single_source
    from bertforge.retrieval.passages import Passage, Passages, read_passages

    source = single_source(passages, data_split, data_config)
    if ids is None:
        return read_passages(source, text_col=text_col, id_col=id_col, title_col=title_col, require_ids=require_ids,
                             seen=None if seen is None else set(seen))
    if id_col is not None:
        raise BertforgeError("give ids or id_col, not both")
    texts = read_texts(source, text_col, what="passages")  # row i pairs with ids[i], empty rows included
    if len(ids) != len(texts):
        raise BertforgeError(f"ids: {len(ids)} ids for {len(texts)} passages")
    out, known = Passages(), set(seen or ())
    for pid, text in zip(ids, texts):
        pid = str(pid)
        if not text.strip():
            continue
        if pid in known:
            raise BertforgeError(f"ids: duplicate passage id {pid!r}")
        known.add(pid)
        out.append(Passage(pid, "", text))
    if not out:
        raise BertforgeError("passages: empty corpus")
    return out
