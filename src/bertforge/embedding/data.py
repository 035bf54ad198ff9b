"""Readers for sentence-embedding training and evaluation data, texts to embed and corpora to index, all through
`bertforge.io.tables` (any file format, saved or hub datasets, data in memory).

Accepted layouts of pair data (the reader decides per source; errors name file:line or the row):
  * rows with the columns {"premise", "hypothesis", "label"} (NLI; label a name or an id; SNLI's "-" rows are
    skipped), {"sentence1", "sentence2", "score"|"label"}, {"anchor", "positive"[, "negative"]},
    {"query", "positive"}, or {"texts": [...], "label": ...}: JSONL, JSON, CSV, Parquet, a tsv whose header names
    them (GLUE STS-B: the score column is "score" or "label"), a saved or hub dataset;
  * any table with the columns named by --text-col / --text-pair-col / --label-col (a numeric label: scored pairs;
    an NLI label: NLI pairs);
  * the STS-benchmark layout without a header (sts-test.tsv: genre, file, year, id, score, sentence1, sentence2,
    ...);
  * tsv without a header: `a<TAB>b` (pair), `a<TAB>b<TAB>number` (scored pair), `a<TAB>b<TAB>c` (triplet).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io import tables
from bertforge.io.read import tsv_rows
from bertforge.io.tables import Row, Table, file_format, open_table, pick_columns, value
from bertforge.labels import NLI3_IDS as NLI_LABELS

log = logging.getLogger(__name__)


@dataclass
class Example:
    texts: list[str]
    label: float | int | None = None


@dataclass
class Dataset:
    examples: list[Example] = field(default_factory=list)
    kind: str = "pair"  # "pair" | "scored" | "nli" | "triplet"

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> Example:
        return self.examples[i]


def _float(value: object, where: str) -> float | None:
    """A score, None when `value` is no number (the row is then read as texts); nan / inf is an error, since it
    would otherwise be trained on or scored as `"spearman": NaN`."""
    try:
        score = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if not math.isfinite(score):
        raise BertforgeError(f"{where}: the score {value!r} is not a finite number")
    return score


def _nli_label(value, where: str) -> int | None:
    """A class id in `NLI_LABELS` order (HF's: an integer label indexes NLI3_LABELS); None for rows to skip."""
    if isinstance(value, int) and not isinstance(value, bool):
        # -1 is HF's "no gold label"; anything else outside the classes is a bad row, not a crash in the loss
        return value if 0 <= value < len(NLI_LABELS) else None
    if value == "-" or value is None:  # SNLI: no annotator majority
        return None
    if str(value).lower() not in NLI_LABELS:
        raise BertforgeError(f"{where}: unknown NLI label {value!r} (expected {', '.join(NLI_LABELS)})")
    return NLI_LABELS[str(value).lower()]


def _read_records(table: Table, columns: tuple[Any, Any, Any] | None = None) -> Dataset:
    """Examples from rows with named columns (the layouts in the module docstring), or from `columns` (text, pair,
    label) when named: a numeric label makes scored pairs, an NLI label NLI pairs."""
    ds = Dataset()
    kinds = set()
    skipped = 0
    for row in table:
        where = row.where
        rec = row if columns is None else _column_record(row, columns)
        if "premise" in rec and "hypothesis" in rec:
            label = _nli_label(rec.get("label"), where)
            if label is None:
                skipped += 1
                continue
            kinds.add("nli")
            ds.examples.append(Example([rec["premise"], rec["hypothesis"]], label))
        elif "sentence1" in rec and "sentence2" in rec:
            score = _float(rec.get("score", rec.get("label")), where)
            kinds.add("scored" if score is not None else "pair")
            ds.examples.append(Example([rec["sentence1"], rec["sentence2"]], score))
        elif ("anchor" in rec or "query" in rec) and "positive" in rec:
            texts = [rec.get("anchor", rec.get("query")), rec["positive"]]
            if rec.get("negative") not in (None, ""):
                texts.append(rec["negative"])
            kinds.add("triplet" if len(texts) == 3 else "pair")
            ds.examples.append(Example(texts))
        elif isinstance(rec.get("texts"), list):
            ds.examples.append(Example(list(rec["texts"]), rec.get("label")))
            kinds.add("scored" if rec.get("label") is not None else ("triplet" if len(rec["texts"]) == 3 else "pair"))
        else:
            raise BertforgeError(f"{where}: unrecognised record keys {sorted(map(str, rec))} (expected "
                                 "premise/hypothesis/label, sentence1/sentence2/score, anchor/positive[/negative], "
                                 "query/positive or texts; or name the columns with --text-col / --text-pair-col / "
                                 "--label-col)")
        for t in ds.examples[-1].texts:
            if not isinstance(t, str):
                raise BertforgeError(f"{where}: texts must be strings")
    if skipped:
        log.warning("%s: skipped %d NLI rows without a usable label (\"-\", -1 or an id outside 0..%d)",
                    table.name, skipped, len(NLI_LABELS) - 1)
    return _finish(ds, kinds, table.name)


def _column_record(row: Row, columns: tuple[Any, Any, Any]) -> dict:
    """A row read through named (text, pair, label) columns, in the layout its label makes it: NLI (a label that is
    no number), scored pairs (a number), or pairs (no label)."""
    text, pair, label = columns
    first, second = value(row, text), value(row, pair)
    raw = None if label is None else value(row, label)
    if raw is not None and _float(raw, row.where) is None:
        return {"premise": first, "hypothesis": second, "label": raw}
    return {"sentence1": first, "sentence2": second, "score": raw}


def _read_headerless_tsv(path: Path) -> Dataset:
    """The tsv layouts without a header line: STS-benchmark, pairs, scored pairs, triplets."""
    ds = Dataset()
    kinds = set()
    for no, cols in tsv_rows(path):
        where = f"{path}:{no}"
        if len(cols) >= 7 and _float(cols[4], where) is not None:  # STS-benchmark layout
            texts, score = [cols[5], cols[6]], _float(cols[4], where)
        elif len(cols) == 3 and _float(cols[2], where) is not None:
            texts, score = cols[:2], _float(cols[2], where)
        elif len(cols) in (2, 3):
            texts, score = cols, None
        else:
            raise BertforgeError(f"{where}: expected 2 or 3 tab-separated columns (or the STS-benchmark layout), "
                                 f"got {len(cols)}")
        kinds.add("scored" if score is not None else ("triplet" if len(texts) == 3 else "pair"))
        ds.examples.append(Example(texts, score))
    if ds.examples and kinds <= {"pair", "triplet"}:
        _refuse_labelled(ds, path)
    return _finish(ds, kinds, path)


# Column names of the labelled and paired layouts: a first row made of these is a header, not a pair of texts.
_HEADER_WORDS = {"sentence", "sentence1", "sentence2", "text", "text_a", "text_b", "label", "score", "question",
                 "answer", "premise", "hypothesis", "anchor", "positive", "negative", "query", "id", "index", "idx"}


def _is_header(cells: list[str]) -> bool:
    """A tsv's first line that names columns: it names sentence1 and sentence2 (GLUE's STS-B), or every cell is a
    column name of the labelled and paired layouts."""
    names = [c.strip().lower() for c in cells]
    return {"sentence1", "sentence2"} <= set(names) or all(n in _HEADER_WORDS for n in names)


def _refuse_labelled(ds: Dataset, path: Path) -> None:
    """A classification file (text<TAB>label) read as text pairs would use labels as texts (an mnrl / triplet loss
    takes any pair): refuse it in one line."""
    rows = ds.examples
    if all(_float(t, str(path)) is not None for ex in rows for t in ex.texts[1:]):
        raise BertforgeError(f"{path}: every row's second column is a number (a label?), not a text: a labelled "
                             "file (text<TAB>label) is no pair file for embed-train")


def _finish(ds: Dataset, kinds: set[str], path: Any) -> Dataset:
    if not ds.examples:
        raise BertforgeError(f"{path}: no examples")
    if len(kinds) > 1:
        raise BertforgeError(f"{path}: mixes example kinds {sorted(kinds)}")
    ds.kind = kinds.pop() if kinds else "pair"
    return ds


def read_examples(source: Any, text_col: Any = None, text_pair_col: Any = None, label_col: Any = None) -> Dataset:
    """Read pair / scored-pair / NLI / triplet examples (the layouts in the module docstring) from a file, a saved or
    hub dataset split, or data in memory; `text_col` / `text_pair_col` / `label_col` name the columns instead."""
    if isinstance(source, (str, Path)) and file_format(source) == "tsv" and text_col is None:
        first = next(iter(tsv_rows(source)), None)
        if first is not None and not _is_header(first[1]):
            return _read_headerless_tsv(Path(source))
    table = open_table(source)
    if table.plain:
        raise BertforgeError(f"{table.name}: lines of text are no pairs; embed-train reads a table of pairs (the "
                             "layouts in docs/embeddings.md)")
    if text_col is None and text_pair_col is None and label_col is None:
        return _read_records(table)
    cols = pick_columns(table, text_col, text_pair_col, label_col)
    if cols.pair is None:
        raise BertforgeError(f"{table.name}: embed-train needs a pair of texts; name the second with --text-pair-col")
    return _read_records(table, (cols.text, cols.pair, cols.label))


def read_texts(source: Any, text_col: Any = None) -> list[str]:
    """One text per row (a text file's lines; empty ones are kept as "" so output row i is input row i)."""
    return tables.read_texts(source, text_col)


def read_corpus(source: Any, text_col: Any = None, id_col: Any = None) -> tuple[list[str], list[str]]:
    """(ids, texts) of a corpus: a text file with one passage per line, or any table with a text column
    (`text_col`, default the usual names) and an id column (`id_col`, default "id" where there is one). Without
    ids, a passage is "FILE:N" (N: its line in a text file, its row counting from 1 elsewhere), so adding the same
    file twice is caught as duplicate ids. Empty passages are skipped (an empty passage is never a useful hit)."""
    table = open_table(source)
    column = pick_columns(table, text_col, want_pair=False, want_label=False).text
    if id_col is not None:
        table.require(id_col, "ids")
    id_col = id_col if id_col is not None else ("id" if not table.plain and table.has("id") else None)
    name = Path(table.name).name
    ids: list[str] = []
    texts: list[str] = []
    for n, row in enumerate(table, 1):
        text = tables.text_value(row, column)
        if not text.strip():
            continue
        ids.append(str(value(row, id_col)) if id_col is not None else f"{name}:{n}")
        texts.append(text)
    if not texts:
        raise BertforgeError(f"{table.name}: empty corpus")
    return ids, texts


def read_squad_retrieval(path: str | Path) -> tuple[list[str], list[str], list[set[int]]]:
    """SQuAD v1.1 as retrieval: (questions, unique paragraphs, relevant paragraph ids per question).

    Read by `tasks.squad.read_squad`, which validates the layout (a malformed file is a BertforgeError naming it).
    """
    from bertforge.tasks.squad import read_squad

    passages: list[str] = []
    index: dict[str, int] = {}
    questions: list[str] = []
    relevant: list[set[int]] = []
    for ex in read_squad(path):
        pid = index.setdefault(ex.context, len(passages))
        if pid == len(passages):
            passages.append(ex.context)
        questions.append(ex.question)
        relevant.append({pid})
    return questions, passages, relevant
