"""Open-domain QA scored as the papers score it (DrQA, ORQA, DPR, RAG): does a retrieved passage hold an answer, the
top-k retrieval accuracy over a ranking, and a reader's exact match / F1 against the gold answers.

`has_answer` follows DPR's `has_answer` (dpr/data/qa_validation.py):
- "string": the passage and each answer are Unicode-NFD-normalised, split by DrQA's SimpleTokenizer (runs of
  letters / numbers / marks, or any other single non-space, non-control character) and lowercased; the passage
  holds the answer when the answer's tokens appear contiguously among the passage's tokens. Token boundaries
  matter: "cat" is not in "concatenate"; punctuation is a token of its own ("U.S." is u . s .).
- "regex" (CuratedTREC): each answer is a pattern, searched (`re.search`, IGNORECASE | UNICODE | MULTILINE) in the
  NFD-normalised passage; a pattern that does not compile matches nothing (warned once per pattern).

Where this differs from DPR, on purpose, so that no question is scored by accident:
- an answer with no tokens (only spaces or control characters) would match every passage in DPR (the empty
  sequence is in every list); here it is skipped, and so is a pattern that is empty, does not compile, or matches
  the empty text (it too would match every passage);
- a question left with no scoreable answer is not counted as a miss: it is left out of every denominator and
  reported by id (`unscoreable`).

Top-k accuracy counts positions, as DPR does: the k hits the retriever returned, in order, duplicates included (a
passage text returned twice takes two of the k slots; a retriever that returns duplicates is penalised by them).

A reader's answer is scored with SQuAD's normalisation (`tasks.metrics.normalize_answer`: lowercase, no
punctuation, no articles, one space), max over the gold answers: exact match as DPR's `exact_match_score`, token F1
as SQuAD v1.1's. Gold answers that normalise to nothing ("the", ".") are skipped. Against regex answers exact match
is DrQA's `regex_match_score` (the pattern `match`es the NFD-normalised prediction from its start) and F1 is not
defined (None). Scores are percentages, as the papers print them.
"""
from __future__ import annotations

import functools
import re
import sys
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bertforge.errors import BertforgeError
from bertforge.io.read import warn
from bertforge.tasks.metrics import exact_match, normalize_answer, token_f1

STRING, REGEX = "string", "regex"
MATCHES = (STRING, REGEX)
DEFAULT_KS = (1, 5, 20, 100)
_REGEX_FLAGS = re.IGNORECASE | re.UNICODE | re.MULTILINE


def nfd(text: str) -> str:
    return unicodedata.normalize("NFD", text)


def _class(ranges: list[tuple[int, int]]) -> str:
    return "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges)


def _ranges(keep) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for cp in range(sys.maxunicode + 1):
        if keep(unicodedata.category(chr(cp))):
            if out and out[-1][1] == cp - 1:
                out[-1] = (out[-1][0], cp)
            else:
                out.append((cp, cp))
    return out


@functools.cache
def _tokenizer() -> re.Pattern:
    """DrQA's SimpleTokenizer, `([\\p{L}\\p{N}\\p{M}]+)|([^\\p{Z}\\p{C}])`, in the standard library's `re`: the
    Unicode property classes are spelt out from `unicodedata` once (a fraction of a second, then cached)."""
    word = _class(_ranges(lambda c: c[0] in "LNM"))
    other = _class(_ranges(lambda c: c[0] in "ZC"))
    return re.compile(f"[{word}]+|[^{other}]")


def simple_tokens(text: str) -> list[str]:
    """The lowercased SimpleTokenizer tokens of NFD-normalised `text` (DPR's `words(uncased=True)`)."""
    return [t.lower() for t in _tokenizer().findall(nfd(text))]


@dataclass(frozen=True)
class Answers:
    """A question's gold answers prepared for matching: token tuples ("string") or compiled patterns ("regex");
    `skipped` holds the answers that cannot be scored (see the module's rules)."""

    match: str
    tokens: tuple[tuple[str, ...], ...] = ()
    patterns: tuple[re.Pattern, ...] = ()
    skipped: tuple[str, ...] = ()

    @property
    def scoreable(self) -> bool:
        return bool(self.tokens or self.patterns)


_BAD_PATTERNS: set[str] = set()


