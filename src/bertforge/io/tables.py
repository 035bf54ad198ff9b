"""Data sources as rows: the one reader of every form users hold texts and examples in.

    table = open_table("dev.csv")                 # or a save_to_disk folder, a hub id, data in memory
    table.columns                                 # ["sentence", "label"]
    for row in table:                             # a Row: the row's values by column, and row.where ("dev.csv:3")
        row["sentence"]
    cols = pick_columns(table)                    # Columns(text="sentence", pair=None, label="label")
    texts = read_texts("dev.parquet")             # one text per row (embed, index, analyze)

Sources:
  * a file, by its suffix: .txt / .txt.gz (one text a line; its one column is "text"), .tsv (a header line; quotes
    are ordinary characters, as in GLUE's files), .csv (a header line; the csv module's quoting, so a quoted field
    may hold commas and newlines), .jsonl / .jsonl.gz (an object a line), .json (a list of objects, or
    {"data": [...]}; JSON Lines in a .json file are read as such), .parquet; a file of any other suffix is text;
  * a folder written by datasets' `save_to_disk` (a Dataset, or a DatasetDict: one of its splits);
  * a dataset on the Hugging Face Hub ("nyu-mll/glue" with a config and a split; `HubSplit`), read by
    `datasets.load_dataset`, from its cache when offline (HF_HUB_OFFLINE=1 / HF_DATASETS_OFFLINE=1);
  * data in memory: a list of strings (one text each), a list of dicts, a pandas DataFrame, a pyarrow Table, a
    datasets Dataset (a DatasetDict with a split).
A structured source is never read as lines. Problems are one BertforgeError line naming the source and the line
(text, TSV, CSV, JSONL) or the row (counted from 0, as pandas and datasets index them); a missing column is named
with the columns there are. pyarrow, pandas and datasets (the `data` extra) are imported only by the sources that
need them. `find_split` finds one split (train, dev, test) of a folder of split files, a saved DatasetDict or a
hub dataset, so that `--data` means the same to every verb.
"""
from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io.read import csv_rows, jsonl_rows, read_json, require_file, text_lines, tsv_rows, where

TEXT_SUFFIXES = (".txt", ".txt.gz")
TABLE_SUFFIXES = (".tsv", ".csv", ".jsonl", ".jsonl.gz", ".json", ".parquet")
SUFFIXES = TEXT_SUFFIXES + TABLE_SUFFIXES

# The names each split goes by, the usual one first (GLUE's files say dev, the Hugging Face Hub says validation).
SPLITS = {"train": ("train",), "dev": ("dev", "dev_matched", "valid", "validation", "val", "eval"), "test": ("test",)}

# Column defaults when none is named: the first (text, pair) both present, else the first text column present.
TEXT_PAIRS = (("text", "text_pair"), ("sentence1", "sentence2"), ("premise", "hypothesis"), ("question", "sentence"),
              ("#1 String", "#2 String"))
TEXT_COLUMNS = ("text", "sentence", "sentence1", "premise", "question", "#1 String", "content", "document")
LABEL_COLUMNS = ("label", "labels", "score", "gold_label", "Quality")

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


# ---------------------------------------------------------------------------------------------- opening sources

def open_table(source: Any, *, split: str | None = None, config: str | None = None, header: bool = True) -> Table:
    """`source` opened as a Table (the module docstring lists the sources). `split` picks one split of a
    DatasetDict (a saved folder, a hub dataset, one in memory); `config` a hub dataset's configuration.
    `header=False`: a CSV / TSV without a header line; its columns are then the positions 0, 1, ..."""
    if isinstance(source, Table):
        return source
    if isinstance(source, HubSplit):
        return _hub_table(source.dataset, source.config, split or source.split)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            return _saved_table(path, split)
        if not path.exists() and isinstance(source, str) and looks_like_hub_id(source):
            return _hub_table(source, config, split)
        return _file_table(path, header)
    return _memory_table(source, split)


def source_name(source: Any) -> str:
    """What messages call a source: its path or hub name, or what kind of data in memory it is."""
    if isinstance(source, (str, os.PathLike, HubSplit)):
        return str(source)
    if isinstance(source, Table):
        return source.name
    if isinstance(source, (list, tuple)):
        return "texts" if all(isinstance(x, str) for x in source) else "records"
    return type(source).__name__


