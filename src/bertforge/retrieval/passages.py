"""Passages: the unit a retriever finds and a reader reads, `{"id", "title", "text"}` in any format the one reader
takes (`io.tables`: text, tsv, csv, jsonl, json, parquet, save_to_disk folders, Hub datasets, data in memory).

Every retrieval verb reads its corpus here, so the rules are said once:
- a passage keeps its id and title; a table without an id column gets "NAME:N" (N its row counting from 1, its line
  in a text file), so adding the same file twice is caught as duplicate ids; `require_ids=True` refuses such a table
- a duplicate id is refused, naming the row where it appears again (two passages under one id would make every
  answer that names the id ambiguous)
- an empty passage is skipped (it is never a useful hit); a corpus with none left is an error
`iter_passages` streams (for corpora too large to hold twice); `read_passages` collects them.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io import tables
from bertforge.io.tables import open_table, pick_columns, value

ID_COLUMNS = ("id", "_id", "doc_id", "passage_id", "pid")
TITLE_COLUMNS = ("title",)


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str
    where: str = ""  # "FILE:N", for messages

    def to_dict(self) -> dict[str, str]:
        return {"id": self.id, "title": self.title, "text": self.text}


@dataclass
class Passages:
    """A corpus in memory: three parallel lists (row r = the r-th passage of the index)."""
    ids: list[str] = field(default_factory=list)
    titles: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> Passage:
        return Passage(self.ids[i], self.titles[i], self.texts[i])

    def append(self, p: Passage) -> None:
        self.ids.append(p.id)
        self.titles.append(p.title)
        self.texts.append(p.text)


def _first_present(table: tables.Table, names: tuple[str, ...]) -> Any:
    if table.plain:
        return None
    return next((n for n in names if table.has(n)), None)


def iter_passages(source: Any, *, text_col: Any = None, id_col: Any = None, title_col: Any = None,
                  split: str | None = None, config: str | None = None, require_ids: bool = False,
                  seen: set[str] | None = None) -> Iterator[Passage]:
    """The passages of `source` in order, checked as they stream by (see the module's rules). `seen` carries the
    ids already in an index, so an added file cannot repeat one of them."""
    table = open_table(source, split=split, config=config, stream=True)  # a corpus is never held whole
    text = pick_columns(table, text_col, want_pair=False, want_label=False).text
    for col, what in ((id_col, "ids"), (title_col, "titles")):
        if col is not None:
            table.require(col, what)
    id_col = id_col if id_col is not None else _first_present(table, ID_COLUMNS)
    title_col = title_col if title_col is not None else _first_present(table, TITLE_COLUMNS)
    if require_ids and id_col is None:
        raise BertforgeError(f"{table.name}: the passages have no id column (expected one of "
                             f"{', '.join(ID_COLUMNS)}; name the id column)")
    name = Path(table.name).name
    seen = set() if seen is None else seen
    any_kept = False
    for n, row in enumerate(table, 1):
        body = tables.text_value(row, text)
        if not body.strip():
            continue
        pid = str(value(row, id_col)) if id_col is not None else f"{name}:{n}"
        if not pid.strip():
            raise BertforgeError(f"{row.where}: empty passage id")
        if pid in seen:
            raise BertforgeError(f"{row.where}: duplicate passage id {pid!r}")
        seen.add(pid)
        title = "" if title_col is None else str(value(row, title_col, required=False) or "")
        any_kept = True
        yield Passage(pid, title, body, row.where)
    if not any_kept:
        raise BertforgeError(f"{table.name}: empty corpus (no passage with text)")


def read_passages(source: Any, **options: Any) -> Passages:
    """Every passage of `source` (the options of `iter_passages`)."""
    out = Passages()
    for p in iter_passages(source, **options):
        out.append(p)
    return out


def with_title(title: str, text: str) -> str:
    """The text a dense encoder or BM25 sees for a passage: its title, then its text (DPR encodes the pair; a
    single string keeps one encoder call for every method)."""
    return f"{title}. {text}" if title else text
