"""Read raw text corpora into documents and sentences.

Inputs: ``.txt`` (documents separated by blank lines, or one per file), ``.jsonl`` (one document per record, field
``text`` or the one named), and tables: ``.csv``, ``.tsv``, ``.parquet``, ``.json`` and datasets' ``save_to_disk``
folders (one document per row, from the text column: the one named, else the first of text, sentence, ... present;
read by `bertforge.io.tables`); every file but Parquet also compressed (``.gz``, ``.bz2``, ``.xz``, ``.zst``), read
as the format under the compression suffix (the suffixes and formats are `bertforge.io.tables`'). Folders are
searched recursively (a ``.json`` file is read only when named: in folders they are mostly metadata), globs expanded. Project Gutenberg headers and
footers are dropped. Bad input never crashes the reader: binary files are skipped, invalid UTF-8 is replaced,
huge lines are read in bounded chunks, and each problem is reported as one ``file:line: ...`` warning through
``logging`` (logger ``bertforge.data``) and ``warnings``; a table without the text column is an error.
"""
from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bertforge.errors import BertforgeError
from bertforge.io.read import (MAX_WARNINGS_PER_FILE, READ_ERRORS, LineReader, compression, open_binary, warn,
                               zstd_module)
from bertforge.io.tables import SUFFIXES as DATA_SUFFIXES
from bertforge.io.tables import file_format, is_saved_dataset, open_table, pick_columns, text_value

# What a folder is searched for: every data file but .json (in folders those are mostly metadata; a .json file is
# read when named), and save_to_disk folders.
SUFFIXES = tuple(s for s in DATA_SUFFIXES if file_format("f" + s) != "json")
MAX_LINE_BYTES = 1 << 20          # longer lines are read (and split) in chunks of this size
MAX_JSONL_LINE_BYTES = 64 << 20   # a jsonl record cannot be chunked (it must parse); bigger ones are skipped
MAX_DOC_CHARS = 8 << 20           # a "document" this long is flushed early, so one huge line cannot fill memory
MAX_SENTENCE_CHARS = 10_000       # sentences are cut at whitespace beyond this (no real sentence is this long)
_SNIFF_BYTES = 8192

_GUTENBERG_START = re.compile(r"^\s*\*{3}\s*START OF (?:THE |THIS )?PROJECT GUTENBERG", re.IGNORECASE)
_GUTENBERG_END = re.compile(r"^\s*(?:\*{3}\s*END OF (?:THE |THIS )?|END OF (?:THE )?)PROJECT GUTENBERG",
                            re.IGNORECASE)
_GUTENBERG_HEADER_LINES = 1000    # the START marker is looked for in this many leading lines (and chars) only
_GUTENBERG_HEADER_CHARS = 1 << 18


@dataclass(frozen=True)
class Document:
    """One document: paragraphs joined by blank lines ("\\n\\n"), lines inside a paragraph joined by spaces."""

    text: str
    source: str
    line: int  # 1-based line of the document's first line in `source`


# ---------------------------------------------------------------------------------------------- file discovery

def _kind(path: Path) -> str:
    """"jsonl", "text" or "table" (csv, tsv, json, parquet, a save_to_disk folder)."""
    if path.is_dir():
        return "table"
    fmt = file_format(path)
    return fmt if fmt in ("jsonl", "text") else "table"


