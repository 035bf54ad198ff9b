"""CoNLL-2003 style tagging files (one ``token ... tag`` line per word) and the IOB1/IOB2 tag schemes.

Standard library only; malformed input raises ``BertforgeError("<file>:<line>: <what>")``.
"""
from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io.read import require_file, text_lines, warn
from bertforge.io.read import where as _where
from bertforge.io.tables import open_table, value
from bertforge.tasks.examples import TaggingExample


def detect_tag_scheme(tag_seqs: Sequence[Sequence[str]]) -> str:
    """"iob1" when some ``I-X`` begins a chunk (follows O or another type), else "iob2"."""
    for tags in tag_seqs:
        prev = "O"
        for t in tags:
            if t.startswith("I-") and prev[2:] != t[2:]:
                return "iob1"
            prev = t
    return "iob2"


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """IOB1 (B- only between adjacent same-type chunks) to IOB2 (every chunk starts with B-)."""
    out = []
    prev = "O"
    for t in tags:
        if t.startswith("I-") and prev[2:] != t[2:]:
            t = "B-" + t[2:]
        out.append(t)
        prev = t
    return out


# CoNLL-2003's entity types (Tjong Kim Sang & De Meulder 2003): `--task conll` holds a file to them (plus --labels)
CONLL2003_TYPES = ("LOC", "MISC", "ORG", "PER")


def read_conll(path: str | Path, tag_col: int | None = -1, scheme: str = "auto",
               types: Collection[str] | None = None) -> list[TaggingExample]:
    """CoNLL-2003 style: one ``token POS chunk NER`` line per word (whitespace separated), a blank line between
    sentences, ``-DOCSTART-`` lines skipped. ``tag_col`` picks the tag column (default -1, the last: NER; 1
    POS, 2 chunk; None for an untagged token-per-line file). ``scheme``: "auto" converts to IOB2 when IOB1 is
    detected, "iob1" always converts, "iob2" keeps the tags as they are. ``types``: the entity types the file may
    use (None: any); another is refused at its first file:line."""
    if scheme not in ("auto", "iob1", "iob2"):
        raise BertforgeError(f"unknown tag scheme {scheme!r} (use auto, iob1 or iob2)")
    p = require_file(path)
    sents: list[TaggingExample] = []
    tokens: list[str] = []
    tags: list[str] = []
    width = None
    first_seen: dict[str, str] = {}  # each tag's first file:line, for the checks after reading

    def flush() -> None:
        if tokens:
            sents.append(TaggingExample(list(tokens), list(tags), guid=f"{p.stem}-{len(sents)}"))
            tokens.clear()
            tags.clear()

    for n, line in text_lines(p, skip_blank=False):
        parts = line.split()
        if not parts:
            flush()
            continue
        if parts[0] == "-DOCSTART-":
            flush()
            continue
        if width is None:
            width = len(parts)
        if len(parts) != width:
            raise BertforgeError(f"{_where(p, n)}: expected {width} columns, found {len(parts)}")
        if tag_col is None:
            tokens.append(parts[0])
            continue
        if width < 2 or not -width <= tag_col < width or tag_col in (0, -width):
            raise BertforgeError(f"{_where(p, n)}: no tag column {tag_col} in a line of {width} columns")
        tokens.append(parts[0])
        tags.append(parts[tag_col])
        if parts[tag_col] not in first_seen:
            first_seen[parts[tag_col]] = _where(p, n)
    flush()
    if tag_col is not None:
        check_tags(sents, first_seen, types)
        convert_scheme(sents, scheme)
    return sents


def convert_scheme(sents: Sequence[TaggingExample], scheme: str) -> None:
    """IOB1 tags to IOB2 in place: always for "iob1", when detected for "auto", never for "iob2"."""
    if scheme != "iob2" and (scheme == "iob1" or detect_tag_scheme([s.tags for s in sents]) == "iob1"):
        for s in sents:
            s.tags = iob1_to_iob2(s.tags)


