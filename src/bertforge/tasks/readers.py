"""Readers for fine-tuning data: GLUE-style sentence (pair) tasks, CoNLL tagging, SWAG multiple choice.

Every reader returns a list of plain dataclass examples; labels stay as the *strings* found in the file
(classification) or floats (regression), and the feature builders in ``bertforge.tasks.features`` map them to
ids through a label list. Malformed input raises ``BertforgeError("<file>:<line>: <what>")``.

``TASKS`` describes each GLUE-style task (reader, label list, metrics, main metric, usual file names), so a
trainer can do::

    spec = get_task("sst-2")
    train = spec.read(data_dir / "glue/SST-2/train.tsv")
    metrics = compute_metrics(spec.name, preds, labels)     # bertforge.tasks.metrics

Only the standard library is imported here, so importing readers is cheap.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bertforge.errors import BertforgeError
from bertforge.files import csv_rows, jsonl_rows, require_file, tsv_rows
from bertforge.files import where as _where  # `where` is the usual local name for a file:line string here
from bertforge.labels import NLI2_LABELS, NLI3_LABELS

log = logging.getLogger(__name__)

Label = str | float | None


# ----------------------------------------------------------------------------------------------- examples


@dataclass
class TextExample:
    """One sentence or sentence pair. ``label``: a label string, a float (regression) or None (unlabelled)."""

    text: str
    text_pair: str | None = None
    label: Label = None
    guid: str = ""


@dataclass
class TaggingExample:
    """One pre-tokenised sentence with one tag per word (``tags`` empty when unlabelled)."""

    tokens: list[str]
    tags: list[str] = field(default_factory=list)
    guid: str = ""


@dataclass
class ChoiceExample:
    """A context and candidate endings; the model scores ``(context, ending_i)`` pairs. ``label``: the gold index."""

    context: str
    endings: list[str]
    label: int | None = None
    guid: str = ""


# ----------------------------------------------------------------------------------------------- low-level


def _text(value: object, where: str, name: str) -> str:
    if value is None or not isinstance(value, str | int | float) or not str(value).strip():
        raise BertforgeError(f"{where}: empty {name}")
    return str(value).strip()


def _class_label(value: object, labels: Sequence[str], where: str) -> str:
    """Map a raw label (string, or int index into ``labels``) to its label string, or raise."""
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        if 0 <= value < len(labels):
            return labels[value]
    else:
        s = str(value).strip()
        if s in labels:
            return s
    raise BertforgeError(f"{where}: unknown label {value!r} (expected one of {', '.join(labels)})")


def _float_label(value: object, where: str) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise BertforgeError(f"{where}: expected a number for the score, found {value!r}") from None


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
            label = _float_label(row[li], where) if labels is None else _class_label(row[li], labels, where)
        out.append(
            TextExample(
                text=_text(row[cols[text_col]], where, text_col),
                text_pair=_text(row[cols[pair_col]], where, pair_col) if pair_col else None,
                label=label,
                guid=f"{Path(path).stem}-{len(out)}",
            )
        )
    return out


# ----------------------------------------------------------------------------------------------- GLUE


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
                text=_text(row[3], where, "sentence"),
                label=_class_label(row[1], ("0", "1"), where),
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
                text=_text(obj["premise"], where, "premise"),
                text_pair=_text(obj["hypothesis"], where, "hypothesis"),
                label=None if raw is None else _class_label(raw, NLI3_LABELS, where),
                guid=str(obj.get("pairID", obj.get("id", f"{Path(path).stem}-{len(out)}"))),
            )
        )
    if skipped:
        log.warning("%s: skipped %d examples without a gold label ('-')", path, skipped)
    return out


# ----------------------------------------------------------------------------------------------- generic


def _sorted_labels(values: set[str]) -> list[str]:
    """Sort label strings; numerically when every label is an integer (so "10" comes after "2")."""
    if all(re.fullmatch(r"-?\d+", v) for v in values):
        return sorted(values, key=int)
    return sorted(values)


def read_table(
    path: str | Path,
    text_col: str | int,
    text_pair_col: str | int | None = None,
    label_col: str | int | None = None,
    label_list: Sequence[str] | None = None,
    regression: bool = False,
    fmt: str | None = None,
    header: bool = True,
) -> tuple[list[TextExample], list[str] | None]:
    """Read any CSV / TSV / JSONL file with a column mapping.

    ``fmt``: "csv", "tsv" or "jsonl" (default: from the extension; ``.json`` is read as JSONL). TSV is read
    GLUE-style (no quoting), CSV with standard quoting. Columns are header names (or integer positions when
    ``header=False``); JSONL uses keys. Labels are kept as strings and collected into a sorted label list
    unless ``label_list`` is given (then unknown labels raise). ``regression=True`` parses float labels and
    returns ``None`` as the label list. Returns ``(examples, label_list)``.
    """
    p = require_file(path)
    fmt = (fmt or p.suffix.lstrip(".")).lower()
    if fmt == "json":
        fmt = "jsonl"
    if fmt not in ("csv", "tsv", "jsonl"):
        raise BertforgeError(f"{p}: unknown format {fmt!r} (use csv, tsv or jsonl)")

    def records() -> Iterator[tuple[int, Callable[[str | int], object]]]:
        if fmt == "jsonl":
            for n, obj in jsonl_rows(p):
                yield n, lambda k, obj=obj, n=n: _field_json(obj, k, _where(p, n))
            return
        rows = tsv_rows(p) if fmt == "tsv" else csv_rows(p, ",")
        cols: dict[str | int, int] | None = None
        width = None
        for n, row in rows:
            if cols is None:
                if header:
                    names = [h.strip() for h in row]
                    cols, width = {h: i for i, h in enumerate(names)}, len(names)
                    for c in (text_col, text_pair_col, label_col):
                        if c is not None and c not in cols:
                            raise BertforgeError(f"{_where(p, n)}: header has no column {c!r}")
                    continue
                cols, width = {}, len(row)
            if len(row) != width:
                raise BertforgeError(f"{_where(p, n)}: expected {width} columns, found {len(row)}")
            yield n, lambda k, row=row, cols=cols: row[cols[k] if header else int(k)]

    examples: list[TextExample] = []
    seen: set[str] = set()
    for n, get in records():
        where = _where(p, n)
        label: Label = None
        if label_col is not None:
            raw = get(label_col)
            if regression:
                label = _float_label(raw, where)
            elif label_list is not None:
                label = _class_label(str(raw), label_list, where)
            else:
                label = _text(raw, where, f"label {label_col!r}")
                seen.add(label)
        pair = None if text_pair_col is None else _text(get(text_pair_col), where, f"text {text_pair_col!r}")
        text = _text(get(text_col), where, f"text {text_col!r}")
        examples.append(TextExample(text, pair, label, guid=f"{p.stem}-{len(examples)}"))
    if regression or label_col is None:
        return examples, None
    return examples, list(label_list) if label_list is not None else _sorted_labels(seen)


def _field_json(obj: dict, key: str | int, where: str) -> object:
    if key not in obj:
        raise BertforgeError(f"{where}: missing field {key!r}")
    v = obj[key]
    return int(v) if isinstance(v, bool) else v


# ----------------------------------------------------------------------------------------------- CoNLL


def detect_tag_scheme(tag_seqs: Sequence[Sequence[str]]) -> str:
    """"iob1" when some ``I-X`` begins a chunk (follows O or another type), else "iob2"."""
    for tags in tag_seqs:
        prev = "O"
        for t in tags:
            if t.startswith("I-") and prev[2:] != t[2:]:
                return "iob1"
            prev = t
    return "iob2"


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """IOB1 (B- only between adjacent same-type chunks) to IOB2 (every chunk starts with B-)."""
    out = []
    prev = "O"
    for t in tags:
        if t.startswith("I-") and prev[2:] != t[2:]:
            t = "B-" + t[2:]
        out.append(t)
        prev = t
    return out


def read_conll(path: str | Path, tag_col: int | None = -1, scheme: str = "auto") -> list[TaggingExample]:
    """CoNLL-2003 style: one ``token POS chunk NER`` line per word (whitespace separated), a blank line between
    sentences, ``-DOCSTART-`` lines skipped. ``tag_col`` picks the tag column (default -1, the last: NER; 1
    POS, 2 chunk; None for an untagged token-per-line file). ``scheme``: "auto" converts to IOB2 when IOB1 is
    detected, "iob1" always converts, "iob2" keeps the tags as they are."""
    if scheme not in ("auto", "iob1", "iob2"):
        raise BertforgeError(f"unknown tag scheme {scheme!r} (use auto, iob1 or iob2)")
    p = require_file(path)
    sents: list[TaggingExample] = []
    tokens: list[str] = []
    tags: list[str] = []
    width = None

    def flush() -> None:
        if tokens:
            sents.append(TaggingExample(list(tokens), list(tags), guid=f"{p.stem}-{len(sents)}"))
            tokens.clear()
            tags.clear()

    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                flush()
                continue
            if parts[0] == "-DOCSTART-":
                flush()
                continue
            if width is None:
                width = len(parts)
            if len(parts) != width:
                raise BertforgeError(f"{_where(p, n)}: expected {width} columns, found {len(parts)}")
            if tag_col is None:
                tokens.append(parts[0])
                continue
            if width < 2 or not -width <= tag_col < width or tag_col in (0, -width):
                raise BertforgeError(f"{_where(p, n)}: no tag column {tag_col} in a line of {width} columns")
            tokens.append(parts[0])
            tags.append(parts[tag_col])
    flush()
    if tag_col is not None and scheme != "iob2":
        if scheme == "iob1" or detect_tag_scheme([s.tags for s in sents]) == "iob1":
            for s in sents:
                s.tags = iob1_to_iob2(s.tags)
    return sents


def tag_list(examples: Sequence[TaggingExample]) -> list[str]:
    """All tags seen, "O" first, then sorted by entity type and B before I (stable ids across runs)."""
    tags = {t for ex in examples for t in ex.tags}
    rest = sorted(tags - {"O"}, key=lambda t: (t[2:], t[:2]))
    return ["O", *rest]


# ----------------------------------------------------------------------------------------------- SWAG


SWAG_COLUMNS = ("video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source")


def read_swag(path: str | Path, num_choices: int = 4) -> list[ChoiceExample]:
    """SWAG: the official CSV (``video-id, fold-ind, startphrase, sent1, sent2, gold-source, ending0..3,
    label``; context = sent1, ending i = ``sent2 + " " + ending_i`` as in BERT's SWAG setup) or JSONL
    ``{"context", "endings": [...], "label"}``. ``label`` absent means unlabelled (test split)."""
    p = require_file(path)
    out: list[ChoiceExample] = []
    if p.suffix.lower() in (".jsonl", ".json"):
        for n, obj in jsonl_rows(p):
            where = _where(p, n)
            endings = obj.get("endings")
            if not isinstance(endings, list) or len(endings) < 2:
                raise BertforgeError(f"{where}: 'endings' must be a list of at least 2 strings")
            out.append(
                ChoiceExample(
                    context=_text(obj.get("context"), where, "context"),
                    endings=[_text(e, where, f"ending {i}") for i, e in enumerate(endings)],
                    label=_choice_label(obj.get("label"), len(endings), where),
                    guid=str(obj.get("id", f"{p.stem}-{len(out)}")),
                )
            )
        return out

    rows = csv_rows(p, ",")
    try:
        _, header = next(rows)
    except StopIteration:
        raise BertforgeError(f"{p}: empty file") from None
    cols = {h.strip(): i for i, h in enumerate(header)}
    need = ["sent1", "sent2"] + [f"ending{i}" for i in range(num_choices)]
    missing = [c for c in need if c not in cols]
    if missing:
        raise BertforgeError(f"{_where(p, 1)}: header has no column(s) {', '.join(missing)}")
    for n, row in rows:
        where = _where(p, n)
        if len(row) != len(header):
            raise BertforgeError(f"{where}: expected {len(header)} columns, found {len(row)}")
        sent2 = row[cols["sent2"]].strip()
        endings = [_text(row[cols[f"ending{i}"]], where, f"ending{i}") for i in range(num_choices)]
        out.append(
            ChoiceExample(
                context=_text(row[cols["sent1"]], where, "sent1"),
                endings=[f"{sent2} {e}".strip() for e in endings],
                label=_choice_label(row[cols["label"]], num_choices, where) if "label" in cols else None,
                guid=row[cols["fold-ind"]] if "fold-ind" in cols else f"{p.stem}-{len(out)}",
            )
        )
    return out


def _choice_label(raw: object, num_choices: int, where: str) -> int | None:
    if raw is None:
        return None
    try:
        i = int(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise BertforgeError(f"{where}: label must be an integer, found {raw!r}") from None
    if not 0 <= i < num_choices:
        raise BertforgeError(f"{where}: label {i} out of range for {num_choices} choices")
    return i


# ----------------------------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class TaskSpec:
    """How to read and score one sentence (pair) classification / regression task.

    ``labels`` None means regression (one float output). ``files`` maps split names to the usual paths
    relative to the shared data directory (informational; pass any path to ``read``)."""

    name: str
    reader: Callable[[str | Path], list[TextExample]]
    labels: tuple[str, ...] | None
    metrics: tuple[str, ...]
    main_metric: str
    files: dict[str, str] = field(default_factory=dict)

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def num_labels(self) -> int:
        return 1 if self.labels is None else len(self.labels)

    def read(self, path: str | Path) -> list[TextExample]:
        return self.reader(path)


def _glue(folder: str, splits: Sequence[str] = ("train", "dev")) -> dict[str, str]:
    return {s: f"glue/{folder}/{s}.tsv" for s in splits}


TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in [
        TaskSpec("sst2", read_sst2, ("0", "1"), ("accuracy",), "accuracy", _glue("SST-2")),
        TaskSpec("cola", read_cola, ("0", "1"), ("mcc", "accuracy"), "mcc", _glue("CoLA")),
        TaskSpec("mrpc", read_mrpc, ("0", "1"), ("f1", "accuracy"), "f1", _glue("MRPC")),
        TaskSpec("stsb", read_stsb, None, ("pearson", "spearman"), "spearman", _glue("STS-B")),
        TaskSpec("rte", read_rte, NLI2_LABELS, ("accuracy",), "accuracy", _glue("RTE")),
        TaskSpec("qnli", read_qnli, NLI2_LABELS, ("accuracy",), "accuracy", _glue("QNLI", ("dev",))),
        TaskSpec("mnli", read_nli_jsonl, NLI3_LABELS, ("accuracy",), "accuracy", {"dev": "mnli/dev_matched.jsonl"}),
        TaskSpec("snli", read_nli_jsonl, NLI3_LABELS, ("accuracy",), "accuracy", {"dev": "snli/dev.jsonl"}),
    ]
}


def get_task(name: str) -> TaskSpec:
    """Look a task up by name, ignoring case, '-' and '_' ("SST-2", "sst_2" and "sst2" all work)."""
    key = re.sub(r"[-_\s]", "", name.lower())
    if key == "stsbenchmark":
        key = "stsb"
    if key not in TASKS:
        raise BertforgeError(f"unknown task {name!r} (known: {', '.join(TASKS)})")
    return TASKS[key]
