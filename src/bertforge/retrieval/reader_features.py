"""The reader's inputs: one row `[CLS] question [SEP] title [SEP] passage [SEP]` per retrieved passage, the
passage tokens' character offsets, and where the answers occur.

Lengths, for a reader length L (`max_len`, with the special tokens):
- the question keeps at most L // 2 tokens: a longer one is cut to that, with a warning (never an error);
- the title at most a quarter of what the question leaves, the passage the rest (cut at its end: one window per
  passage, as DPR reads its 100-word passages; an answer beyond the cut cannot be found there).
An answer occurs where a run of passage tokens reads, SQuAD-normalised (`tasks.metrics.normalize_answer`), as one of
the question's answers: found by a case-insensitive search of the text, kept when the tokens covering the match
normalise to the answer (so "art" inside "start" is no match).
"""
from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from bertforge.tasks.metrics import normalize_answer

log = logging.getLogger(__name__)


@dataclass
class ReaderRow:
    """One (question, passage) input. `offsets` [n, 2]: the character span in the passage text of each token, -1
    outside the passage (question, title, specials); `spans`: (start token, end token) of each answer occurrence."""

    input_ids: list[int]
    token_type_ids: list[int]
    offsets: np.ndarray
    spans: list[tuple[int, int]]

    @property
    def span_mask(self) -> np.ndarray:
        return self.offsets[:, 0] >= 0


def _plain_tokens(tokenizer, texts: Sequence[str]) -> list[tuple[list[int], np.ndarray]]:
    """(ids, char offsets [n, 2]) of each text's own tokens (no specials)."""
    if not texts:
        return []
    enc = tokenizer(list(texts), max_length=1_000_000, padding=False, truncation=False, return_tensors=None,
                    return_offsets=True, return_special_tokens_mask=True)
    out = []
    for ids, offs, special, att in zip(enc["input_ids"], enc["offset_mapping"], enc["special_tokens_mask"],
                                       enc["attention_mask"]):
        keep = [i for i in range(len(ids)) if att[i] and not special[i]]
        out.append(([ids[i] for i in keep], np.asarray([offs[i] for i in keep], dtype=np.int64).reshape(-1, 2)))
    return out


