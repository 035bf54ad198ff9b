"""Prediction inputs: the unlabelled examples `bertforge predict` reads, one function per task kind. Every input is a
source `bertforge.io.tables.open_table` takes (a CSV / TSV / JSONL / JSON / Parquet file, a saved or hub dataset,
data in memory) or lines of text:

  classify / regress: the text (and pair) columns: --text-col / --text-pair-col, else the columns the model was
                      trained on where the input has them, else the usual ones (text / text_pair, sentence1 /
                      sentence2, ..., sentence); lines of text (a tab separates a pair)
  tag:                a CoNLL file (.conll, or a .txt / .tsv with blank-line separators), lines of text split
                      on whitespace (.txt / .tsv without them), or a "tokens" (or "words") column of word lists
  qa:                 "question" and "context" columns, or a SQuAD .json file
  choice:             SWAG csv, or "context" and "endings" columns
An example's id is its "id" column where there is one, else its row's number counting from 1 (a text file's line).
Labels found in a file are dropped: predictions never see them.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io.read import text_lines, uncompressed_name
from bertforge.io.tables import Columns, Row, Table, open_table, pick_columns, value
from bertforge.tasks.conll import read_conll
from bertforge.tasks.examples import ChoiceExample, TaggingExample, TextExample, text_field
from bertforge.tasks.swag import read_swag


def numbered(table: Table) -> Iterator[tuple[str, Row]]:
    """(id, row) of each row: the "id" column's value, else the row's number counting from 1."""
    for n, row in enumerate(table, 1):
        yield str(row["id"]) if row.get("id") is not None else str(n), row


def input_columns(table: Table, text_col: Any, text_pair_col: Any, known: tuple[Any, Any] | None,
                  label_col: Any = None, labelled: bool = False) -> Columns:
    """The text (pair) columns of an input: those given, else `known` (the columns a model was trained on) where
    the input has them, else the usual ones; with `labelled`, the label column too."""
    if text_col is None and known and known[0] is not None and all(c is None or table.has(c) for c in known):
        text_col, text_pair_col = known
    return pick_columns(table, text_col, text_pair_col, label_col, want_label=labelled)


def text_inputs(source: Any, text_col: Any = None, text_pair_col: Any = None,
                known: tuple[Any, Any] | None = None) -> list[TextExample]:
    """Sentences (pairs) to classify or score."""
    table = open_table(source)
    out = []
    if table.plain:  # lines of text: a tab separates a pair; blank lines are no inputs
        for n, row in enumerate(table, 1):
            if not row["text"].strip():
                continue
            parts = row["text"].split("\t")
            if len(parts) > 2:
                raise BertforgeError(f"{row.where}: expected a text or a text<TAB>pair, found {len(parts)} fields")
            out.append(TextExample(parts[0].strip(), parts[1].strip() if len(parts) == 2 else None, None, str(n)))
        return out
    cols = input_columns(table, text_col, text_pair_col, known)
    for guid, row in numbered(table):
        pair = None if cols.pair is None else text_field(value(row, cols.pair), row.where, f"text {cols.pair!r}")
        out.append(TextExample(text_field(value(row, cols.text), row.where, f"text {cols.text!r}"), pair, None, guid))
    return out


def is_conll_file(source: Any) -> bool:
    """Whether `source` is a file in the tagging kind's own formats (.conll, .txt, .tsv: CoNLL-style token lines),
    not a table; compressed too."""
    return isinstance(source, (str, Path)) and Path(uncompressed_name(source)).suffix in (".conll", ".txt", ".tsv")


def _looks_conll(path: Path) -> bool:
    """A token-per-line file: blank lines separate its sentences, or it has -DOCSTART- lines (first 50 lines)."""
    for n, line in text_lines(path, skip_blank=False):
        if not line.strip() or line.startswith("-DOCSTART-"):
            return True
        if n >= 50:
            break
    return False


def tagging_inputs(source: Any) -> list[TaggingExample]:
    """Pre-tokenised sentences to tag."""
    if is_conll_file(source):
        path = Path(source)
        if Path(uncompressed_name(path)).suffix == ".conll" or _looks_conll(path):
            return [TaggingExample(ex.tokens, [], ex.guid) for ex in read_conll(path, tag_col=None)]
        # no sentence breaks: a sentence a line, split on whitespace
        return [TaggingExample(line.split(), [], str(n)) for n, line in text_lines(path)]
    table = open_table(source)
    if table.plain:
        return [TaggingExample(row["text"].split(), [], guid) for guid, row in numbered(table) if row["text"].strip()]
    column = "tokens" if table.has("tokens") or not table.has("words") else "words"
    out = []
    for guid, row in numbered(table):
        tokens = value(row, column)
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) and t for t in tokens):
            raise BertforgeError(f"{row.where}: {column!r} must be a non-empty list of strings")
        out.append(TaggingExample(tokens, [], guid))
    return out


def qa_inputs(source: Any) -> list:
    """Questions with their contexts (SquadExample; answers in the input are not looked at)."""
    from bertforge.tasks.squad import read_squad  # numpy and torch: only when predicting QA

    return read_squad(source)


def choice_inputs(source: Any) -> list[ChoiceExample]:
    """Contexts with candidate endings."""
    return [ChoiceExample(ex.context, ex.endings, None, ex.guid) for ex in read_swag(source)]
