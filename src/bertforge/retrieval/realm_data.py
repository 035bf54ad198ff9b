"""REALM's training examples: sentences with at least one salient span (`realm.salient_spans`), one span masked whole
per sentence and epoch, each sentence knowing its source passages in the knowledge corpus (never retrieved for it).

A span's choice is drawn from (seed, epoch, sentence) alone, so a resumed run masks what the uninterrupted one
masked. The sentence is the first `max_tokens` tokens of the reader's input; the rest of the reader's sequence is
left to the retrieved document.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from bertforge.data.corpus import split_sentences
from bertforge.errors import BertforgeError
from bertforge.retrieval.realm import DATE, salient_spans, span_tokens

IGNORE = -100
Spans = Callable[[list[str]], list[list[tuple[int, int]]]]  # sentences -> each one's salient character spans
_WORD = re.compile(r"\w+(?:[-'’.]\w+)*|[^\w\s]")  # CoNLL-style words: punctuation apart


def heuristic_spans(sentences: list[str]) -> list[list[tuple[int, int]]]:
    """`realm.salient_spans` of each sentence (dates, and capitalised runs as named entities)."""
    return [salient_spans(s) for s in sentences]


def ner_spans(model: Any, device: str = "auto", batch_size: int = 64, progress: bool = False) -> Spans:
    """Salient spans as the paper finds them: the named entities a token-classification model (bertforge's CoNLL NER
    model, `finetune --task conll`) tags in each sentence, and dates by `realm`'s regular expression."""
    def spans(sentences: list[str]) -> list[list[tuple[int, int]]]:
        from bertforge.tasks.predict import predict

        words = [[(m.start(), m.end()) for m in _WORD.finditer(s)] for s in sentences]
        keep = [i for i, w in enumerate(words) if w]
        rows = predict(model, [{"tokens": [sentences[i][a:b] for a, b in words[i]]} for i in keep],
                       batch_size=batch_size, device=device, progress=progress) if keep else []
        out: list[list[tuple[int, int]]] = [[] for _ in sentences]
        for i, row in zip(keep, rows):
            found = [(m.start(), m.end()) for m in DATE.finditer(sentences[i])]
            found += [(words[i][a][0], words[i][b][1]) for a, b in entity_runs(row["tags"])]
            out[i] = merged(found)
        return out
    return spans


def entity_runs(tags: list[str]) -> list[tuple[int, int]]:
    """(first word, last word) of each entity in BIO / IOB1 tags: B-X starts one, I-X continues an X (or starts one
    after O or another type), O ends it."""
    runs: list[tuple[int, int]] = []
    kind = None
    for j, tag in enumerate(tags):
        prefix, _, label = tag.partition("-")
        if prefix == "I" and label == kind:
            runs[-1] = (runs[-1][0], j)
        elif prefix in ("B", "I") and label:
            runs.append((j, j))
            kind = label
        else:
            kind = None
    return runs


def merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, without overlaps (the earlier span wins)."""
    kept: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if kept and s < kept[-1][1]:
            continue
        kept.append((s, e))
    return kept


class RealmSentences:
    """(sentence, its salient spans, its source passages) for each sentence of `documents` that has a salient
    span; `sources(sentence)` names the passages a sentence came from."""

    def __init__(self, documents: Iterable[str], sources: Callable[[str], set[int]], seed: int = 0,
                 spans: Spans = heuristic_spans, min_chars: int = 20):
        self.sentences: list[str] = []
        self.spans: list[list[tuple[int, int]]] = []
        self.sources: list[list[int]] = []
        candidates = [s.strip() for doc in documents for s in split_sentences(doc) if len(s.strip()) >= min_chars]
        for sentence, found in zip(candidates, spans(candidates)):
            if found:
                self.sentences.append(sentence)
                self.spans.append(found)
                self.sources.append(sorted(sources(sentence)))
        if not self.sentences:
            raise BertforgeError("the corpus has no sentence with a salient span (a name or a date) to mask")
        self.seed, self.epoch = int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.sentences)

    def __getitem__(self, i: int) -> dict[str, Any]:
        rng = np.random.default_rng([self.seed, self.epoch, int(i)])
        order = rng.permutation(len(self.spans[i])).tolist()  # the first span that survives truncation is masked
        return {"text": self.sentences[i], "spans": [self.spans[i][j] for j in order], "exclude": self.sources[i]}


class RealmCollator:
    """Examples -> the reader's masked sentence (ids, mask, MLM labels: the span's tokens, each replaced by [MASK])
    and the query tower's text (the sentence with the span replaced by that tower's mask token per token)."""

    def __init__(self, tokenizer: Any, query_mask_token: str, max_tokens: int):
        if tokenizer.mask_token_id is None:
            raise BertforgeError("the reader's tokenizer has no mask token")
        self.tok, self.query_mask, self.max_tokens = tokenizer, query_mask_token, max_tokens

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        texts = [e["text"] for e in examples]
        enc = self.tok(texts, max_length=self.max_tokens, padding="longest", truncation=True, return_tensors=None,
                       return_offsets=True)
        ids = torch.tensor(enc["input_ids"], dtype=torch.long)
        labels = torch.full_like(ids, IGNORE)
        queries = []
        for b, e in enumerate(examples):
            offsets = enc["offset_mapping"][b]
            span, positions = None, []
            for candidate in e["spans"]:
                positions = span_tokens(offsets, candidate)
                if positions:
                    span = candidate
                    break
            text = e["text"]
            if span is None:  # every span lies beyond the truncation: nothing to predict for this sentence
                queries.append(text)
                continue
            pos = torch.tensor(positions)
            labels[b, pos] = ids[b, pos]
            ids[b, pos] = self.tok.mask_token_id
            queries.append(text[:span[0]] + " ".join([self.query_mask] * len(positions)) + text[span[1]:])
        return {"input_ids": ids, "attention_mask": torch.tensor(enc["attention_mask"], dtype=torch.long),
                "mlm_labels": labels, "query_texts": queries, "exclude": [list(e["exclude"]) for e in examples]}