def find_files(paths: Iterable[str | os.PathLike] | str | os.PathLike) -> list[Path]:
    """Expand files, folders (recursive; .txt/.jsonl/.csv/.tsv/.parquet, compressed too, and save_to_disk folders)
    and globs into a sorted, de-duplicated list.

    An explicitly named file is read by its suffix (any other suffix: as text).
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if _saved_dataset(p):
            found.append(p)
        elif p.is_dir():
            inside = _folder_files(p)
            if not inside:
                raise BertforgeError(f"{raw}: no .txt, .jsonl, .csv, .tsv or .parquet (compressed or not) files in "
                                     "this folder, nor save_to_disk folders")
            found += inside
        elif p.is_file():
            found.append(p)
        elif glob.has_magic(str(raw)):
            matches = sorted(Path(m) for m in glob.glob(str(raw), recursive=True))
            matched = [m for m in matches if m.is_file() or _saved_dataset(m)] + [
                f for m in matches if m.is_dir() and not _saved_dataset(m) for f in _folder_files(m)]
            if not matched:
                raise BertforgeError(f"{raw}: no corpus files match this pattern")
            found += matched
        else:
            raise BertforgeError(f"{raw}: no such file or folder")
    for f in found:
        if compression(f) == ".zst":
            zstd_module(f)  # before any file is read
    seen: set[Path] = set()
    unique = []
    for f in found:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def corpus_bytes(path: Path) -> int:
    """The size of a corpus file, or of the files of a saved dataset's folder."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def _saved_dataset(path: Path) -> bool:
    """A folder that save_to_disk wrote for one Dataset (a DatasetDict's folder holds one per split)."""
    return path.is_dir() and is_saved_dataset(path) and (path / "state.json").is_file()


def _folder_files(folder: Path) -> list[Path]:
    """The corpus files under `folder`, and the saved Datasets (folders, read whole) in it."""
    return sorted(f for f in folder.rglob("*")
                  if f.is_file() and f.name.lower().endswith(SUFFIXES) or _saved_dataset(f))


# ---------------------------------------------------------------------------------------------- sniffing

def _sniff(path: Path) -> str | None:
    """Why `path` is not text (None if it looks like text): NUL bytes or mostly undecodable bytes up front."""
    head = b""
    with open_binary(path) as fh:
        try:
            while len(head) < _SNIFF_BYTES:  # read1: a .gz cut short still gives what precedes the cut
                chunk = fh.read1(_SNIFF_BYTES - len(head))
                if not chunk:
                    break
                head += chunk
        except READ_ERRORS:
            if not head:
                raise
    if b"\x00" in head:
        return "binary file (NUL bytes)"
    text = head.decode("utf-8", errors="replace")
    if head and text.count("\ufffd") > 0.3 * len(text):
        return "binary file (not UTF-8 text)"
    return None


# ---------------------------------------------------------------------------------------------- documents

def _read_file(path: Path, doc_boundary: str, strip_gutenberg: bool, max_line_bytes: int,
               text_col: str | None = None) -> Iterator[Document]:
    kind = _kind(path)
    if kind == "table":
        yield from _table_documents(path, text_col)
        return
    with open_binary(path) as fh:
        reader = LineReader(path, fh, MAX_JSONL_LINE_BYTES if kind == "jsonl" else max_line_bytes,
                             chunk_long_lines=kind != "jsonl")
        if kind == "jsonl":
            yield from _jsonl_documents(path, reader, text_col or "text")
            return
        lines: Iterable[tuple[int, str]] = reader
        if strip_gutenberg:
            lines = _strip_gutenberg(path, reader)
        yield from _text_documents(path, lines, doc_boundary)