def read_tagged_table(source: Any, tokens_col: Any = None, tags_col: Any = None, scheme: str = "auto",
                      types: Collection[str] | None = None) -> list[TaggingExample]:
    """Tagged sentences from a table (JSONL, JSON, Parquet, a saved or hub dataset, data in memory): a column of
    word lists ("tokens", else "words") and one of tag lists ("tags", else "ner_tags"); integer tags are named by
    the dataset's class labels (the Hub's conll2003). Checked and converted as `read_conll` does."""
    table = open_table(source)
    tokens_col = tokens_col or next((c for c in ("tokens", "words") if table.has(c)), "tokens")
    tags_col = tags_col or next((c for c in ("tags", "ner_tags") if table.has(c)), "tags")
    table.require(tokens_col, "tokens")
    table.require(tags_col, "tags")
    names = table.class_names.get(tags_col)
    sents: list[TaggingExample] = []
    first_seen: dict[str, str] = {}
    for row in table:
        tokens, tags = value(row, tokens_col), value(row, tags_col)
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) and t.strip() for t in tokens):
            raise BertforgeError(f"{row.where}: {tokens_col!r} must be a non-empty list of words")
        if not isinstance(tags, list) or len(tags) != len(tokens):
            raise BertforgeError(f"{row.where}: {tags_col!r} must be a list of one tag per word ({len(tokens)})")
        if names is not None and all(isinstance(t, int) and 0 <= t < len(names) for t in tags):
            tags = [names[t] for t in tags]
        if not all(isinstance(t, str) and t for t in tags):
            raise BertforgeError(f"{row.where}: {tags_col!r} must hold tag names (strings)")
        for t in tags:
            first_seen.setdefault(t, row.where)
        sents.append(TaggingExample(list(tokens), list(tags), guid=f"{table.stem}-{len(sents)}"))
    check_tags(sents, first_seen, types)
    convert_scheme(sents, scheme)
    return sents


_IOB_TAG = re.compile(r"^(O|[BIES]-\S+)$")
RARE_TYPE_MIN_ENTITIES = 50  # below this many entities in a file, a type seen once is no evidence of a typo


def check_tags(sents: Sequence[TaggingExample], first_seen: dict[str, str],
               types: Collection[str] | None = None) -> None:
    """In an IOB-tagged file (some tag starts with B- or I-): a tag that is no IOB tag is refused with where it is
    first seen (it would train a label of its own), and so is an entity type outside `types` when the task has a
    set of them (conll's, widened by --labels); an entity type seen once among many entities is warned about
    once, naming it (a typo such as B-PSR trains an extra label, but rare types exist, so it is not refused).
    `first_seen`: each tag's first place ("file:line"), in reading order."""
    if not any(t.startswith(("B-", "I-")) for t in first_seen):
        return  # POS or chunk tags, or an untagged file: no scheme to hold them to
    for tag, at in first_seen.items():
        if not _IOB_TAG.match(tag):
            raise BertforgeError(f"{at}: tag {tag!r} is not an IOB tag (O, B-TYPE or I-TYPE)")
        if types is not None and tag != "O" and tag[2:] not in types:
            raise BertforgeError(f"{at}: entity type {tag[2:]!r} ({tag}) is not one of the task's "
                                 f"({', '.join(sorted(types))}); a typo? A type of its own: pass --labels {tag[2:]}")
    chunks: dict[str, int] = {}
    for s in sents:
        prev = "O"
        for t in s.tags:
            if t != "O" and (not t.startswith("I-") or prev[2:] != t[2:]):
                chunks[t[2:]] = chunks.get(t[2:], 0) + 1
            prev = t
    total = sum(chunks.values())
    if total >= RARE_TYPE_MIN_ENTITIES:
        for kind, count in chunks.items():
            if count == 1:
                order = list(first_seen)
                tag = min((t for t in first_seen if t[2:] == kind), key=order.index)
                warn(f"{first_seen[tag]}: entity type {kind!r} ({tag}) occurs once among {total} "
                     "entities; a typo? It becomes a label of its own")


def warn_long_sentences(sents: Sequence[TaggingExample], path: Path, max_len: int) -> None:
    """One warning when sentences have more words than `max_len` sub-tokens can hold: the words past it are cut
    (no training signal, predicted O). A file without blank lines is one such "sentence" per document."""
    room = max_len - 2  # [CLS] and [SEP]; every word is at least one sub-token
    long = [len(s.tokens) for s in sents if len(s.tokens) > room]
    if long:
        hint = "; is a blank line missing between sentences?" if max(long) > 4 * room else ""
        warn(f"{path}: {len(long)} sentence(s) have more words than --max-seq-len {max_len} holds (the longest "
             f"{max(long)}): at least {sum(n - room for n in long)} words are cut off{hint}")


def tag_list(examples: Sequence[TaggingExample]) -> list[str]:
    """All tags seen, "O" first, then sorted by entity type and B before I (stable ids across runs)."""
    tags = {t for ex in examples for t in ex.tags}
    rest = sorted(tags - {"O"}, key=lambda t: (t[2:], t[:2]))
    return ["O", *rest]
