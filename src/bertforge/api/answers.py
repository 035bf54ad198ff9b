"""What every way of answering open-domain questions shares (`api.reading`'s reader, `api.generative_qa`'s
generators): the result, the question check, the index opened with a retriever."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bertforge.api.inputs import model_name
from bertforge.errors import BertforgeError

BM25 = "bm25"  # --retriever bm25: the index is a sparse one and needs no question encoder


@dataclass
class AskResult:
    """One question's answer: the text, its score (a reader's: P(passage) x P(span), summed over the spans that read
    alike; a generator's: the answer's probability, docs/rag.md), the passages it came from (id, title, text,
    retrieval_score; a reader's: start / end, the span's characters in the text, and score; RAG's: weight, p(z|x)),
    the next best `answers` (a reader's)."""

    question: str
    answer: str
    score: float
    passages: list[dict[str, Any]] = field(default_factory=list)
    answers: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"question": self.question, "answer": self.answer, "score": self.score, "passages": self.passages,
                "answers": self.answers}


def open_index(index: Any, retriever: Any = None, device: str | None = None, revision: str | None = None):
    """The `Index` to retrieve from: an Index as given, or the folder `index` opened with `retriever` as its question
    encoder (a model folder or Hub id; None or "bm25": the index's own)."""
    from bertforge.api.index import Index

    if index is None:
        raise BertforgeError("index: give the index to retrieve passages from")
    if hasattr(index, "search") and not isinstance(index, (str, bytes)):
        return index
    model = None if retriever is None or str(retriever).lower() == BM25 else model_name(retriever, revision,
                                                                                          "retriever=")
    return Index.load(index, model, device=device)


def check_question(question: Any, i: int = 0) -> str:
    if not isinstance(question, str) or not question.strip():
        raise BertforgeError(f"question[{i}]: an empty question (give its text)")
    return question.strip()
