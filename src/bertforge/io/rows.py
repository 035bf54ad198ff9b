"""Rows and tables: what every data source opens as (`io.tables.open_table`), and the one-line errors about their
columns and fields. The sources themselves live beside this module: `io.files` (files of any format), `io.hubdata`
(saved and Hub datasets, splits), `io.memory` (data in memory)."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io.read import where

EXTRA = "pip install 'bertforge[data]'"


class Row(dict):
    """One row: its values by column name, and `where` it came from ("dev.csv:12", "train.parquet row 11")."""

    __slots__ = ("where",)

    def __init__(self, where: str, values: dict):
        super().__init__(values)
        self.where = where


@dataclass(frozen=True)
class HubSplit:
    """One split of a dataset on the Hugging Face Hub: `datasets.load_dataset(dataset, config)[split]`."""

    dataset: str
    config: str | None = None
    split: str | None = None

    def __str__(self) -> str:
        return self.dataset + (f" ({self.config})" if self.config else "") + (f" [{self.split}]" if self.split else "")


@dataclass(frozen=True)
class Columns:
    """The columns a reader takes its fields from (None: the table has no such column)."""

    text: Any
    pair: Any = None
    label: Any = None


class Table:
    """A source opened for reading: `name` (what messages call it), `columns` (in order), its rows (read again on
    each iteration) and `plain` (lines of text, no columns: the one column "text"). `stem` is a short name for ids
    (a file's stem, a split's name)."""

    def __init__(self, name: str, rows: Callable[[], Iterable[Row]], columns: Sequence | None = None,
                 plain: bool = False, header_line: int | None = None, records: bool = False, stem: str = ""):
        self.name, self._rows, self.plain = name, rows, plain
        self.stem = stem or Path(name).stem
        self._columns = list(columns) if columns is not None else None
        self.header_line = header_line  # CSV / TSV: the line of the header (missing columns are named there)
        self.records = records  # JSON objects: a field may be missing from some rows (named at the row)
        self.class_names: dict[Any, list[str]] = {}  # a datasets column of class ids (or lists of them): their names

    @property
    def columns(self) -> list:
        if self._columns is None:  # JSON objects: every key of any row, in order of first appearance
            self._columns = list(dict.fromkeys(k for row in self for k in row))
        return self._columns

    def __iter__(self) -> Iterator[Row]:
        return iter(self._rows())

    def rows(self) -> list[Row]:
        return list(self)

    def has(self, column: Any) -> bool:
        return column in self.columns

    def missing(self, column: Any, what: str = "") -> BertforgeError:
        """The one-line error for a column this table lacks: its name and the columns there are."""
        if self.plain:
            return BertforgeError(f"{self.name}: lines of text have no column {column!r}; use a table (csv, tsv, "
                                  "jsonl, json, parquet) with named columns")
        names = column_list(self.columns)
        role = f" for the {what}" if what else ""
        if self.header_line is not None:
            return BertforgeError(f"{where(self.name, self.header_line)}: header has no column {column!r}{role} "
                                  f"(columns: {names})")
        return BertforgeError(f"{self.name}: no column {column!r}{role} (columns: {names})")

    def require(self, column: Any, what: str = "") -> None:
        """Raise `missing` unless the table has `column`. JSON objects are checked row by row instead (`value`),
        unless no row has it."""
        if self.records and any(True for _ in self):
            return  # named at the first row without it (`value`), with the fields that row has
        if not self.plain and column not in self.columns:
            raise self.missing(column, what)


def column_list(columns: Sequence) -> str:
    """Column names for a one-line message: as written, or quoted with escapes where a name holds a line break or
    another unprintable character (a quoted CSV header may)."""
    shown = (str(c) if str(c).isprintable() else repr(str(c)) for c in columns)
    return ", ".join(shown) or "none"


def value(row: Row, column: Any, required: bool = True) -> Any:
    """`row[column]`; a row without it (a JSON object missing the field) is an error naming the row and the fields
    it has, unless not `required` (then None)."""
    try:
        return row[column]
    except KeyError:
        if not required:
            return None
        raise BertforgeError(f"{row.where}: missing field {column!r} (its fields: {column_list(list(row))})") from None


def refuse_twice(names: Sequence, where_: str, what: str = "names the column") -> None:
    """One line when `names` (a header, a schema, a frame's columns) holds a name more than once: the reader would
    keep one of the columns silently."""
    twice = sorted({str(n) for n in names if list(names).count(n) > 1})
    if twice:
        raise BertforgeError(f"{where_}: {what} {', '.join(map(repr, twice))} more than once")


def import_extra(module: str, what: str) -> Any:
    """`module`, or the one line naming the extra that brings it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise BertforgeError(f"{what} needs {module.split('.')[0]}: {EXTRA}") from None


def first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())[:300]