def compile_answer_pattern(pattern: str) -> re.Pattern | None:
    """The compiled pattern, or None when it does not compile (warned once per pattern) or matches the empty text
    (it would match every passage)."""
    try:
        compiled = re.compile(nfd(pattern), _REGEX_FLAGS)
    except (re.error, RecursionError, OverflowError) as err:
        if pattern not in _BAD_PATTERNS:
            _BAD_PATTERNS.add(pattern)
            warn(f"answer pattern {pattern!r} does not compile ({err}); it matches nothing")
        return None
    return None if compiled.search("") is not None else compiled


def prepare_answers(answers: Iterable[str], match: str = STRING) -> Answers:
    """Tokenise (or compile) `answers` once, for `has_answer` over many passages."""
    if match not in MATCHES:
        raise BertforgeError(f"match must be one of {', '.join(MATCHES)}, not {match!r}")
    tokens, patterns, skipped = [], [], []
    for answer in [answers] if isinstance(answers, str) else answers:
        if match == STRING:
            toks = tuple(simple_tokens(answer))
            (tokens.append(toks) if toks else skipped.append(answer))
        else:
            compiled = compile_answer_pattern(answer)
            (patterns.append(compiled) if compiled is not None else skipped.append(answer))
    return Answers(match, tuple(dict.fromkeys(tokens)), tuple(patterns), tuple(skipped))


def _contains(words: list[str], answer: tuple[str, ...]) -> bool:
    """Whether `answer` is a contiguous run of `words`; jumps between occurrences of its first token with
    list.index (C speed: a benchmark checks a hundred passages per question)."""
    n, first, i = len(answer), answer[0], -1
    want = list(answer)
    while True:
        try:
            i = words.index(first, i + 1)
        except ValueError:
            return False
        if words[i:i + n] == want:
            return True


def has_answer(answers: Answers | Iterable[str], text: str, match: str = STRING,
               tokens: Sequence[str] | None = None) -> bool:
    """Whether passage `text` holds one of `answers` (raw strings, or `prepare_answers`'s result) under DPR's rule
    `match` ("string" or "regex"). `tokens`: the passage's `simple_tokens`, when the caller has them already."""
    if isinstance(answers, str):  # one answer, not its characters
        answers = [answers]
    prepared = answers if isinstance(answers, Answers) else prepare_answers(answers, match)
    if prepared.match == REGEX:
        normal = nfd(text)
        return any(p.search(normal) is not None for p in prepared.patterns)
    if not prepared.tokens:
        return False
    words = simple_tokens(text) if tokens is None else list(tokens)
    return any(_contains(words, answer) for answer in prepared.tokens)


def first_hit(flags: Sequence[bool]) -> int | None:
    """The 0-based position of the first passage that holds an answer, None when none does."""
    return next((i for i, hit in enumerate(flags) if hit), None)


def top_k_accuracy(first_hits: Sequence[int | None], ks: Sequence[int]) -> dict[int, float]:
    """Per k, the percentage of questions whose first answer-holding passage is among their top k (`first_hits`:
    `first_hit` per scored question)."""
    if not first_hits:
        raise BertforgeError("no scoreable question to compute top-k accuracy over")
    n = len(first_hits)
    return {k: 100.0 * sum(h is not None and h < k for h in first_hits) / n for k in ks}


def parse_ks(ks: Sequence[int] | str) -> tuple[int, ...]:
    """The k's to report, sorted, from a sequence or "1,5,20,100"; each must be a positive integer."""
    if isinstance(ks, str):
        try:
            ks = [int(p) for p in ks.split(",") if p.strip()]
        except ValueError:
            raise BertforgeError(f"top_k: expected positive integers separated by commas, got {ks!r}") from None
    out = sorted({int(k) for k in ks})
    if not out or out[0] <= 0 or any(isinstance(k, bool) for k in ks):
        raise BertforgeError(f"top_k: expected one or more positive integers, got {list(ks)!r}")
    return tuple(out)


def answer_scores(prediction: str, answers: Sequence[str], match: str = STRING) -> tuple[float, float | None] | None:
    """(exact match, F1), each 0..1 and the max over the gold answers, of a reader's `prediction`; F1 is None for
    regex answers; None when no gold answer is scoreable (every one normalises to nothing, or no pattern compiles)."""
    if match == REGEX:
        patterns = [p for p in (compile_answer_pattern(a) for a in answers) if p is not None]
        if not patterns:
            return None
        guess = nfd(prediction)
        return float(any(p.match(guess) is not None for p in patterns)), None
    golds = [g for g in answers if normalize_answer(g)]
    if not golds:
        return None
    return (max(exact_match(prediction, g) for g in golds),
            max(token_f1(prediction, g, empty_is_answer=False) for g in golds))
