"""Data in memory as tables: a list of strings (one text each), a list of dicts, a pandas DataFrame, a pyarrow
Table, a datasets Dataset (a DatasetDict, or a dict of split name -> data, with a split)."""
from __future__ import annotations

from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io.hubdata import choose_split, dataset_table
from bertforge.io.rows import Row, Table, refuse_twice


def memory_table(data: Any, split: str | None, name: str | None = None) -> Table:
    """Data in memory as a table, called `name` in messages (by default for what it is: "DataFrame", "texts"...)."""
    module = type(data).__module__.split(".")[0]
    if module == "datasets":
        return dataset_table(data, name or type(data).__name__, split)
    if isinstance(data, dict):  # split name -> data
        chosen, chosen_name, stem = choose_split(data, name or "the data", split)
        table = memory_table(chosen, None, chosen_name)
        table.stem = stem
        return table
    if module == "pandas" and hasattr(data, "to_dict"):
        columns = list(map(_column_name, data.columns))
        refuse_twice(columns, name or "DataFrame", "the columns name")
        return _records_table(name or "DataFrame", _dataframe_records(data), columns)
    if module == "pyarrow" and hasattr(data, "to_pylist"):
        refuse_twice(list(data.column_names), name or "pyarrow Table", "the schema names the column")
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
