"""Data sources as rows: the one reader of every form users hold texts and examples in.

    table = open_table("dev.csv")                 # or a save_to_disk folder, a hub id, data in memory
    table.columns                                 # ["sentence", "label"]
    for row in table:                             # a Row: the row's values by column, and row.where ("dev.csv:3")
        row["sentence"]
    cols = pick_columns(table)                    # Columns(text="sentence", pair=None, label="label")
    texts = read_texts("dev.parquet")             # one text per row (embed, index, analyze)

Sources:
  * a file, by its suffix (`io.files`): .txt (one text a line; its one column is "text"), .tsv (a header line;
    quotes are ordinary characters, as in GLUE's files), .csv (a header line; the csv module's quoting, so a quoted
    field may hold commas and newlines), .jsonl (an object a line), .json (a list of objects, or {"data": [...]};
    JSON Lines in a .json file are read as such), .parquet; each but Parquet also compressed (.gz, .bz2, .xz, .zst:
    read as the format under the compression suffix); a file of any other suffix is text;
  * a folder written by datasets' `save_to_disk` (a Dataset, or a DatasetDict: one of its splits; `io.hubdata`);
  * a dataset on the Hugging Face Hub ("nyu-mll/glue" with a config and a split; `HubSplit`), read by
    `datasets.load_dataset`, from its cache when offline (HF_HUB_OFFLINE=1 / HF_DATASETS_OFFLINE=1); a local folder
    of the same name is read instead (with a notice), "hf://nyu-mll/glue" means the Hub;
  * data in memory (`io.memory`): a list of strings (one text each), a list of dicts, a pandas DataFrame, a pyarrow
    Table, a datasets Dataset (a DatasetDict with a split).
A structured source is never read as lines. Problems are one BertforgeError line naming the source and the line
(text, TSV, CSV, JSONL) or the row (counted from 0, as pandas and datasets index them); a missing column is named
with the columns there are; a column or key named twice is refused. pyarrow, pandas and datasets (the `data` extra)
are imported only by the sources that need them. `find_split` finds one split (train, dev, test) of a folder of
split files (two files of one split are refused, naming both), a saved DatasetDict or a hub dataset, so that
`--data` means the same to every verb.
"""
from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io import hub
from bertforge.io.files import SUFFIXES, TABLE_SUFFIXES, TEXT_SUFFIXES, file_format, file_table, json_document
from bertforge.io.hubdata import (SPLITS, hub_table, is_saved_dataset, load_hub_dataset, saved_table, split_aliases,
                                  split_name)
from bertforge.io.memory import memory_table
from bertforge.io.read import warn
from bertforge.io.rows import Columns, HubSplit, Row, Table, column_list, value

__all__ = ["SPLITS", "SUFFIXES", "TABLE_SUFFIXES", "TEXT_SUFFIXES", "Columns", "HubSplit", "Row", "Table",
           "column_list", "file_format", "find_split", "is_saved_dataset", "is_splits", "json_document",
           "load_hub_dataset", "looks_like_hub_id", "open_table", "pick_columns", "read_texts", "single_source",
           "source_name", "split_aliases", "split_names", "text_value", "value"]

# Column defaults when none is named: the first (text, pair) both present, else the first text column present.
TEXT_PAIRS = (("text", "text_pair"), ("sentence1", "sentence2"), ("premise", "hypothesis"), ("question", "sentence"),
              ("#1 String", "#2 String"))
TEXT_COLUMNS = ("text", "sentence", "sentence1", "premise", "question", "#1 String", "content", "document")
LABEL_COLUMNS = ("label", "labels", "score", "gold_label", "Quality")


# ---------------------------------------------------------------------------------------------- opening sources

def open_table(source: Any, *, split: str | None = None, config: str | None = None, header: bool = True,
               stream: bool = False) -> Table:
    """`source` opened as a Table (the module docstring lists the sources). `split` picks one split of a
    DatasetDict (a saved folder, a hub dataset, one in memory); `config` a hub dataset's configuration.
    `header=False`: a CSV / TSV without a header line; its columns are then the positions 0, 1, ...
    `stream=True`: a JSON Lines file is read again on each pass instead of held in memory (a corpus of any size;
    a bad line is then found when the reading reaches it, not when the file is opened)."""
    if isinstance(source, Table):
        return source
    if isinstance(source, HubSplit):
        return hub_table(source.dataset, source.config, split or source.split)
    if isinstance(source, (str, os.PathLike)):
        if (dataset := hub_dataset_id(source)) is not None:
            return hub_table(dataset, config, split)
        path = Path(source)
        if path.is_dir():
            return saved_table(path, split)
        return file_table(path, header, stream)
    return memory_table(source, split)


