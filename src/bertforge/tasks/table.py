"""Sentence (pair) examples from any table (CSV, TSV, JSONL, JSON, Parquet, a saved or hub dataset, data in memory),
read with a column mapping: the generic classify / regress reader, and the GLUE readers' too.

Malformed input raises ``BertforgeError("<file>:<line>: <what>")`` (``<source> row <i>`` where there are no lines).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io.read import warn
from bertforge.io.tables import Columns, Table, open_table, pick_columns, value
from bertforge.tasks.examples import BOOLEANS, Label, TextExample, class_label, float_label, normal_label, text_field

_MISSING = {"nan", "inf", "-inf", "infinity", "-infinity"}


def _sorted_labels(values: set[str]) -> list[str]:
    """Sort label strings; numerically when every label is an integer (so "10" comes after "2")."""
    if all(re.fullmatch(r"-?\d+", v) for v in values):
        return sorted(values, key=int)
    return sorted(values)


def read_table(
    source: Any,
    text_col: Any = None,
    text_pair_col: Any = None,
    label_col: Any = None,
    label_list: Sequence[str] | None = None,
    regression: bool = False,
    header: bool = True,
) -> tuple[list[TextExample], list[str] | None]:
    """Read a table (any source `bertforge.io.tables.open_table` takes) with a column mapping.

    Columns are names (or integer positions when ``header=False``); without ``text_col`` the usual ones are found
    (``pick_columns``: text / text_pair, sentence1 / sentence2, ..., and a label column label, score, ...).
    Labels are kept as strings and collected into a sorted label list unless ``label_list`` is given (then
    unknown labels raise). ``regression=True`` parses float labels and returns ``None`` as the label list.
    Returns ``(examples, label_list)``."""
    table = open_table(source, header=header)
    columns = pick_columns(table, text_col, text_pair_col, label_col)
    return table_examples(table, columns, label_list, regression)


def table_examples(table: Table, columns: Columns, label_list: Sequence[str] | None = None, regression: bool = False,
                   label_ids: bool = False) -> tuple[list[TextExample], list[str] | None]:
    """The examples of `table` in `columns` (`read_table`'s). `label_ids`: an integer label is an index into
    `label_list` (the Hugging Face Hub's class labels; -1 there means unlabelled, as in GLUE's test splits)."""
    examples: list[TextExample] = []
    seen: set[str] = set()
    for row in table:
        where = row.where
        label: Label = None
        raw = None if columns.label is None else value(row, columns.label, required=not table.records)
        if raw is None or (label_ids and raw == -1 and not isinstance(raw, bool)):
            label = None
        elif regression:
            label = float_label(raw, where)
        elif label_list is not None:
            if label_ids and isinstance(raw, float) and raw.is_integer():
                raw = int(raw)  # a class id column with a missing value, as pandas writes it
            label = class_label(raw if label_ids and isinstance(raw, int) else str(raw), label_list, where)
        else:
            label = text_field(int(raw) if isinstance(raw, bool) else raw, where, f"label {columns.label!r}")
            if label.lower() in _MISSING:  # pandas writes a missing label as NaN: it would become a class of its own
                raise BertforgeError(f"{where}: the label {label!r} is a missing value, not a class")
            label = normal_label(raw)
            seen.add(label)
        pair = None if columns.pair is None else text_field(value(row, columns.pair), where, f"text {columns.pair!r}")
        text = text_field(value(row, columns.text), where, f"text {columns.text!r}")
        examples.append(TextExample(text, pair, label, guid=f"{table.stem}-{len(examples)}"))
    if regression or columns.label is None:
        return examples, None
    if label_list is None:
        seen = _one_form(examples, seen, table.name)
    return examples, list(label_list) if label_list is not None else _sorted_labels(seen)


def _one_form(examples: list[TextExample], seen: set[str], name: str) -> set[str]:
    """Labels that mean one class written one way: "true" / "false" among 0 / 1 labels are 1 / 0 (a column of
    booleans and numbers, as a spreadsheet may write it). Numbers that still differ only by form ("0.5" and "0.50")
    are warned about, naming the forms: they train as classes of their own."""
    lowered = {s.lower() for s in seen}
    if lowered & set(BOOLEANS) and seen & {"0", "1"} and lowered <= {"0", "1", *BOOLEANS}:
        for ex in examples:
            ex.label = BOOLEANS.get(str(ex.label).lower(), ex.label)
        seen = {BOOLEANS.get(s.lower(), s) for s in seen}
    by_value: dict[float, list[str]] = {}
    for label in seen:
        try:
            by_value.setdefault(float(label), []).append(label)
        except ValueError:
            pass
    forms = [sorted(group) for group in by_value.values() if len(group) > 1]
    if forms:
        shown = "; ".join(" and ".join(map(repr, group)) for group in sorted(forms))
        warn(f"{name}: the labels {shown} are one number written differently, yet each is a class of its own; "
             "write each class one way")
    return seen
