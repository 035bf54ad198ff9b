"""CoNLL-2003 style tagging files (one ``token ... tag`` line per word) and the IOB1/IOB2 tag schemes.

Standard library only; malformed input raises ``BertforgeError("<file>:<line>: <what>")``.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bertforge.errors import BertforgeError
from bertforge.io.read import require_file, text_lines
from bertforge.io.read import where as _where
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


def read_conll(path: str | Path, tag_col: int | None = -1, scheme: str = "auto") -> list[TaggingExample]:
    """CoNLL-2003 style: one ``token POS chunk NER`` line per word (whitespace separated), a blank line between
    sentences, ``-DOCSTART-`` lines skipped. ``tag_col`` picks the tag column (default -1, the last: NER; 1
    POS, 2 chunk; None for an untagged token-per-line file). ``scheme``: "auto" converts to IOB2 when IOB1 is
    detected, "iob1" always converts, "iob2" keeps the tags as they are."""
    if scheme not in ("auto", "iob1", "iob2"):
        raise BertforgeError(f"unknown tag scheme {scheme!r} (use auto, iob1 or iob2)")
    p = require_file(path)
    sents: list[TaggingExample] = []
    tokens: list[str] = []
    tags: list[str] = []
    width = None

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
    flush()
    if tag_col is not None and scheme != "iob2":
        if scheme == "iob1" or detect_tag_scheme([s.tags for s in sents]) == "iob1":
            for s in sents:
                s.tags = iob1_to_iob2(s.tags)
    return sents


def tag_list(examples: Sequence[TaggingExample]) -> list[str]:
    """All tags seen, "O" first, then sorted by entity type and B before I (stable ids across runs)."""
    tags = {t for ex in examples for t in ex.tags}
    rest = sorted(tags - {"O"}, key=lambda t: (t[2:], t[:2]))
    return ["O", *rest]
