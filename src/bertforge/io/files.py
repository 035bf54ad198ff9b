"""Files as tables, by their suffix under any compression suffix (`data.csv.gz` is CSV): lines of text, TSV
(GLUE's: quotes are text), CSV (the csv module's quoting), JSON Lines, JSON (a list of objects, or {"data": [...]};
JSON Lines in a .json file are read as such), Parquet. A name given twice (a CSV or Parquet header, a key of one
JSON object) is refused at its line or row: a reader would keep one of them silently."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io.read import (COMPRESSIONS, DuplicateKey, compression, csv_rows, jsonl_rows, read_json,
                               require_file, text_lines, tsv_rows, uncompressed_name, where)
from bertforge.io.rows import Row, Table, first_line, import_extra, refuse_twice

# Every suffix comes plain and under each compression suffix (.gz, .bz2, .xz, .zst), except Parquet: it compresses
# its own pages, and its reader needs to seek.
_PLAIN_TABLES = (".tsv", ".csv", ".jsonl", ".json")
TEXT_SUFFIXES = (".txt",) + tuple(".txt" + c for c in COMPRESSIONS)
TABLE_SUFFIXES = _PLAIN_TABLES + tuple(s + c for s in _PLAIN_TABLES for c in COMPRESSIONS) + (".parquet",)
SUFFIXES = TEXT_SUFFIXES + TABLE_SUFFIXES


def file_format(path: str | Path) -> str:
    """"text", "tsv", "csv", "jsonl", "json" or "parquet", from the file's suffix under any compression suffix
    (unknown suffixes are text)."""
    name = uncompressed_name(path)
    for suffix in (*_PLAIN_TABLES, ".parquet"):
        if name.endswith(suffix):
            return suffix[1:]
    return "text"


def file_table(path: Path, header: bool, stream: bool = False) -> Table:
    """The table of one file; `stream`: JSON Lines read again on each pass, never held (see tables.open_table)."""
    p = require_file(path)
    fmt = file_format(p)
    if fmt == "text":
        return Table(str(p), lambda: (Row(where(p, n), {"text": line}) for n, line in text_lines(p, skip_blank=False)),
                     ["text"], plain=True, stem=_stem(p))
    if fmt in ("tsv", "csv"):
        return _delimited_table(p, fmt, header)
    if fmt == "jsonl" or (fmt == "json" and stream and _is_json_lines(p)):
        if stream:
            return Table(str(p), lambda: (Row(where(p, n), obj) for n, obj in jsonl_rows(p)), records=True,
                         stem=_stem(p))
        rows = [Row(where(p, n), obj) for n, obj in jsonl_rows(p)]
        return Table(str(p), lambda: rows, records=True, stem=_stem(p))
    if fmt == "json":
        return _json_table(p)
    if compression(p):
        raise BertforgeError(f"{p}: a compressed Parquet file; decompress it (Parquet compresses its own pages)")
    return _parquet_table(p)


def _stem(p: Path) -> str:
    """A file's name without its suffixes (dev.csv.gz: dev), for ids."""
    return Path(uncompressed_name(p)).stem if compression(p) else p.stem


def _delimited_table(p: Path, fmt: str, header: bool) -> Table:
    """CSV (quoted fields) or TSV (GLUE's: quotes are text); the first record is the header unless not `header`."""
    def records() -> Iterator[tuple[int, list[str]]]:
        return tsv_rows(p) if fmt == "tsv" else csv_rows(p, ",")

    first = next(records(), None)
    if first is None:
        return Table(str(p), lambda: [], [], header_line=1 if header else None, stem=_stem(p))
    if not header:
        width = len(first[1])
        names: list = list(range(width))
    else:
        names = [h.strip() for h in first[1]]
        refuse_twice(names, where(p, first[0]), "the header names")
        width = len(names)

    def rows() -> Iterator[Row]:
        it = records()
        if header:
            next(it)
        for n, fields in it:
            if len(fields) != width:
                raise BertforgeError(f"{where(p, n)}: expected {width} columns, found {len(fields)}")
            yield Row(where(p, n), dict(zip(names, fields)))

    return Table(str(p), rows, names, header_line=first[0] if header else None, stem=_stem(p))