def looks_like_hub_id(name: str) -> bool:
    """Whether `name` (no existing path) is read as a dataset on the Hub: "hf://ID", or an id by the Hub's own rule
    (`io.hub.looks_like_hub_id`) without a data file's suffix."""
    if name.startswith(hub.HUB_PREFIX):
        return hub.hub_id_problem(name[len(hub.HUB_PREFIX):]) is None
    return hub.looks_like_hub_id(name, SUFFIXES)


_NOTICED: set[str] = set()  # folders already said to shadow a Hub id (once a process)


def hub_dataset_id(source: Any) -> str | None:
    """The Hub dataset id `source` names, or None when it is a local path (or no id): "hf://ID" is the Hub always;
    a name that exists is the local path (with a notice when it is written as a Hub id, `owner/name`); a name that
    does not exist is a Hub id when it looks like one."""
    if not isinstance(source, str):
        return None
    if source.startswith(hub.HUB_PREFIX):
        dataset = source[len(hub.HUB_PREFIX):]
        why = hub.hub_id_problem(dataset) if dataset else "no id after it"
        if why:
            raise BertforgeError(f"{source}: not a Hugging Face Hub id ({why})")
        return dataset
    if os.path.lexists(source):
        if source not in _NOTICED and hub.shadows_hub_id(source) and not source.lower().endswith(SUFFIXES):
            _NOTICED.add(source)
            warn(f"{source}: read from the local {'folder' if os.path.isdir(source) else 'file'} "
                 f"{Path(source).resolve()}, not the Hugging Face Hub dataset of that id (write "
                 f"{hub.HUB_PREFIX}{source} for the Hub)")
        return None
    return source if looks_like_hub_id(source) else None


def source_name(source: Any) -> str:
    """What messages call a source: its path or hub name, or what kind of data in memory it is."""
    if isinstance(source, (str, os.PathLike, HubSplit)):
        return str(source)
    if isinstance(source, Table):
        return source.name
    if isinstance(source, (list, tuple)):
        return "texts" if all(isinstance(x, str) for x in source) else "records"
    return type(source).__name__


# ---------------------------------------------------------------------------------------------- splits

def find_split(data: Any, split: str, *, config: str | None = None, patterns: Sequence[str] | None = None) -> Any:
    """The source of one split ("train", "dev", "test") of `data`, or None when it has none:
      * a folder of split files: the file that one of `patterns` (glob patterns, e.g. "train.tsv"; by default each
        name of the split with each suffix of SUFFIXES) matches, else a sub-folder named for the split that
        save_to_disk wrote (which is how a saved DatasetDict holds its splits); two files of the split (train.csv
        and train.jsonl, dev.tsv and validation.csv) are refused, naming both: which one was meant is no rule to
        guess;
      * a hub dataset id: its split of that name (dev: validation, ...), as a HubSplit;
      * a DatasetDict, or a dict of split name -> data, in memory: that split's data.
    A file, or any other single table, is no set of splits: the caller decides which split it is."""
    if isinstance(data, (str, os.PathLike)):
        if (dataset := hub_dataset_id(data)) is not None:
            name = split_name(load_hub_dataset(dataset, config).keys(), split)
            return HubSplit(dataset, config, name) if name else None
        folder = Path(data)
        return _folder_split(folder, split, patterns) if folder.is_dir() else None
    if isinstance(data, dict):  # a DatasetDict, or a dict of splits
        name = split_name(data.keys(), split)
        return data[name] if name else None
    return None


def _folder_split(folder: Path, split: str, patterns: Sequence[str] | None) -> Path | None:
    names = split_aliases(split)
    found: list[Path] = []
    for pattern in patterns or [n + s for n in names for s in SUFFIXES]:
        found += [p for p in sorted(folder.glob(pattern)) if p.is_file() and p not in found]
    if len(found) > 1:
        raise BertforgeError(f"{folder}: both {found[0].name} and {found[1].name} hold the {split} split; keep one "
                             "of them in the folder (or name the file)")
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
    if (dataset := hub_dataset_id(data)) is not None:
        return list(load_hub_dataset(dataset, config).keys())
    folder = Path(data)
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
        if hub_dataset_id(data) is not None:
            return True
        p = Path(data)
        return p.is_dir() and not (p / "state.json").is_file()
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
