"""Question generation from SQuAD (Du et al. 2017's task): the answer and its context in, the question out, as the
JSONL that `bertforge finetune --task seq2seq` reads.

    build_qg("../shared/data/squad/dev-v1.1.json", "runs/qg-data", dev_articles=8)
    # -> runs/qg-data/train.jsonl, dev.jsonl: {"source": "answer: A context: C", "target": Q, "id", "article"}

The split is by article (the last `dev_articles` articles of the file are dev), so no dev passage is seen in
training; each answered question gives one row, with its first gold answer. `context="sentence"` keeps only the
sentence(s) the answer lies in (Du et al.'s sentence-level setting: shorter sources, for small budgets).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bertforge.data.corpus import split_sentences
from bertforge.errors import BertforgeError
from bertforge.io.write import atomic_write_text
from bertforge.tasks.squad import SquadExample, read_squad, split_by_article

CONTEXTS = ("paragraph", "sentence")


def answer_sentences(context: str, start: int, end: int) -> str:
    """The sentences of `context` that overlap the answer's characters [start, end)."""
    out, pos = [], 0
    for sent in split_sentences(context):
        at = context.find(sent[:20], pos)  # split_sentences may normalise spaces: locate by the sentence's head
        at = pos if at < 0 else at
        stop = at + len(sent)
        if stop > start and at < end:
            out.append(sent)
        pos = max(pos, stop)
    return " ".join(out) or context


def qg_row(ex: SquadExample, context: str = "paragraph") -> dict[str, Any] | None:
    """One row for an answered question (None for an unanswerable one)."""
    if not ex.answers:
        return None
    a = ex.answers[0]
    text = ex.context if context == "paragraph" else answer_sentences(ex.context, a.start, a.end)
    return {"source": f"answer: {a.text} context: {' '.join(text.split())}", "target": ex.question.strip(),
            "id": ex.qid, "article": ex.title or str(ex.article)}


def build_qg(squad_path: str | Path, out_dir: str | Path, dev_articles: int = 8,
             context: str = "paragraph") -> dict[str, Any]:
    """Write OUT/train.jsonl and OUT/dev.jsonl; returns the counts and the dev article titles."""
    if context not in CONTEXTS:
        raise BertforgeError(f"--context must be one of {', '.join(CONTEXTS)}, not {context!r}")
    examples = read_squad(squad_path)
    n_articles = len({ex.article for ex in examples})
    if not 0 < dev_articles < n_articles:
        raise BertforgeError(f"--dev-articles {dev_articles}: {squad_path} has {n_articles} articles; hold out "
                             f"between 1 and {n_articles - 1}")
    train, dev = split_by_article(examples, n_articles - dev_articles)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, split in (("train", train), ("dev", dev)):
        rows = [r for r in (qg_row(ex, context) for ex in split) if r is not None]
        atomic_write_text(out / f"{name}.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        counts[name] = len(rows)
    return {"train": counts["train"], "dev": counts["dev"], "train_articles": n_articles - dev_articles,
            "dev_articles": sorted({ex.title or str(ex.article) for ex in dev}), "context": context,
            "source": str(squad_path)}


def train_contexts(squad_path: str | Path, n_train_articles: int) -> list[str]:
    """The paragraphs of the first `n_train_articles` articles (in-domain pretraining text with no dev passage)."""
    examples = read_squad(squad_path)
    train, _ = split_by_article(examples, n_train_articles)
    return list(dict.fromkeys(ex.context for ex in train))