def _strip_gutenberg(path: Path, lines: Iterable[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """Keep the books' text: drop everything up to a "*** START OF ... PROJECT GUTENBERG" line and from an
    "*** END OF ..." line to the next START line (files often hold several books one after another) or to the end.
    The first START is looked for in the first lines only, so a file without one is buffered briefly and kept
    whole. Warns when more than half of the file's lines are dropped (a sign the markers were misread)."""
    it = iter(lines)
    head: list[tuple[int, str]] = []
    size, found = 0, False
    for item in it:
        head.append(item)
        size += len(item[1])
        if _GUTENBERG_START.match(item[1]):
            found = True
            break
        if len(head) >= _GUTENBERG_HEADER_LINES or size > _GUTENBERG_HEADER_CHARS:
            break
    dropped = len({no for no, _ in head}) if found else 0  # lines, not pieces of chunked long lines
    last = last_dropped = head[-1][0] if found else 0
    in_book = True
    for no, line in (it if found else _chain(head, it)):
        last = no
        if in_book and not _GUTENBERG_START.match(line):  # (a START inside a book: the previous one had no END)
            if not _GUTENBERG_END.match(line):
                yield no, line
                continue
            in_book = False
        else:  # a footer, then the next book's header: skipped up to (and with) its START line
            in_book = bool(_GUTENBERG_START.match(line))
        dropped, last_dropped = dropped + (no != last_dropped), no
    if last and 2 * dropped > last:
        warn(f"{path}: {dropped:,} of {last:,} lines ({dropped / last:.0%}) dropped as Project Gutenberg headers "
             "and footers")


def _chain(first: list, rest: Iterator) -> Iterator:
    yield from first
    yield from rest


def _text_documents(path: Path, lines: Iterable[tuple[int, str]], doc_boundary: str) -> Iterator[Document]:
    paragraphs: list[str] = []   # finished paragraphs of the current document
    para: list[str] = []         # lines of the current paragraph
    size, start = 0, 0
    for lineno, line in lines:
        if lineno == 1:
            line = line.lstrip("\ufeff")  # byte-order mark
        line = line.strip()
        if not line:
            if para:
                paragraphs.append(" ".join(para))
                para = []
                if doc_boundary == "blank":
                    yield Document(paragraphs[0], str(path), start)
                    paragraphs, size = [], 0
            continue
        if not para and not paragraphs:
            start = lineno
        para.append(line)
        size += len(line) + 1
        if size > MAX_DOC_CHARS:  # bound memory: flush an enormous "document" in pieces
            paragraphs.append(" ".join(para))
            yield Document("\n\n".join(paragraphs), str(path), start)
            paragraphs, para, size = [], [], 0
    if para:
        paragraphs.append(" ".join(para))
    if paragraphs:
        yield Document("\n\n".join(paragraphs), str(path), start)


def _table_documents(path: Path, text_col: str | None) -> Iterator[Document]:
    """One document per row of a table, from its text column (a missing column is an error: the corpus is
    misnamed, not damaged)."""
    table = open_table(path)
    column = pick_columns(table, text_col, want_pair=False, want_label=False).text
    for n, row in enumerate(table, 1):
        text = text_value(row, column).strip()
        if text:
            yield Document(text, str(path), n)


def _jsonl_documents(path: Path, lines: Iterable[tuple[int, str]], field: str) -> Iterator[Document]:
    bad = 0
    for lineno, line in lines:
        if not line.strip():
            continue
        problem = None
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            record, problem = None, f"invalid JSON ({err.msg})"
        if problem is None:
            if not isinstance(record, dict) or field not in record:
                problem = f"record has no {field!r} field"
            elif not isinstance(record[field], str):
                problem = f"field {field!r} is not a string"
        if problem:
            bad += 1
            if bad <= MAX_WARNINGS_PER_FILE:
                warn(f"{path}:{lineno}: {problem}; record skipped")
            continue
        text = record[field].strip()
        if text:
            yield Document(text, str(path), lineno)


def iter_documents(paths: Iterable[str | os.PathLike] | str | os.PathLike, doc_boundary: str = "blank",
                   strip_gutenberg: bool = True, max_line_bytes: int = MAX_LINE_BYTES,
                   text_col: str | None = None) -> Iterator[Document]:
    """Stream the documents of a corpus.

    doc_boundary: "blank" (a blank line ends a document: one paragraph each) or "file" (one document per
    text file, paragraphs kept). jsonl files and tables always give one document per record (row), from the field
    `text_col` (jsonl default: "text"; tables: the first of text, sentence, ... present).
    Raises BertforgeError (after reading everything) when no file held any usable text.
    """
    if doc_boundary not in ("blank", "file"):
        raise BertforgeError(f"doc_boundary must be 'blank' or 'file', not {doc_boundary!r}")
    names = [str(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
    files = find_files(names)
    if not files:
        where = ", ".join(names) if names else "(no paths given)"
        raise BertforgeError(f"no corpus files (.txt, .jsonl, .csv, .tsv, .parquet; compressed too) in {where}")
    total = 0
    for path in files:
        n = 0
        try:
            if path.is_file() and path.stat().st_size == 0:
                warn(f"{path}:0: empty file skipped")
                continue
            why = _sniff(path) if _kind(path) != "table" else None
            if why:
                warn(f"{path}:1: {why}; skipped")
                continue
            for doc in _read_file(path, doc_boundary, strip_gutenberg, max_line_bytes, text_col):
                n += 1
                yield doc
        except READ_ERRORS as err:  # unreadable from the start (damage later on is LineReader's to report)
            warn(f"{path}:0: cannot read ({err}); {'rest of ' if n else ''}file skipped")
        else:
            if n == 0:
                warn(f"{path}:0: no text (empty after stripping)")
        total += n
    if total == 0:
        raise BertforgeError(f"no usable text in {len(files)} corpus file(s) (first: {files[0]})")


def iter_texts(paths: Iterable[str | os.PathLike] | str | os.PathLike, doc_boundary: str = "blank",
               text_col: str | None = None) -> Iterator[str]:
    """The text of each document of a corpus, read as `iter_documents` reads it (what a tokenizer trains on)."""
    for doc in iter_documents(paths, doc_boundary=doc_boundary, text_col=text_col):
        yield doc.text


# ---------------------------------------------------------------------------------------------- sentences

# Titles, initials-like and Latin abbreviations that end in "." without ending a sentence.
ABBREVIATIONS = frozenset("""
mr mrs ms messrs mme mlle dr prof rev hon sr jr st mt ft gen col lt capt cmdr sgt maj adm gov sen rep pres
vs etc e.g i.e cf al viz ca approx dept inc ltd co corp bros no nos vol vols fig figs pp op ch sec ed eds
jan feb mar apr jun jul aug sep sept oct nov dec mon tue wed thu fri sat sun u.s u.k a.m p.m
""".split())
_BOUNDARY = re.compile(r"[.!?]+[\"'”’)\]]*\s+(?=[\"'“‘(\[A-ZÀ-ÖØ-Þ])")
_PARAGRAPH = re.compile(r"\n\s*\n")


def split_sentences(text: str, max_chars: int = MAX_SENTENCE_CHARS, keep_space: bool = False) -> list[str]:
    """Split text into sentences: at ., ! or ? (plus closing quotes/brackets) followed by whitespace and a capital
    or an opening quote, except after a known abbreviation or a single-letter initial. Paragraph breaks (blank
    lines) always end a sentence; single newlines are spaces. Sentences longer than `max_chars` are cut at
    whitespace so that one pathological "sentence" stays bounded. `keep_space`: every sentence but the first keeps
    the space ("\n\n" after a paragraph break) before it, so that the sentences joined are the text again (what a
    left-to-right LM reads; byte-level BPE encodes the space)."""
    out: list[str] = []
    for para in _PARAGRAPH.split(text):
        para = " ".join(para.split()) if "\n" in para or "\t" in para or "  " in para else para.strip()
        if not para:
            continue
        sents: list[str] = []
        start = 0
        for m in _BOUNDARY.finditer(para):
            end = m.start()
            if para[end] == "." and m.group().count(".") == 1 and _is_abbreviation(para, end):
                continue
            sents.extend(_bounded(para[start:m.end()].rstrip(), max_chars))
            start = m.end()
        sents.extend(_bounded(para[start:].rstrip(), max_chars))
        sents = [s for s in sents if s]
        if keep_space and sents:
            sents = [("\n\n" if out else "") + sents[0]] + [" " + s for s in sents[1:]]
        out.extend(sents)
    return out


def _is_abbreviation(text: str, dot: int) -> bool:
    word_start = text.rfind(" ", max(0, dot - 24), dot) + 1
    word = text[word_start:dot].lstrip("\"'“‘([")
    if len(word) == 1 and word.isalpha():  # an initial: "J. R. R. Tolkien"
        return True
    return word.lower() in ABBREVIATIONS


def _bounded(sentence: str, max_chars: int) -> list[str]:
    if len(sentence) <= max_chars:
        return [sentence]
    pieces = []
    while len(sentence) > max_chars:
        cut = sentence.rfind(" ", max_chars // 2, max_chars)
        cut = cut if cut > 0 else max_chars
        pieces.append(sentence[:cut].strip())
        sentence = sentence[cut:].strip()
    pieces.append(sentence)
    return pieces