class _Twice(dict):
    """A JSON object that named `key` twice (kept to be blamed on its row)."""

    key = ""


def _marking_pairs(found: list[str]) -> Any:
    """An object_pairs_hook that marks an object naming a key twice (and records the key in `found`), so that a
    row of a JSON list is blamed rather than the whole file."""
    def hook(pairs: list[tuple[str, Any]]) -> dict:
        obj: dict = {}
        twice = None
        for key, item in pairs:
            if key in obj and twice is None:
                twice = key
            obj[key] = item
            if isinstance(item, _Twice) and twice is None:
                twice = item.key  # a nested object's: blamed on the row that holds it
        if twice is None:
            return obj
        found.append(twice)
        marked = _Twice(obj)
        marked.key = twice
        return marked
    return hook


def json_document(path: str | Path) -> Any:
    """The parsed content of a .json file (compressed too), or None when it holds JSON Lines; an object naming a
    key twice is refused naming the key."""
    p = require_file(path)
    return None if _is_json_lines(p) else read_json(p, expect=object)


def _json_table(p: Path) -> Table:
    """A JSON list of objects, or {"data": [objects]}; a .json file holding JSON Lines is read as JSONL. An object
    naming a key twice is refused at its row."""
    if _is_json_lines(p):
        rows = [Row(where(p, n), obj) for n, obj in jsonl_rows(p)]
        return Table(str(p), lambda: rows, records=True, stem=_stem(p))
    found: list[str] = []
    data = read_json(p, expect=object, pairs_hook=_marking_pairs(found))
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        if found:
            raise BertforgeError(f"{p}: {DuplicateKey(found[0])}")
        raise BertforgeError(f"{p}: expected a JSON list of objects (or {{\"data\": [...]}}), found "
                             f"{type(data).__name__}")
    rows = []
    for i, obj in enumerate(data):
        if not isinstance(obj, dict):
            raise BertforgeError(f"{p.name} row {i}: expected a JSON object, found {type(obj).__name__}")
        if isinstance(obj, _Twice):
            raise BertforgeError(f"{p.name} row {i}: {DuplicateKey(obj.key)}")
        rows.append(Row(f"{p.name} row {i}", dict(obj)))
    if found:  # inside a list within a row, or around the list
        raise BertforgeError(f"{p}: {DuplicateKey(found[0])}")
    return Table(str(p), lambda: rows, records=True, stem=_stem(p))


def _is_json_lines(p: Path) -> bool:
    """Whether a .json file holds JSON Lines: its first line is a whole object and more lines follow (or that object
    has no "data" list)."""
    lines = text_lines(p)
    first = next(lines, None)
    if first is None:
        return False
    try:
        obj = json.loads(first[1])
    except json.JSONDecodeError:
        return False
    if not isinstance(obj, dict):
        return False
    return next(lines, None) is not None or not isinstance(obj.get("data"), list)


def _parquet_table(p: Path) -> Table:
    pq = import_extra("pyarrow.parquet", f"{p}: reading Parquet")
    try:
        names = pq.ParquetFile(p).schema_arrow.names
    except Exception as err:  # pyarrow's errors (ArrowInvalid, OSError) for a file that is no Parquet
        raise BertforgeError(f"{p}: not a readable Parquet file ({first_line(err)})") from None
    refuse_twice(names, f"{p.name} row 0", "the schema names the column")

    def rows() -> Iterator[Row]:
        i = 0
        batches = pq.ParquetFile(p).iter_batches(batch_size=4096)
        while True:
            try:
                batch = next(batches, None)
            except Exception as err:  # a damaged page or column chunk
                raise BertforgeError(f"{p.name} row {i}: cannot read further ({first_line(err)})") from None
            if batch is None:
                return
            for values in batch.to_pylist():
                yield Row(f"{p.name} row {i}", values)
                i += 1

    return Table(str(p), rows, names)
