"""GLUE readers: SST-2, CoLA, MRPC, STS-B, RTE, QNLI (the GLUE tsv files) and MNLI / SNLI (jsonl); each also reads
its columns from any other source `bertforge.io.tables.open_table` takes (the Hub's Parquet, a saved dataset, ...),
and takes other column names for them.

Each returns a list of ``TextExample``; a GLUE test split (no label column) gives unlabelled examples.
Malformed input raises ``BertforgeError("<file>:<line>: <what>")``.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io.read import tsv_rows
from bertforge.io.tables import Columns, file_format, open_table, pick_columns, value
from bertforge.labels import NLI2_LABELS, NLI3_LABELS
from bertforge.tasks.examples import TextExample, class_label, text_field
from bertforge.tasks.table import table_examples

log = logging.getLogger(__name__)


def read_glue(source: Any, text_col: Any, pair_col: Any, label_col: Any,
              labels: Sequence[str] | None) -> list[TextExample]:
    """A GLUE task's table (its tsv, or the same columns in any source `io.tables.open_table` takes). A table
    without ``label_col`` (a GLUE test split) gives unlabelled examples, as does the Hub's label -1. ``labels`` None
    means the label column holds a float score (regression); an integer label indexes ``labels``."""
    table = open_table(source)
    cols = pick_columns(table, text_col, pair_col, want_label=False)
    label = label_col if label_col is not None and table.has(label_col) else None
    examples, _ = table_examples(table, Columns(cols.text, cols.pair, label), labels, regression=labels is None,
                                 label_ids=True)
    return examples


def read_sst2(source: Any, text_col: Any = "sentence", pair_col: Any = None,
              label_col: Any = "label") -> list[TextExample]:
    """SST-2: ``sentence<TAB>label`` with a header (test split: ``index<TAB>sentence``)."""
    return read_glue(source, text_col, pair_col, label_col, ("0", "1"))


def read_cola(source: Any, text_col: Any = "sentence", pair_col: Any = None,
              label_col: Any = "label") -> list[TextExample]:
    """CoLA: GLUE's tsv has no header, ``source<TAB>label<TAB>original mark<TAB>sentence``; its test split, and
    CoLA elsewhere (the Hub's columns sentence, label), have a header."""
    if not _headerless_cola(source):
        return read_glue(source, text_col, pair_col, label_col, ("0", "1"))
    table = open_table(source, header=False)
    out: list[TextExample] = []
    for row in table:
        if len(row) != 4:
            raise BertforgeError(f"{row.where}: expected 4 columns, found {len(row)}")
        out.append(TextExample(text=text_field(row[3], row.where, "sentence"),
                               label=class_label(row[1], ("0", "1"), row.where), guid=f"{table.stem}-{len(out)}"))
    return out


def _headerless_cola(source: Any) -> bool:
    """A .tsv whose first line names no columns (GLUE's CoLA train and dev files)."""
    if not isinstance(source, (str, Path)) or file_format(source) != "tsv":
        return False
    first = next(iter(tsv_rows(source)), None)
    return first is not None and "sentence" not in [c.strip() for c in first[1]]


def read_mrpc(source: Any, text_col: Any = "#1 String", pair_col: Any = "#2 String",
              label_col: Any = "Quality") -> list[TextExample]:
    """MRPC (GLUE tsv): ``Quality  #1 ID  #2 ID  #1 String  #2 String``; label 1 = paraphrase."""
    return read_glue(source, text_col, pair_col, label_col, ("0", "1"))


def read_stsb(source: Any, text_col: Any = "sentence1", pair_col: Any = "sentence2",
              label_col: Any = "score") -> list[TextExample]:
    """STS-B (GLUE tsv, 10 columns): columns looked up by the header names sentence1, sentence2, score (the Hub's
    copy calls the score label)."""
    if label_col == "score" and not open_table(source).has("score"):
        label_col = "label"
    return read_glue(source, text_col, pair_col, label_col, None)


def read_rte(source: Any, text_col: Any = "sentence1", pair_col: Any = "sentence2",
             label_col: Any = "label") -> list[TextExample]:
    """RTE: ``index  sentence1  sentence2  label`` (entailment / not_entailment)."""
    return read_glue(source, text_col, pair_col, label_col, NLI2_LABELS)


def read_qnli(source: Any, text_col: Any = "question", pair_col: Any = "sentence",
              label_col: Any = "label") -> list[TextExample]:
    """QNLI: ``index  question  sentence  label`` (entailment / not_entailment)."""
    return read_glue(source, text_col, pair_col, label_col, NLI2_LABELS)


def read_nli_jsonl(source: Any, text_col: Any = "premise", pair_col: Any = "hypothesis",
                   label_col: Any = "label") -> list[TextExample]:
    """MNLI / SNLI: ``{"premise", "hypothesis", "label"}`` (jsonl, or any table of those columns); label a string or
    an index into ``NLI3_LABELS`` (``gold_label`` when there is no ``label``). Examples without a gold label
    (SNLI's ``"-"``, or -1) are skipped with a warning."""
    table = open_table(source)
    cols = pick_columns(table, text_col, pair_col, want_label=False)
    out: list[TextExample] = []
    skipped = 0
    for row in table:
        raw = row.get(label_col, row.get("gold_label"))
        if raw in ("-", -1):
            skipped += 1
            continue
        out.append(
            TextExample(
                text=text_field(value(row, cols.text), row.where, str(cols.text)),
                text_pair=text_field(value(row, cols.pair), row.where, str(cols.pair)),
                label=None if raw is None else class_label(raw, NLI3_LABELS, row.where),
                guid=str(row.get("pairID", row.get("id", f"{table.stem}-{len(out)}"))),
            )
        )
    if skipped:
        log.warning("%s: skipped %d examples without a gold label ('-')", table.name, skipped)
    return out
