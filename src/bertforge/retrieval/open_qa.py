"""Scoring an open-domain QA system over a question file: retrieve the top k passages of every question, find which
of them hold an answer (`metrics.has_answer`), and, when a reader is given, score its answer (exact match, F1).

    result = score_open_qa(read_questions("nq-open-dev.jsonl"), search, ks=(1, 5, 20, 100), answer_fn=reader)
    result.to_dict()     # {"top_k_accuracy": {"1": ..., "5": ...}, "exact_match": ..., "unscoreable": [...], ...}

`search(questions, k)` returns, per question, its hits best first (objects with a `.text`, or dicts with "text");
`answer_fn(question, hits) -> str` is the reader. A k larger than the most hits any question got is not reported
(a note says so): top-100 accuracy over 20 retrieved passages would be top-20 accuracy under another name.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.retrieval.metrics import (DEFAULT_KS, Answers, answer_scores, first_hit, has_answer, parse_ks,
                                         prepare_answers, simple_tokens, top_k_accuracy)
from bertforge.retrieval.questions import Question

SearchFn = Callable[[list[str], int], list[list[Any]]]
AnswerFn = Callable[[str, list[Any]], str]


@dataclass
class OpenQAResult:
    """Top-k retrieval accuracy (percent of the scored questions) per k; with a reader, exact match and F1 (percent;
    F1 None for regex answers). `scored` / `unscoreable`: the questions counted, and the ids of those left out
    because no gold answer could be scored (see `retrieval.metrics`). `per_question`: the 1-based rank of the first
    passage holding an answer (None: not in the top `retrieved`), and the reader's answer and scores."""

    questions: int
    scored: int
    retrieved: int
    top_k_accuracy: dict[int, float]
    match: str
    format: str = ""
    unscoreable: list[str] = field(default_factory=list)
    exact_match: float | None = None
    f1: float | None = None
    reader_scored: int = 0
    reader_unscoreable: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    per_question: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def to_dict(self, per_question: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "questions": self.questions, "scored": self.scored, "retrieved": self.retrieved,
            "top_k_accuracy": {str(k): v for k, v in self.top_k_accuracy.items()}, "match": self.match,
            "format": self.format, "unscoreable": list(self.unscoreable), "notes": list(self.notes)}
        if self.exact_match is not None:
            out.update(exact_match=self.exact_match, f1=self.f1, reader_scored=self.reader_scored,
                       reader_unscoreable=list(self.reader_unscoreable))
        if per_question:
            out["per_question"] = [dict(r) for r in self.per_question]
        return out


def _text(hit: Any) -> str:
    text = hit.get("text") if isinstance(hit, dict) else getattr(hit, "text", None)
    if not isinstance(text, str):
        raise BertforgeError(f"a retrieved hit has no text: {hit!r:.80}")
    return text


def score_open_qa(questions: Sequence[Question], search: SearchFn, ks: Sequence[int] | str = DEFAULT_KS,
                  answer_fn: AnswerFn | None = None, *, format: str = "", batch_size: int = 256,
                  progress: bool = False) -> OpenQAResult:
    """Score `questions` (`read_questions(...).questions`) retrieved by `search` (and read by `answer_fn`)."""
    ks = parse_ks(ks)
    if not questions:
        raise BertforgeError("no questions to score")
    matches = {q.match for q in questions}
    want = max(ks)
    prepared: list[Answers] = [prepare_answers(q.answers, q.match) for q in questions]
    tokens_of: dict[str, list[str]] = {}  # a passage is tokenised once, however many questions retrieve it
    firsts: list[int | None] = []
    unscoreable, reader_unscoreable, rows = [], [], []
    em_sum = f1_sum = 0.0
    f1_n = reader_n = retrieved = 0
    bar = _bar(len(questions), progress)
    for start in range(0, len(questions), batch_size):
        batch = list(questions[start:start + batch_size])
        results = search([q.question for q in batch], want)
        if len(results) != len(batch):
            raise BertforgeError(f"search returned {len(results)} result lists for {len(batch)} questions")
        for q, answers, hits in zip(batch, prepared[start:start + batch_size], results):
            texts = [_text(h) for h in hits][:want]
            retrieved = max(retrieved, len(texts))
            row: dict[str, Any] = {"id": q.qid}
            if answers.scoreable:
                flags = [has_answer(answers, t, tokens=_tokens(tokens_of, t, answers.match)) for t in texts]
                hit = first_hit(flags)
                firsts.append(hit)
                row["first_hit_rank"] = None if hit is None else hit + 1
            else:
                unscoreable.append(q.qid)
            if answer_fn is not None:
                prediction = str(answer_fn(q.question, list(hits)))
                row["prediction"] = prediction
                scores = answer_scores(prediction, q.answers, q.match)
                if scores is None:
                    reader_unscoreable.append(q.qid)
                else:
                    reader_n += 1
                    em_sum += scores[0]
                    row["exact_match"] = scores[0]
                    if scores[1] is not None:
                        f1_n += 1
                        f1_sum += scores[1]
                        row["f1"] = scores[1]
            rows.append(row)
        bar.update(len(batch))
    bar.close()
    notes = []
    if retrieved == 0:
        raise BertforgeError("the retriever returned no passages")
    shown = [k for k in ks if k <= retrieved] or [retrieved]
    if len(shown) < len(ks) or shown[-1] not in ks:
        notes.append(f"at most {retrieved} passages were retrieved per question: top-k reported for k in "
                     f"{', '.join(map(str, shown))} only")
    if unscoreable:
        notes.append(f"{len(unscoreable)} question(s) have no scoreable answer and are left out (unscoreable)")
    result = OpenQAResult(
        questions=len(questions), scored=len(firsts), retrieved=retrieved,
        top_k_accuracy=top_k_accuracy(firsts, shown) if firsts else {}, match="/".join(sorted(matches)),
        format=format, unscoreable=unscoreable, notes=notes, per_question=rows)
    if answer_fn is not None:
        result.exact_match = 100.0 * em_sum / reader_n if reader_n else None
        result.f1 = 100.0 * f1_sum / f1_n if f1_n else None
        result.reader_scored, result.reader_unscoreable = reader_n, reader_unscoreable
        if reader_unscoreable:
            notes.append(f"{len(reader_unscoreable)} question(s) have no gold answer the reader can be scored "
                         "against and are left out of exact match / F1")
    return result


def _tokens(cache: dict[str, list[str]], text: str, match: str) -> list[str] | None:
    if match != "string":
        return None
    if text not in cache:
        cache[text] = simple_tokens(text)
    return cache[text]


def _bar(total: int, progress: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="open-domain QA", unit="question", disable=not progress)
