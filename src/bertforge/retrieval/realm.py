"""REALM (Guu et al. 2020): masked-language-model pre-training with a latent retrieved document.

    p(y | x) = sum_{z in top k} p(z | x) p(y | z, x)
    p(z | x) = softmax_z  Embed_query(x) . Embed_doc(z)       (low-dimensional projections of [CLS], 128 in the paper)
    p(y | z, x) = prod_j p(y_j | z, x)                       (the MLM head on [CLS] x [SEP] z [SEP], masked positions j)

The loss -log p(y|x) trains the reader (the knowledge-augmented encoder) and, through p(z|x), both retriever
towers: the top k come from a stale index, but their vectors are recomputed inside the step by the current document
encoder, so the gradient reaches it. Three of the paper's choices are part of the batch here:
- a null document (an empty passage) is always a candidate, so a sentence that needs no knowledge is not forced
  to read one;
- the document a sentence came from is never retrieved (it would teach copying, not retrieval);
- salient span masking: a named entity or a date is masked whole (`salient_spans`), since those need knowledge.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from bertforge.errors import BertforgeError

NULL_DOCUMENT = ""  # the null document's text: the reader sees [CLS] x [SEP] [SEP]

_MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|December|"
           "Jan\\.|Feb\\.|Mar\\.|Apr\\.|Jun\\.|Jul\\.|Aug\\.|Sep\\.|Sept\\.|Oct\\.|Nov\\.|Dec\\.")
# dates: "4 July 1776", "July 4, 1776", "July 1776", "1776", "1990s", "the 19th century"
_DATE = re.compile(
    rf"\b(?:\d{{1,2}}\s+(?:{_MONTHS})(?:,?\s+\d{{3,4}})?|(?:{_MONTHS})\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{3,4}})?"
    rf"|(?:{_MONTHS})\s+\d{{4}}|1\d{{3}}s?|20\d{{2}}s?|\d{{1,2}}(?:st|nd|rd|th)\s+century)\b")
DATE = _DATE  # also what joins an NER model's entities (retrieval.realm_data.ner_spans)
# a run of capitalised words (joined by "of", "the", "de", ... inside it), or an acronym: a named-entity heuristic
_CAPITALISED = re.compile(r"\b(?:[A-Z][\w'’-]*[\w])(?:\s+(?:(?:of|the|de|la|von|van|and|for|upon)\s+)*[A-Z][\w'’-]*\w)*\b")
_SENTENCE_START = re.compile(r"(?:^|[.!?]\s+|[\"“(]\s*)$")
# capitalised words that start sentences without naming anything
_COMMON = frozenset("""A An The This That These Those It Its He She They We I You His Her Their Our My Your There
Here When Where What Which Who Why How In On At By For From With As But And Or If Then So Yet After Before While
Although Though Because Since During Mr Mrs Ms Dr St""".split())


def salient_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the salient entities and dates in `text`, in order, not overlapping: the heuristic
    REALM's masking falls back on when no NER model is given. Dates (day month year, month year, years, decades,
    centuries) and runs of capitalised words; a single capitalised word at a sentence start counts only if it is
    not a common sentence opener ("The", "In", "He", ...), and never when it is alone and the sentence's first
    word (it may be capitalised only for its position)."""
    spans: list[tuple[int, int]] = [(m.start(), m.end()) for m in _DATE.finditer(text)]
    for m in _CAPITALISED.finditer(text):
        start, end, words = m.start(), m.end(), m.group().split()
        while words and words[0] in _COMMON:  # "The Beatles" -> "Beatles"; "In Paris" -> "Paris"
            start = text.index(words[1], start + len(words[0])) if len(words) > 1 else end
            words = words[1:]
        if not words:
            continue
        at_start = bool(_SENTENCE_START.search(text[:start]))
        if at_start and len(words) == 1:
            continue
        spans.append((start, end))
    spans.sort()
    kept: list[tuple[int, int]] = []
    for s, e in spans:  # the earlier (a date before a name inside it) wins; overlaps are dropped
        if kept and s < kept[-1][1]:
            if e > kept[-1][1] and s == kept[-1][0]:
                kept[-1] = (s, e)
            continue
        kept.append((s, e))
    return kept


def span_tokens(offsets: Sequence[tuple[int, int]], span: tuple[int, int]) -> list[int]:
    """The token positions whose characters (offsets, as a fast tokenizer reports them; (0, 0) for specials) lie
    in the character span."""
    s, e = span
    return [i for i, (a, b) in enumerate(offsets) if b > a and a < e and b > s]


def marginal_mlm_loss(token_logprobs: torch.Tensor, doc_scores: torch.Tensor,
                      reduction: str = "mean") -> torch.Tensor:
    """-log sum_z p(z|x) p(y|z,x). `token_logprobs` [B, k, M]: log p(y_j | z, x) of each masked target j (0 where
    a row has fewer than M targets); `doc_scores` [B, k]: the retrieval scores (inner products) of the k candidates.
    """
    if token_logprobs.dim() != 3 or doc_scores.shape != token_logprobs.shape[:2]:
        raise BertforgeError(f"marginal_mlm_loss: token_logprobs [B, k, M] and doc_scores [B, k] must agree "
                             f"(got {list(token_logprobs.shape)} and {list(doc_scores.shape)})")
    joint = F.log_softmax(doc_scores.float(), dim=1) + token_logprobs.float().sum(-1)
    nll = -torch.logsumexp(joint, dim=1)
    return nll.mean() if reduction == "mean" else nll


def masked_token_logprobs(logits: torch.Tensor, labels: torch.Tensor, k: int) -> torch.Tensor:
    """[B*k, T, V] reader logits and [B, T] labels (-100 where not masked; the same for each of a sentence's k
    readings, which share its position in the joined input) -> [B, k, M] log-probabilities of the masked targets,
    M the most targets any sentence has, 0 beyond a sentence's own."""
    B, T = labels.shape
    if logits.shape[0] != B * k or logits.shape[1] != T:
        raise BertforgeError(f"reader logits {list(logits.shape[:2])} do not match {B} sentences x {k} documents "
                             f"x {T} positions")
    masked = labels.ne(-100)
    M = max(int(masked.sum(1).max()), 1)
    order = torch.argsort((~masked).to(torch.int8), dim=1, stable=True)[:, :M]  # masked positions first
    valid = masked.gather(1, order)                                              # [B, M]
    target = labels.gather(1, order).clamp(min=0)
    V = logits.shape[-1]
    # only the masked positions are normalised (the vocabulary is most of the cost)
    at = logits.view(B, k, T, V).gather(2, order[:, None, :, None].expand(B, k, M, V))
    logprobs = F.log_softmax(at.float(), dim=-1)                                  # [B, k, M, V]
    picked = logprobs.gather(-1, target[:, None, :, None].expand(B, k, M, 1)).squeeze(-1)
    return picked * valid[:, None, :]