def file_format(path: str | Path) -> str:
    """"text", "tsv", "csv", "jsonl", "json" or "parquet", from the file's suffix (unknown suffixes are text)."""
    name = Path(path).name.lower()
    for suffix in TABLE_SUFFIXES:
        if name.endswith(suffix):
            return suffix.split(".")[1]
    return "text"


def _file_table(path: Path, header: bool) -> Table:
    p = require_file(path)
    fmt = file_format(p)
    if fmt == "text":
        return Table(str(p), lambda: (Row(where(p, n), {"text": line}) for n, line in text_lines(p, skip_blank=False)),
                     ["text"], plain=True)
    if fmt in ("tsv", "csv"):
        return _delimited_table(p, fmt, header)
    if fmt == "jsonl":
        rows = [Row(where(p, n), obj) for n, obj in jsonl_rows(p)]
        return Table(str(p), lambda: rows, records=True)
    if fmt == "json":
        return _json_table(p)
    return _parquet_table(p)


def _delimited_table(p: Path, fmt: str, header: bool) -> Table:
    """CSV (quoted fields) or TSV (GLUE's: quotes are text); the first record is the header unless not `header`."""
    def records() -> Iterator[tuple[int, list[str]]]:
        return tsv_rows(p) if fmt == "tsv" else csv_rows(p, ",")

    first = next(records(), None)
    if first is None:
        return Table(str(p), lambda: [], [], header_line=1 if header else None)
    if not header:
        width = len(first[1])
        names: list = list(range(width))
    else:
        names = [h.strip() for h in first[1]]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise BertforgeError(f"{where(p, first[0])}: the header names {', '.join(map(repr, twice))} more than once")
        width = len(names)

    def rows() -> Iterator[Row]:
        it = records()
        if header:
            next(it)
        for n, fields in it:
            if len(fields) != width:
                raise BertforgeError(f"{where(p, n)}: expected {width} columns, found {len(fields)}")
            yield Row(where(p, n), dict(zip(names, fields)))

    return Table(str(p), rows, names, header_line=first[0] if header else None)


def json_document(path: str | Path) -> Any:
    """The parsed content of a .json file, or None when it holds JSON Lines."""
    p = require_file(path)
    return None if _is_json_lines(p) else read_json(p, expect=object)


def _json_table(p: Path) -> Table:
    """A JSON list of objects, or {"data": [objects]}; a .json file holding JSON Lines is read as JSONL."""
    data = json_document(p)
    if data is None:
        rows = [Row(where(p, n), obj) for n, obj in jsonl_rows(p)]
        return Table(str(p), lambda: rows, records=True)
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise BertforgeError(f"{p}: expected a JSON list of objects (or {{\"data\": [...]}}), found "
                             f"{type(data).__name__}")
    rows = []
    for i, obj in enumerate(data):
        if not isinstance(obj, dict):
            raise BertforgeError(f"{p.name} row {i}: expected a JSON object, found {type(obj).__name__}")
        rows.append(Row(f"{p.name} row {i}", obj))
    return Table(str(p), lambda: rows, records=True)


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
    pq = _import("pyarrow.parquet", f"{p}: reading Parquet")
    try:
        names = pq.ParquetFile(p).schema_arrow.names
    except Exception as err:  # pyarrow's errors (ArrowInvalid, OSError) for a file that is no Parquet
        raise BertforgeError(f"{p}: not a readable Parquet file ({_first_line(err)})") from None

    def rows() -> Iterator[Row]:
        i = 0
        batches = pq.ParquetFile(p).iter_batches(batch_size=4096)
        while True:
            try:
                batch = next(batches, None)
            except Exception as err:  # a damaged page or column chunk
                raise BertforgeError(f"{p.name} row {i}: cannot read further ({_first_line(err)})") from None
            if batch is None:
                return
            for values in batch.to_pylist():
                yield Row(f"{p.name} row {i}", values)
                i += 1

    return Table(str(p), rows, names)


# ---------------------------------------------------------------------------------------------- datasets

def is_saved_dataset(path: str | Path) -> bool:
    """Whether `path` is a folder that datasets' save_to_disk wrote (a Dataset or a DatasetDict)."""
    p = Path(path)
    return p.is_dir() and ((p / "dataset_dict.json").is_file() or (p / "state.json").is_file())


