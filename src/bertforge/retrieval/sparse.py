"""BM25 over passages, scored by bm25s (Lù 2024: the BM25 term scores computed once at build time into a sparse
document x term matrix, so a query is a sum of a few of its columns).

`BM25Index.build(texts, settings)` tokenises with bm25s's tokenizer (its word pattern, lowercasing, its English
stopword list or none) and indexes with `bm25s.BM25` (Lucene's BM25 variant, k1 1.5, b 0.75: bm25s's defaults);
`search(queries, k)` is `BM25.retrieve` on the queries tokenised the same way. What is saved is the three arrays of
the sparse matrix (`arrays`, written with numpy's npz, read back with allow_pickle=False) and the vocabulary (JSON);
the settings go to the index's meta.json, so a query is tokenised as the passages were. bm25s's own save/load is
not used: it writes into fixed file names (an index folder commits numbered generations) and not atomically.

BM25 statistics (document frequencies, the mean length) are corpus-wide, so adding passages rebuilds the matrix
from every passage's text: the result equals a build over the whole corpus.
"""
from __future__ import annotations

import io
import json
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from bertforge.errors import BertforgeError
from bertforge.io.read import read_json

STOPWORDS = ("en", "none")
TOKEN_PATTERN = r"(?u)\b\w\w+\b"  # bm25s's (scikit-learn's CountVectorizer's): words of two or more characters
ARRAYS = ("data", "indices", "indptr")


def bm25s_module():
    """bm25s, or one line naming the extra that installs it."""
    try:
        import bm25s
    except ImportError:
        raise BertforgeError("BM25 retrieval needs bm25s, which is not installed: "
                             "pip install 'bertforge[retrieval]'") from None
    return bm25s


@dataclass(frozen=True)
class BM25Settings:
    """How passages and queries are tokenised and scored (recorded in meta.json under "bm25")."""
    stopwords: str = "en"       # "en": bm25s's English stopword list; "none": keep every word
    lower: bool = True
    token_pattern: str = TOKEN_PATTERN
    k1: float = 1.5
    b: float = 0.75
    method: str = "lucene"

    def __post_init__(self) -> None:
        if self.stopwords not in STOPWORDS:
            raise BertforgeError(f"stopwords must be one of {', '.join(STOPWORDS)} (got {self.stopwords!r})")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> "BM25Settings":
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known - {"num_docs"})
        if unknown:
            raise BertforgeError(f"{where}: unknown BM25 setting {unknown[0]!r}")
        return cls(**{k: v for k, v in d.items() if k in known})

    @property
    def bm25s_stopwords(self) -> str | None:
        return "en" if self.stopwords == "en" else None


class BM25Index:
    """A bm25s retriever and the settings its passages were tokenised with (row r = the r-th passage)."""

    def __init__(self, retriever: Any, settings: BM25Settings):
        self.retriever, self.settings = retriever, settings

    def __len__(self) -> int:
        return int(self.retriever.scores["num_docs"])

    def tokenize(self, texts: list[str], *, ids: bool, progress: bool = False):
        bm25s = bm25s_module()
        return bm25s.tokenize(texts, lower=self.settings.lower, token_pattern=self.settings.token_pattern,
                              stopwords=self.settings.bm25s_stopwords, return_ids=ids, show_progress=progress)

    @classmethod
    def build(cls, texts: list[str], settings: BM25Settings | None = None, progress: bool = False) -> "BM25Index":
        bm25s = bm25s_module()
        settings = settings or BM25Settings()
        out = cls(bm25s.BM25(k1=settings.k1, b=settings.b, method=settings.method), settings)
        out.retriever.index(out.tokenize(texts, ids=True, progress=progress), show_progress=progress)
        return out

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows [Q, k], scores [Q, k]) best first, k at most the corpus size. A passage that shares no term with
        the query scores 0 (Lucene's idf is positive, so every match scores above 0)."""
        k = min(k, len(self))
        rows, scores = self.retriever.retrieve(self.tokenize(queries, ids=False), k=k, show_progress=False)
        return np.asarray(rows), np.asarray(scores)

    # ---- what a folder keeps -----------------------------------------------------------------------------------
    def arrays_bytes(self) -> bytes:
        """The sparse score matrix as an .npz (plain numeric arrays: loading needs no pickle)."""
        buf = io.BytesIO()
        scores = self.retriever.scores
        extra = {}
        if getattr(self.retriever, "nonoccurrence_array", None) is not None:  # BM25L / BM25+ only
            extra["nonoccurrence"] = self.retriever.nonoccurrence_array
        np.savez(buf, **{name: scores[name] for name in ARRAYS}, **extra)
        return buf.getvalue()

    def vocab_bytes(self) -> bytes:
        return json.dumps(self.retriever.vocab_dict, ensure_ascii=False).encode("utf-8")

    @classmethod
    def read(cls, arrays_path: Any, vocab_path: Any, settings: BM25Settings, count: int) -> "BM25Index":
        bm25s = bm25s_module()
        try:
            with np.load(arrays_path, allow_pickle=False) as npz:
                arrays = {name: npz[name] for name in npz.files}
        except (ValueError, OSError, KeyError) as err:
            raise BertforgeError(f"{arrays_path}: cannot be read ({str(err).splitlines()[0]})") from None
        missing = [name for name in ARRAYS if name not in arrays]
        if missing:
            raise BertforgeError(f"{arrays_path}: no array {missing[0]!r}")
        vocab = read_json(vocab_path)
        if len(vocab) > len(arrays["indptr"]):  # bm25s adds "" after the matrix
            raise BertforgeError(f"{vocab_path}: expected an object of at most {len(arrays['indptr'])} terms")
        retriever = bm25s.BM25(k1=settings.k1, b=settings.b, method=settings.method)
        retriever.scores = {**{name: arrays[name] for name in ARRAYS}, "num_docs": count}
        retriever.vocab_dict = vocab
        retriever.unique_token_ids_set = set(vocab.values())
        retriever.nonoccurrence_array = arrays.get("nonoccurrence")
        return cls(retriever, settings)
