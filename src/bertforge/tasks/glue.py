"""GLUE readers: SST-2, CoLA, MRPC, STS-B, RTE, QNLI (the GLUE tsv files) and MNLI / SNLI (jsonl).

Each returns a list of ``TextExample``; a GLUE test split (no label column) gives unlabelled examples.
Malformed input raises ``BertforgeError("<file>:<line>: <what>")``. Standard library only.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from bertforge.errors import BertforgeError
from bertforge.io.read import jsonl_rows, tsv_rows
from bertforge.io.read import where as _where  # `where` is the usual local name for a file:line string here
from bertforge.labels import NLI2_LABELS, NLI3_LABELS
from bertforge.tasks.examples import Label, TextExample, class_label, float_label, text_field

log = logging.getLogger(__name__)


def _read_header_tsv(
    path: str | Path,
    text_col: str,
    pair_col: str | None,
    label_col: str,
    labels: Sequence[str] | None,
) -> list[TextExample]:
    """A GLUE tsv whose first line names the columns. A file without ``label_col`` (a GLUE test split) gives
    unlabelled examples. ``labels`` None means the label column holds a float score (regression)."""
    rows = tsv_rows(path)
    try:
        _, header = next(rows)
    except StopIteration:
        raise BertforgeError(f"{path}: empty file") from None
    header = [h.strip() for h in header]
    cols = {h: i for i, h in enumerate(header)}
    for need in (text_col, pair_col):
        if need is not None and need not in cols:
            raise BertforgeError(f"{_where(path, 1)}: header has no column {need!r} (found {', '.join(header)})")
    li = cols.get(label_col)
    out = []
    for n, row in rows:
        where = _where(path, n)
        if len(row) != len(header):
            raise BertforgeError(f"{where}: expected {len(header)} columns, found {len(row)}")
        label: Label = None
        if li is not None:
            label = float_label(row[li], where) if labels is None else class_label(row[li], labels, where)
        out.append(
            TextExample(
                text=text_field(row[cols[text_col]], where, text_col),
                text_pair=text_field(row[cols[pair_col]], where, pair_col) if pair_col else None,
                label=label,
                guid=f"{Path(path).stem}-{len(out)}",
            )
        )
    return out


def read_sst2(path: str | Path) -> list[TextExample]:
    """SST-2: ``sentence<TAB>label`` with a header (test split: ``index<TAB>sentence``)."""
    return _read_header_tsv(path, "sentence", None, "label", ("0", "1"))


def read_cola(path: str | Path) -> list[TextExample]:
    """CoLA: no header, ``source<TAB>label<TAB>original mark<TAB>sentence``. The GLUE test split instead has
    an ``index<TAB>sentence`` header and no labels."""
    rows = tsv_rows(path)
    out: list[TextExample] = []
    for n, row in rows:
        where = _where(path, n)
        if not out and n == 1 and [c.strip() for c in row] == ["index", "sentence"]:
            return _read_header_tsv(path, "sentence", None, "label", ("0", "1"))
        if len(row) != 4:
            raise BertforgeError(f"{where}: expected 4 columns, found {len(row)}")
        out.append(
            TextExample(
                text=text_field(row[3], where, "sentence"),
                label=class_label(row[1], ("0", "1"), where),
                guid=f"{Path(path).stem}-{len(out)}",
            )
        )
    return out


def read_mrpc(path: str | Path) -> list[TextExample]:
    """MRPC (GLUE tsv): ``Quality  #1 ID  #2 ID  #1 String  #2 String``; label 1 = paraphrase."""
    return _read_header_tsv(path, "#1 String", "#2 String", "Quality", ("0", "1"))


def read_stsb(path: str | Path) -> list[TextExample]:
    """STS-B (GLUE tsv, 10 columns): columns looked up by the header names sentence1, sentence2, score."""
    return _read_header_tsv(path, "sentence1", "sentence2", "score", None)


def read_rte(path: str | Path) -> list[TextExample]:
    """RTE: ``index  sentence1  sentence2  label`` (entailment / not_entailment)."""
    return _read_header_tsv(path, "sentence1", "sentence2", "label", NLI2_LABELS)


def read_qnli(path: str | Path) -> list[TextExample]:
    """QNLI: ``index  question  sentence  label`` (entailment / not_entailment)."""
    return _read_header_tsv(path, "question", "sentence", "label", NLI2_LABELS)


def read_nli_jsonl(path: str | Path) -> list[TextExample]:
    """MNLI / SNLI jsonl ``{"premise", "hypothesis", "label"}``; label a string or an index into
    ``NLI3_LABELS``. Examples without a gold label (SNLI's ``"-"``, or -1) are skipped with a warning."""
    out: list[TextExample] = []
    skipped = 0
    for n, obj in jsonl_rows(path):
        where = _where(path, n)
        raw = obj.get("label", obj.get("gold_label"))
        if raw in ("-", -1):
            skipped += 1
            continue
        for key in ("premise", "hypothesis"):
            if key not in obj:
                raise BertforgeError(f"{where}: missing field {key!r}")
        out.append(
            TextExample(
                text=text_field(obj["premise"], where, "premise"),
                text_pair=text_field(obj["hypothesis"], where, "hypothesis"),
                label=None if raw is None else class_label(raw, NLI3_LABELS, where),
                guid=str(obj.get("pairID", obj.get("id", f"{Path(path).stem}-{len(out)}"))),
            )
        )
    if skipped:
        log.warning("%s: skipped %d examples without a gold label ('-')", path, skipped)
    return out