def _saved_table(path: Path, split: str | None) -> Table:
    if not is_saved_dataset(path):
        raise BertforgeError(f"{path}: a folder, but not one that datasets' save_to_disk wrote (no state.json or "
                             "dataset_dict.json); name a file in it")
    datasets = _import("datasets", f"{path}: reading a saved dataset")
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as err:  # datasets' own errors for a damaged folder
        raise BertforgeError(f"{path}: cannot read this saved dataset ({_first_line(err)})") from None
    return _dataset_table(loaded, str(path), split)


def looks_like_hub_id(name: str) -> bool:
    """"owner/name" or "name" without a file suffix: what a dataset id on the Hub looks like (paths that do not
    exist are checked with this before the Hub is asked)."""
    return bool(re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name)) and not name.lower().endswith(SUFFIXES) \
        and not name.startswith((".", "-"))


_HUB: dict[tuple[str, str | None], Any] = {}  # datasets loaded in this process (each read once)


def load_hub_dataset(dataset: str, config: str | None) -> Any:
    """The DatasetDict of a hub dataset (all its splits), through datasets.load_dataset: downloaded when online
    (a token from HF_TOKEN), from the cache when offline; anything that cannot be had is one line."""
    key = (dataset, config)
    if key not in _HUB:
        datasets = _import("datasets", f"{dataset}: no such file or folder; reading it as a Hugging Face Hub dataset")
        verbosity = datasets.logging.get_verbosity()
        datasets.logging.set_verbosity_error()  # its notes ("using the latest cached version...") are no errors
        try:
            _HUB[key] = datasets.load_dataset(dataset, config)
        except ConnectionError:
            raise BertforgeError(f"{dataset}: no such file or folder, and no Hugging Face Hub dataset of that name in "
                                 "the cache (offline, or the Hub cannot be reached)") from None
        except Exception as err:  # DatasetNotFoundError, a config not cached or not given, ...
            raise BertforgeError(f"{dataset}: no such file or folder, nor a dataset to be had from the Hugging Face "
                                 f"Hub ({_first_line(err)})") from None
        finally:
            datasets.logging.set_verbosity(verbosity)
    return _HUB[key]


def _hub_table(dataset: str, config: str | None, split: str | None) -> Table:
    return _dataset_table(load_hub_dataset(dataset, config), str(HubSplit(dataset, config)), split)


def _dataset_table(data: Any, name: str, split: str | None) -> Table:
    """A datasets Dataset as a table; a DatasetDict gives its `split`."""
    stem = str(getattr(data, "split", None) or "") or Path(name).stem
    if isinstance(data, dict):  # a DatasetDict is a dict of split name -> Dataset
        data, name, stem = _choose_split(data, name, split)

    def rows() -> Iterator[Row]:
        i = 0
        for batch in data.with_format(None).iter(batch_size=1024):
            keys = list(batch)
            for values in zip(*(batch[k] for k in keys)):
                yield Row(f"{name} row {i}", dict(zip(keys, values)))
                i += 1

    table = Table(name, rows, list(data.column_names), stem=stem)
    for column, feature in getattr(data, "features", {}).items():
        names = getattr(feature, "names", None) or getattr(getattr(feature, "feature", None), "names", None)
        if names:  # ClassLabel, or a Sequence / List of ClassLabel
            table.class_names[column] = list(names)
    return table


def _choose_split(splits: dict, name: str, split: str | None) -> tuple[Any, str, str]:
    """(the data of `split`, its name for messages, the split's name) from a dict of splits; without `split`, its
    only split."""
    names = list(splits)
    chosen = _split_name(names, split) if split else (names[0] if len(names) == 1 else None)
    if chosen is None:
        asked = f"no split {split!r}" if split else "several splits; name the one to read"
        raise BertforgeError(f"{name}: {asked} (splits: {', '.join(map(str, names)) or 'none'})")
    return splits[chosen], f"{name} [{chosen}]", str(chosen)


def split_aliases(split: str) -> tuple[str, ...]:
    """The names `split` goes by, itself first: "dev" and "validation" find each other (SPLITS)."""
    group = SPLITS.get(split) or next((names for names in SPLITS.values() if split in names), ())
    return tuple(dict.fromkeys((split, *group)))


def _split_name(names: Iterable[str], split: str) -> str | None:
    """Which of `names` is `split` (train, dev, test, or a name of its own), by its aliases in order."""
    names = list(names)
    return next((c for c in split_aliases(split) if c in names), None)


# ---------------------------------------------------------------------------------------------- in memory

