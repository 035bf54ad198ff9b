"""Dense passage retrieval's objective and data (Karpukhin et al. 2020): a question and its positive passage, each
question's hard negatives (the data's own, else BM25's top passages that are not the positive and hold no answer),
and the loss: the negative log-likelihood of the positive in a softmax over the dot products of the question with
every passage of the batch (all positives and hard negatives: the in-batch negatives).

Training rows come in three layouts, told apart by their columns:
- `{"question", "positive", "negatives"?, "answers"?}` in any table `io.tables` reads (jsonl, csv, ...); a positive or
  negative that is a passage id of `passages` stands for that passage, else it is the passage's text; `negatives`
  and `answers` are lists (a csv cell holds a JSON list, or one text);
- DPR's own json: `question`, `answers`, `positive_ctxs`, `negative_ctxs`, `hard_negative_ctxs` (each a list of
  `{"title", "text"}`; the first positive, hard negatives before the others);
- SQuAD v1.1 (`{"data": [{"title", "paragraphs": [{"context", "qas"}]}]}`): each question with its paragraph.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from bertforge.errors import BertforgeError
from bertforge.io.tables import open_table
from bertforge.retrieval.passages import Passages, with_title


@dataclass
class RetrievalExample:
    question: str
    positive: str                                   # the passage's text as the encoder sees it (title first)
    negatives: list[str] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)


# ---- the loss ------------------------------------------------------------------------------------------------------
def dpr_loss(questions: torch.Tensor, passages: torch.Tensor, targets: torch.Tensor,
             same: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, in-batch top-1 accuracy): questions [B, D], passages [P, D] (positives and hard negatives), question i's
    positive at `targets[i]`. `same` [B, P] marks other copies of question i's positive in the batch (two questions
    of one paragraph), left out of its softmax: they are no negatives."""
    scores = questions @ passages.T
    if same is not None:
        scores = scores.masked_fill(same, float("-inf"))
    loss = F.cross_entropy(scores.float(), targets)
    accuracy = (scores.argmax(dim=1) == targets).float().mean()
    return loss, accuracy


# ---- reading training data -----------------------------------------------------------------------------------------
def _list(value: Any, where: str, name: str) -> list:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):  # a csv / tsv cell holding a JSON list
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                raise BertforgeError(f"{where}: {name} is not a JSON list") from None
        else:
            return [value]
    if not isinstance(value, (list, tuple)):
        raise BertforgeError(f"{where}: {name} must be a list")
    return list(value)


def _ctx_text(ctx: Any, where: str, name: str) -> str:
    if isinstance(ctx, str):
        return ctx
    if not isinstance(ctx, dict) or not isinstance(ctx.get("text"), str):
        raise BertforgeError(f"{where}: each of {name} must be {{\"title\", \"text\"}}")
    return with_title(str(ctx.get("title") or ""), ctx["text"])


def read_training(source: Any, passages: Passages | None = None, split: str | None = None,
                  config: str | None = None) -> list[RetrievalExample]:
    """The training examples of `source` in any of the module's layouts, in order."""
    table = open_table(source, split=split, config=config)
    by_id = {pid: with_title(title, text) for pid, title, text in
             zip(passages.ids, passages.titles, passages.texts)} if passages is not None else {}

    def passage(value: Any, where: str, name: str) -> str:
        if isinstance(value, dict):
            return _ctx_text(value, where, name)
        text = str(value)
        return by_id.get(text, text)

    examples: list[RetrievalExample] = []
    for row in table:
        where = row.where
        if "paragraphs" in row:  # SQuAD: an article
            title = str(row.get("title") or "")
            for paragraph in row["paragraphs"] or []:
                context = with_title(title, str(paragraph.get("context", "")))
                for qa in paragraph.get("qas", []):
                    answers = [str(a.get("text", "")) for a in qa.get("answers", []) if isinstance(a, dict)]
                    examples.append(RetrievalExample(str(qa.get("question", "")).strip(), context, [], answers))
            continue
        if "question" not in row:
            raise BertforgeError(f"{where}: no question (expected question + positive, DPR's json or SQuAD)")
        question = str(row["question"]).strip()
        answers = [str(a) for a in _list(row.get("answers"), where, "answers")]
        if "positive_ctxs" in row:  # DPR's json
            positives = _list(row["positive_ctxs"], where, "positive_ctxs")
            if not positives:
                continue  # DPR's own files hold questions with no positive; its trainer skips them too
            negatives = [_ctx_text(c, where, "hard_negative_ctxs")
                         for c in _list(row.get("hard_negative_ctxs"), where, "hard_negative_ctxs")]
            negatives += [_ctx_text(c, where, "negative_ctxs")
                          for c in _list(row.get("negative_ctxs"), where, "negative_ctxs")]
            examples.append(RetrievalExample(question, _ctx_text(positives[0], where, "positive_ctxs"), negatives,
                                             answers))
            continue
        if row.get("positive") in (None, ""):
            raise BertforgeError(f"{where}: no positive (the passage that answers the question)")
        negatives = [passage(n, where, "negatives") for n in _list(row.get("negatives"), where, "negatives")]
        examples.append(RetrievalExample(question, passage(row["positive"], where, "positive"), negatives, answers))
    if not examples:
        raise BertforgeError(f"{table.name}: no training examples")
    return examples


# ---- hard negatives ------------------------------------------------------------------------------------------------
def bm25_top(corpus: list[str], queries: list[str], k: int) -> list[list[int]]:
    """The indices of each query's `k` best passages of `corpus` by BM25 (bm25s, English stop words), best first."""
    try:
        import bm25s
    except ImportError:
        raise BertforgeError("mining hard negatives runs BM25, which needs bm25s: pip install "
                             "'bertforge[retrieval]' (or give hard_negatives=0)") from None
    index = bm25s.BM25()
    index.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)
    tokens = bm25s.tokenize(queries, stopwords="en", show_progress=False)
    found, _ = index.retrieve(tokens, k=min(k, len(corpus)), show_progress=False)
    return [list(map(int, row)) for row in found]


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def mine_hard_negatives(examples: list[RetrievalExample], n: int, corpus: list[str] | None = None,
                        search: Any = bm25_top) -> list[RetrievalExample]:
    """Fill each example's negatives up to `n` with the corpus's best BM25 passages for its question that are not
    its positive, not already among its negatives and hold none of its answers (DPR's rule). `corpus`: the passages
    to search (default: every positive and negative of `examples`); `search(corpus, queries, k)`: the ranking."""
    if n < 1:
        return examples
    if corpus is None:
        corpus = list(dict.fromkeys(t for ex in examples for t in (ex.positive, *ex.negatives)))
    wanting = [i for i, ex in enumerate(examples) if len(ex.negatives) < n]
    if not wanting or not corpus:
        return examples
    tops = search(corpus, [examples[i].question for i in wanting], n + 20)
    for i, top in zip(wanting, tops):
        ex = examples[i]
        taken = {_normal(ex.positive), *(_normal(t) for t in ex.negatives)}
        answers = [_normal(a) for a in ex.answers if a.strip()]
        for j in top:
            if len(ex.negatives) >= n:
                break
            text = corpus[j]
            norm = _normal(text)
            if norm in taken or any(a in norm for a in answers):
                continue
            taken.add(norm)
            ex.negatives.append(text)
    return examples
