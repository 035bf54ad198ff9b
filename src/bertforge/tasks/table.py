"""Any CSV / TSV / JSONL file of sentence (pair) examples, read with a column mapping (generic classify/regress).

Standard library only; malformed input raises ``BertforgeError("<file>:<line>: <what>")``.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from bertforge.errors import BertforgeError
from bertforge.io.read import csv_rows, jsonl_rows, require_file, tsv_rows
from bertforge.io.read import where as _where
from bertforge.tasks.examples import Label, TextExample, class_label, float_label, text_field


_MISSING = {"nan", "inf", "-inf", "infinity", "-infinity"}


def _sorted_labels(values: set[str]) -> list[str]:
    """Sort label strings; numerically when every label is an integer (so "10" comes after "2")."""
    if all(re.fullmatch(r"-?\d+", v) for v in values):
        return sorted(values, key=int)
    return sorted(values)


def read_table(
    path: str | Path,
    text_col: str | int,
    text_pair_col: str | int | None = None,
    label_col: str | int | None = None,
    label_list: Sequence[str] | None = None,
    regression: bool = False,
    fmt: str | None = None,
    header: bool = True,
) -> tuple[list[TextExample], list[str] | None]:
    """Read any CSV / TSV / JSONL file with a column mapping.

    ``fmt``: "csv", "tsv" or "jsonl" (default: from the extension; ``.json`` is read as JSONL). TSV is read
    GLUE-style (no quoting), CSV with standard quoting. Columns are header names (or integer positions when
    ``header=False``); JSONL uses keys. Labels are kept as strings and collected into a sorted label list
    unless ``label_list`` is given (then unknown labels raise). ``regression=True`` parses float labels and
    returns ``None`` as the label list. Returns ``(examples, label_list)``.
    """
    p = require_file(path)
    fmt = (fmt or p.suffix.lstrip(".")).lower()
    if fmt == "json":
        fmt = "jsonl"
    if fmt not in ("csv", "tsv", "jsonl"):
        raise BertforgeError(f"{p}: unknown format {fmt!r} (use csv, tsv or jsonl)")

    def records() -> Iterator[tuple[int, Callable[[str | int], object]]]:
        if fmt == "jsonl":
            for n, obj in jsonl_rows(p):
                yield n, lambda k, obj=obj, n=n: _field_json(obj, k, _where(p, n))
            return
        rows = tsv_rows(p) if fmt == "tsv" else csv_rows(p, ",")
        cols: dict[str | int, int] | None = None
        width = None
        for n, row in rows:
            if cols is None:
                if header:
                    names = [h.strip() for h in row]
                    cols, width = {h: i for i, h in enumerate(names)}, len(names)
                    for c in (text_col, text_pair_col, label_col):
                        if c is not None and c not in cols:
                            raise BertforgeError(f"{_where(p, n)}: header has no column {c!r}")
                    continue
                cols, width = {}, len(row)
            if len(row) != width:
                raise BertforgeError(f"{_where(p, n)}: expected {width} columns, found {len(row)}")
            yield n, lambda k, row=row, cols=cols: row[cols[k] if header else int(k)]

    examples: list[TextExample] = []
    seen: set[str] = set()
    for n, get in records():
        where = _where(p, n)
        label: Label = None
        if label_col is not None:
            raw = get(label_col)
            if regression:
                label = float_label(raw, where)
            elif label_list is not None:
                label = class_label(str(raw), label_list, where)
            else:
                label = text_field(raw, where, f"label {label_col!r}")
                if label.lower() in _MISSING or (isinstance(raw, float) and raw != raw):
                    # pandas writes a missing label as NaN: it would become a class of its own
                    raise BertforgeError(f"{where}: the label {label!r} is a missing value, not a class")
                seen.add(label)
        pair = None if text_pair_col is None else text_field(get(text_pair_col), where, f"text {text_pair_col!r}")
        text = text_field(get(text_col), where, f"text {text_col!r}")
        examples.append(TextExample(text, pair, label, guid=f"{p.stem}-{len(examples)}"))
    if regression or label_col is None:
        return examples, None
    return examples, list(label_list) if label_list is not None else _sorted_labels(seen)


def _field_json(obj: dict, key: str | int, where: str) -> object:
    if key not in obj:
        raise BertforgeError(f"{where}: missing field {key!r}")
    v = obj[key]
    return int(v) if isinstance(v, bool) else v