def _memory_table(data: Any, split: str | None, name: str | None = None) -> Table:
    """Data in memory as a table, called `name` in messages (by default for what it is: "DataFrame", "texts"...)."""
    module = type(data).__module__.split(".")[0]
    if module == "datasets":
        return _dataset_table(data, name or type(data).__name__, split)
    if isinstance(data, dict):  # split name -> data
        chosen, chosen_name, stem = _choose_split(data, name or "the data", split)
        table = _memory_table(chosen, None, chosen_name)
        table.stem = stem
        return table
    if module == "pandas" and hasattr(data, "to_dict"):
        return _records_table(name or "DataFrame", _dataframe_records(data), list(map(_column_name, data.columns)))
    if module == "pyarrow" and hasattr(data, "to_pylist"):
        return _records_table(name or "pyarrow Table", data.to_pylist(), list(data.column_names))
    if isinstance(data, (list, tuple)):
        if all(isinstance(x, str) for x in data):
            texts, label = list(data), name or "texts"
            return Table(label, lambda: (Row(f"{label} row {i}", {"text": t}) for i, t in enumerate(texts)),
                         ["text"], plain=True)
        if all(isinstance(x, dict) for x in data):
            return _records_table(name or "records", list(data), None)
        raise BertforgeError("a list of data must hold strings (one text each) or dicts (one row each), not "
                             + ", ".join(sorted({type(x).__name__ for x in data})))
    raise BertforgeError(f"cannot read data from a {type(data).__name__}: give a file or folder path, a list of "
                         "strings or dicts, a pandas DataFrame, a pyarrow Table or a datasets Dataset")


def _records_table(name: str, records: list[dict], columns: list | None) -> Table:
    """Rows of dicts; without `columns` (dicts of their own keys) a field may be missing from some rows."""
    rows = [Row(f"{name} row {i}", r) for i, r in enumerate(records)]
    return Table(name, lambda: rows, columns, records=columns is None)


def _column_name(name: Any) -> Any:
    return name if isinstance(name, (str, int)) else str(name)


def _dataframe_records(df: Any) -> list[dict]:
    """A DataFrame's rows as dicts of Python values, its missing values (NaN, None, NA) as None."""
    import pandas as pd

    frame = df.astype(object).where(pd.notna(df), None)
    frame.columns = [_column_name(c) for c in frame.columns]
    return [{k: (v.item() if hasattr(v, "item") and not isinstance(v, (list, dict)) else v) for k, v in r.items()}
            for r in frame.to_dict("records")]


# ---------------------------------------------------------------------------------------------- splits

def find_split(data: Any, split: str, *, config: str | None = None, patterns: Sequence[str] | None = None) -> Any:
    """The source of one split ("train", "dev", "test") of `data`, or None when it has none:
      * a folder of split files: the first of `patterns` (glob patterns, e.g. "train.tsv"; by default each name of
        the split with each suffix of SUFFIXES) that matches a file, else a sub-folder named for the split that
        save_to_disk wrote (which is how a saved DatasetDict holds its splits);
      * a hub dataset id: its split of that name (dev: validation, ...), as a HubSplit;
      * a DatasetDict, or a dict of split name -> data, in memory: that split's data.
    A file, or any other single table, is no set of splits: the caller decides which split it is."""
    if isinstance(data, (str, os.PathLike)):
        folder = Path(data)
        if folder.is_dir():
            return _folder_split(folder, split, patterns)
        if not folder.exists() and isinstance(data, str) and looks_like_hub_id(data):
            name = _split_name(load_hub_dataset(data, config).keys(), split)
            return HubSplit(data, config, name) if name else None
        return None
    if isinstance(data, dict):  # a DatasetDict, or a dict of splits
        name = _split_name(data.keys(), split)
        return data[name] if name else None
    return None


def _folder_split(folder: Path, split: str, patterns: Sequence[str] | None) -> Path | None:
    names = split_aliases(split)
    for pattern in patterns or [n + s for n in names for s in SUFFIXES]:
        found = sorted(p for p in folder.glob(pattern) if p.is_file())
        if found:
            return found[0]
    for name in names:
        if is_saved_dataset(folder / name):
            return folder / name
    return None