def question_tokens(tokenizer, questions: Sequence[str], max_len: int) -> list[list[int]]:
    """Each question's tokens, cut to max_len // 2 (with one warning naming how many were cut)."""
    bound = max(1, max_len // 2)
    out, cut = [], 0
    for ids, _ in _plain_tokens(tokenizer, questions):
        if len(ids) > bound:
            cut += 1
            ids = ids[:bound]
        out.append(ids)
    if cut:
        log.warning("%d question(s) longer than %d tokens (half the reader's length %d) were cut to that", cut,
                    bound, max_len)
    return out


def answer_spans(text: str, offsets: np.ndarray, answers: Sequence[str], max_answer_len: int = 30
                 ) -> list[tuple[int, int]]:
    """(start token, end token) of every occurrence of any answer among the tokens with `offsets` (the passage's,
    in order), at most `max_answer_len` tokens long."""
    if not len(offsets):
        return []
    lower = text.lower()
    found: set[tuple[int, int]] = set()
    for answer in answers:
        norm = normalize_answer(answer)
        if not norm:
            continue
        needles = {answer.strip().lower(), norm}  # "The Beatles" is found as written, and as "beatles"
        for m in (m for needle in needles for m in re.finditer(re.escape(needle), lower)):
            cs, ce = m.start(), m.end()
            ts = int(np.searchsorted(offsets[:, 1], cs, side="right"))  # first token ending after the match starts
            te = int(np.searchsorted(offsets[:, 0], ce, side="left")) - 1  # last token starting before it ends
            if ts >= len(offsets) or te < ts or te - ts + 1 > max_answer_len:
                continue  # beyond the passage's cut, or too long
            if normalize_answer(text[offsets[ts, 0]:offsets[te, 1]]) == norm:
                found.add((ts, te))
    return sorted(found)


def build_rows(tokenizer, question_ids: list[int], passages: Sequence[tuple[str, str]], max_len: int,
               answers: Sequence[str] = (), max_answer_len: int = 30) -> list[ReaderRow]:
    """A row per (title, text) passage for one question (its tokens from `question_tokens`); `answers`: mark where
    they occur (training, evaluation)."""
    titles = _plain_tokens(tokenizer, [t for t, _ in passages])
    texts = _plain_tokens(tokenizer, [x for _, x in passages])
    sep = tokenizer.sep_token_id
    n_specials = len(tokenizer.build_inputs([], [])[0])
    # where the second segment starts, found with a sentinel so any special-token layout works
    b0 = tokenizer.build_inputs(question_ids, [-1])[0].index(-1)
    left = max_len - n_specials - len(question_ids)
    rows = []
    for (title, text), (t_ids, _), (p_ids, p_offs) in zip(passages, titles, texts):
        t_ids = t_ids[: max(0, left // 4)] if title.strip() else []
        head = [*t_ids, sep] if t_ids else []
        room = max(0, left - len(head))
        p_ids, p_offs = p_ids[:room], p_offs[:room]
        ids, types = tokenizer.build_inputs(question_ids, [*head, *p_ids])
        offsets = np.full((len(ids), 2), -1, dtype=np.int64)
        first = b0 + len(head)
        offsets[first:first + len(p_ids)] = p_offs
        spans = [(first + s, first + e) for s, e in answer_spans(text, p_offs, answers, max_answer_len)] \
            if answers else []
        rows.append(ReaderRow(ids, types, offsets, spans))
    return rows


def question_tensors(rows: list[ReaderRow]) -> dict[str, torch.Tensor]:
    """One question's rows as tensors [K, L] (L its longest row), its spans [S, 3] (passage, start, end)."""
    t = max(len(r.input_ids) for r in rows)
    k = len(rows)
    ids = torch.zeros(k, t, dtype=torch.long)
    types = torch.zeros(k, t, dtype=torch.long)
    att = torch.zeros(k, t, dtype=torch.long)
    mask = torch.zeros(k, t, dtype=torch.bool)
    for i, r in enumerate(rows):
        n = len(r.input_ids)
        ids[i, :n] = torch.tensor(r.input_ids)
        types[i, :n] = torch.tensor(r.token_type_ids)
        att[i, :n] = 1
        mask[i, :n] = torch.from_numpy(r.span_mask)
    spans = [(i, s, e) for i, r in enumerate(rows) for s, e in r.spans]
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": att, "span_mask": mask,
            "passage_mask": torch.ones(k, dtype=torch.bool),
            "spans": torch.tensor(spans, dtype=torch.long).reshape(-1, 3)}


def collate_questions(pad_id: int):
    """How question rows become a batch: tokens padded to the longest row, passages to the most passages (padding
    passages hold one [PAD] token that attends, so no row is all masked, and are left out by `passage_mask`), spans
    to the most spans (rows of -1)."""

    def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        b = len(items)
        k = max(x["input_ids"].shape[0] for x in items)
        t = max(x["input_ids"].shape[1] for x in items)
        s = max(1, max(x["spans"].shape[0] for x in items))
        out = {"input_ids": torch.full((b, k, t), pad_id, dtype=torch.long),
               "token_type_ids": torch.zeros(b, k, t, dtype=torch.long),
               "attention_mask": torch.zeros(b, k, t, dtype=torch.long),
               "span_mask": torch.zeros(b, k, t, dtype=torch.bool),
               "passage_mask": torch.zeros(b, k, dtype=torch.bool),
               "spans": torch.full((b, s, 3), -1, dtype=torch.long)}
        out["attention_mask"][:, :, 0] = 1
        for i, x in enumerate(items):
            kk, tt = x["input_ids"].shape
            for key in ("input_ids", "token_type_ids", "attention_mask", "span_mask"):
                out[key][i, :kk, :tt] = x[key]
            out["passage_mask"][i, :kk] = x["passage_mask"]
            out["spans"][i, : x["spans"].shape[0]] = x["spans"]
        return out

    return collate
