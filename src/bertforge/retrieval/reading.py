"""Reading the top k: a trained reader over each question's retrieved passages -> the answer, its score and the
passages it came from. What `bertforge ask`, `bertforge.ask` and serve's /answer compute, and what open-QA
evaluation scores.

Scoring (DPR's): a span's score is P(passage) x P(start) x P(end), P(passage) the softmax of the selection logits
over the question's k passages, P(start) / P(end) softmaxes over that passage's tokens. In each passage the
`n_best` best starts and ends are paired (end >= start, at most `max_answer_len` tokens). Spans whose texts
normalise alike (SQuAD's normalisation) are one answer whose score is the sum of theirs (the marginal over its
occurrences, as the loss trains it); the best answer is printed as its best-scoring span's text, with every
passage span that gave it.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from bertforge.retrieval.reader_features import ReaderRow, build_rows, collate_questions, question_tensors, \
    question_tokens
from bertforge.tasks.metrics import normalize_answer


def hit_fields(hit: Any) -> dict[str, Any]:
    """A retrieval hit as the reader and the output see it: id, title ("" when the index keeps none), text, score."""
    title = getattr(hit, "title", None)
    return {"id": str(hit.id), "title": title or "", "text": hit.text, "retrieval_score": float(hit.score)}


def encode_questions(tokenizer, questions: Sequence[str], passages: Sequence[Sequence[dict]], max_len: int,
                     answers: Sequence[Sequence[str]] | None = None) -> list[tuple[list[ReaderRow], dict]]:
    """Per question: its rows and their tensors (`question_tensors`); `answers` mark the answer spans."""
    q_ids = question_tokens(tokenizer, questions, max_len)
    out = []
    for i, (ids, hits) in enumerate(zip(q_ids, passages)):
        rows = build_rows(tokenizer, ids, [(h["title"], h["text"]) for h in hits], max_len,
                          answers[i] if answers is not None else ())
        out.append((rows, question_tensors(rows)))
    return out


@torch.no_grad()
def reader_logits(model: nn.Module, encoded: list[dict], pad_id: int, batch_size: int = 8,
                  progress: bool = False) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(start [K, L], end [K, L], selection [K]) logits per question, `batch_size` questions a forward pass."""
    device = next(model.parameters()).device
    collate = collate_questions(pad_id)
    out = []
    steps = range(0, len(encoded), batch_size)
    for lo in tqdm(steps, desc="read", disable=not progress or len(steps) < 2, leave=False):
        chunk = encoded[lo:lo + batch_size]
        batch = {k: v.to(device) for k, v in collate(chunk).items() if k != "spans"}
        res = model(**batch)
        for j, x in enumerate(chunk):
            k, t = x["input_ids"].shape
            out.append((res["start_logits"][j, :k, :t].float().cpu().numpy(),
                        res["end_logits"][j, :k, :t].float().cpu().numpy(),
                        res["select_logits"][j, :k].float().cpu().numpy()))
    return out


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def best_answers(rows: list[ReaderRow], hits: Sequence[dict], start: np.ndarray, end: np.ndarray,
                 select: np.ndarray, n_best: int = 20, max_answer_len: int = 30, top: int = 5) -> dict[str, Any]:
    """The question's answer (see the module docstring): {"answer", "score", "passages": [the spans that gave it:
    id, title, text, retrieval_score, start, end (characters in the passage text), score], "answers": [the `top`
    answers: text, score]}. No span at all (every passage empty): answer "" with score 0."""
    log_sel = _log_softmax(select)
    spans: list[tuple[float, int, int, int]] = []  # (log score, passage, char start, char end)
    for p, row in enumerate(rows):
        mask = np.zeros(start.shape[1], dtype=bool)
        mask[: len(row.span_mask)] = row.span_mask  # the question's rows are padded to its longest
        if not mask.any():
            continue
        ls, le = _log_softmax(start[p]), _log_softmax(end[p])
        ls[~mask] = -np.inf
        le[~mask] = -np.inf
        s_idx = np.argsort(-ls, kind="stable")[:n_best]
        e_idx = np.argsort(-le, kind="stable")[:n_best]
        s_idx, e_idx = s_idx[mask[s_idx]], e_idx[mask[e_idx]]
        S, E = s_idx[:, None], e_idx[None, :]
        ok = (E >= S) & (E - S + 1 <= max_answer_len)
        for a, b in zip(*np.nonzero(ok)):
            si, ei = int(s_idx[a]), int(e_idx[b])
            spans.append((float(log_sel[p] + ls[si] + le[ei]), p, int(row.offsets[si, 0]), int(row.offsets[ei, 1])))
    groups: dict[str, dict[str, Any]] = {}
    for lp, p, cs, ce in sorted(spans, key=lambda x: -x[0]):
        text = hits[p]["text"][cs:ce]
        key = normalize_answer(text) or text
        g = groups.setdefault(key, {"text": text, "score": 0.0, "passages": []})
        g["score"] += float(np.exp(lp))
        g["passages"].append({**hits[p], "start": cs, "end": ce, "score": float(np.exp(lp))})
    ranked = sorted(groups.values(), key=lambda g: -g["score"])
    if not ranked:
        return {"answer": "", "score": 0.0, "passages": [], "answers": []}
    best = ranked[0]
    return {"answer": best["text"], "score": best["score"], "passages": best["passages"],
            "answers": [{"text": g["text"], "score": g["score"]} for g in ranked[:top]]}


def read(model: nn.Module, tokenizer, questions: Sequence[str], passages: Sequence[Sequence[dict]], max_len: int,
         batch_size: int = 8, n_best: int = 20, max_answer_len: int = 30, progress: bool = False
         ) -> list[dict[str, Any]]:
    """The answer of each question from its passages (`hit_fields` dicts, best retrieved first)."""
    found = [i for i, hits in enumerate(passages) if hits]  # an empty index gives a question no passage
    encoded = encode_questions(tokenizer, [questions[i] for i in found], [passages[i] for i in found], max_len)
    logits = reader_logits(model, [x for _, x in encoded], tokenizer.pad_token_id, batch_size, progress)
    out = [{"question": q, "answer": "", "score": 0.0, "passages": [], "answers": []} for q in questions]
    for i, (rows, _), (s, e, sel) in zip(found, encoded, logits):
        out[i].update(best_answers(rows, passages[i], s, e, sel, n_best, max_answer_len))
    return out