def split_names(data: Any, config: str | None = None) -> list[str]:
    """The splits `data` holds: a folder's split files and saved split folders (by their names), a hub dataset's or
    a dict's keys."""
    if isinstance(data, dict):
        return [str(k) for k in data]
    folder = Path(data)
    if not folder.is_dir():
        return list(load_hub_dataset(str(data), config).keys())
    names = {p.name.split(".")[0] for p in folder.iterdir()
             if p.is_file() and p.name.lower().endswith(SUFFIXES) or is_saved_dataset(p)}
    return sorted(n for n in names if any(n in aliases for aliases in SPLITS.values()))


def single_source(data: Any, split: str | None = None, config: str | None = None) -> Any:
    """The one table a verb that reads one input takes from `data`: `data` itself when it is one table (a file, a
    saved Dataset, data in memory), else its `split` (a folder of splits, a hub dataset, a DatasetDict), or its only
    split when none is named."""
    if not is_splits(data):
        return data
    if split is None:
        names = split_names(data, config)
        if len(names) != 1:
            raise BertforgeError(f"{source_name(data)}: {'several splits' if names else 'no splits'} "
                                 f"({', '.join(names) or 'no train.*, dev.*, test.* files'}); name the one to read")
        split = names[0]
    found = find_split(data, split, config=config)
    if found is None:
        raise BertforgeError(f"{source_name(data)}: no split {split!r} (splits: "
                             f"{', '.join(split_names(data, config)) or 'none'})")
    return found


def is_splits(data: Any) -> bool:
    """Whether `data` holds splits (a folder that is no single saved Dataset, a hub id, a DatasetDict or a dict of
    splits) rather than being one table."""
    if isinstance(data, (str, os.PathLike)):
        p = Path(data)
        if p.is_dir():
            return not (p / "state.json").is_file()
        return not p.exists() and isinstance(data, str) and looks_like_hub_id(data)
    return isinstance(data, dict)


# ---------------------------------------------------------------------------------------------- columns and texts

def pick_columns(table: Table, text: Any = None, pair: Any = None, label: Any = None, *, want_pair: bool = True,
                 want_label: bool = True) -> Columns:
    """The columns to read, each checked to exist. A named column must be there. Without `text`, the first of
    TEXT_PAIRS with both columns present gives the text and its pair (`want_pair`), else the first of TEXT_COLUMNS
    present; without `label`, the first of LABEL_COLUMNS present (`want_label`; None when there is none). Lines of
    text have one column: the text."""
    if table.plain:
        for given in (pair, label):
            if given is not None:
                raise table.missing(given)
        return Columns("text")
    if text is not None:
        table.require(text, "text")
        if pair is not None:
            table.require(pair, "text pair")
    elif pair is None and want_pair and (found := next(((a, b) for a, b in TEXT_PAIRS
                                                         if table.has(a) and table.has(b)), None)):
        text, pair = found
    else:
        text = next((c for c in TEXT_COLUMNS if table.has(c)), None)
        if text is None:
            raise BertforgeError(f"{table.name}: no text column (looked for {', '.join(TEXT_COLUMNS)}; columns: "
                                 f"{column_list(table.columns)}); name the text column")
        if pair is not None:
            table.require(pair, "text pair")
    if label is not None:
        table.require(label, "label")
    elif want_label:
        label = next((c for c in LABEL_COLUMNS if table.has(c)), None)
    return Columns(text, pair if want_pair else None, label if want_label else None)


def text_value(row: Row, column: Any) -> str:
    """A row's text in `column`: strings as they are, numbers as text, a missing value (None, NaN) as "" (embedding
    keeps row i as input row i; readers that need a text check for empty ones)."""
    raw = value(row, column)
    if isinstance(raw, float) and not math.isfinite(raw):
        raw = None  # pandas' missing value
    if raw is not None and (isinstance(raw, bool) or not isinstance(raw, (str, int, float))):
        raise BertforgeError(f"{row.where}: column {column!r} holds a {type(raw).__name__}, not a text")
    return "" if raw is None else raw if isinstance(raw, str) else str(raw)


def read_texts(source: Any, text_col: Any = None, *, split: str | None = None, config: str | None = None) -> list[str]:
    """One text per row of `source` (an empty row or cell is ""), from `text_col` (default: the first of
    TEXT_COLUMNS present; a text file's lines)."""
    table = open_table(source, split=split, config=config)
    column = pick_columns(table, text_col, want_pair=False, want_label=False).text
    return [text_value(row, column) for row in table]


def _import(module: str, what: str) -> Any:
    """`module`, or the one line naming the extra that brings it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise BertforgeError(f"{what} needs {module.split('.')[0]}: {EXTRA}") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())[:300]
