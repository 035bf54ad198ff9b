"""Readers for sentence-embedding training and evaluation files.

Accepted layouts (the reader decides per file; errors name file:line):
  * jsonl: {"premise", "hypothesis", "label"} (NLI; label a name or an id; SNLI's "-" rows are skipped),
    {"sentence1", "sentence2", "score"|"label"}, {"anchor", "positive"[, "negative"]}, {"query", "positive"},
    or {"texts": [...], "label": ...};
  * tsv with a header naming sentence1 / sentence2 (GLUE STS-B: the score column is "score" or "label");
  * the STS-benchmark layout (sts-test.tsv: genre, file, year, id, score, sentence1, sentence2[, ...]);
  * plain tsv without header: `a<TAB>b` (pair), `a<TAB>b<TAB>number` (scored pair), `a<TAB>b<TAB>c` (triplet).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

from bertforge.errors import BertforgeError
from bertforge.io.read import jsonl_rows, text_lines
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


def _read_jsonl(path: Path) -> Dataset:
    ds = Dataset()
    kinds = set()
    skipped = 0
    for no, rec in jsonl_rows(path):  # file:line errors for bad UTF-8, bad JSON, non-objects
        where = f"{path}:{no}"
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
            if rec.get("negative") is not None:
                texts.append(rec["negative"])
            kinds.add("triplet" if len(texts) == 3 else "pair")
            ds.examples.append(Example(texts))
        elif isinstance(rec.get("texts"), list):
            ds.examples.append(Example(list(rec["texts"]), rec.get("label")))
            kinds.add("scored" if rec.get("label") is not None else ("triplet" if len(rec["texts"]) == 3 else "pair"))
        else:
            raise BertforgeError(f"{where}: unrecognised record keys {sorted(rec)} "
                                 "(expected premise/hypothesis/label, sentence1/sentence2/score, anchor/positive)")
        for t in ds.examples[-1].texts:
            if not isinstance(t, str):
                raise BertforgeError(f"{where}: texts must be strings")
    if skipped:
        log.warning("%s: skipped %d NLI rows without a usable label (\"-\", -1 or an id outside 0..%d)",
                    path, skipped, len(NLI_LABELS) - 1)
    return _finish(ds, kinds, path)


def _read_tsv(path: Path) -> Dataset:
    ds = Dataset()
    kinds = set()
    header: dict[str, int] | None = None
    for no, line in text_lines(path):
        cols = line.split("\t")
        where = f"{path}:{no}"
        if header is None and not ds.examples and "sentence1" in cols and "sentence2" in cols:
            header = {name: i for i, name in enumerate(cols)}
            continue
        if header is not None:
            score_col = header.get("score", header.get("label"))
            try:
                texts = [cols[header["sentence1"]], cols[header["sentence2"]]]
            except IndexError:
                raise BertforgeError(f"{where}: fewer columns than the header") from None
            score = _float(cols[score_col], where) if score_col is not None and score_col < len(cols) else None
        elif len(cols) >= 7 and _float(cols[4], where) is not None:  # STS-benchmark layout
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
    if header is None and ds.examples and kinds <= {"pair", "triplet"}:
        _refuse_labelled(ds, path)
    return _finish(ds, kinds, path)


# Column names of the labelled and paired layouts: a first row made of these is a header, not a pair of texts.
_HEADER_WORDS = {"sentence", "sentence1", "sentence2", "text", "text_a", "text_b", "label", "score", "question",
                 "answer", "premise", "hypothesis", "anchor", "positive", "negative", "query", "id", "index", "idx"}


def _refuse_labelled(ds: Dataset, path: Path) -> None:
    """A classification file (text<TAB>label, maybe with a header) read as text pairs would train the header and
    use labels as texts (an mnrl / triplet loss takes any pair): refuse it in one line."""
    first = [t.strip().lower() for t in ds.examples[0].texts]
    if all(t in _HEADER_WORDS for t in first):
        raise BertforgeError(f"{path}: the first line ({', '.join(first)}) is a header, but not one naming "
                             "sentence1 / sentence2 columns: embed-train reads pairs of texts (see the layouts in "
                             "docs/embeddings.md)")
    rows = ds.examples
    if all(_float(t, str(path)) is not None for ex in rows for t in ex.texts[1:]):
        raise BertforgeError(f"{path}: every row's second column is a number (a label?), not a text: a labelled "
                             "file (text<TAB>label) is no pair file for embed-train")


def _finish(ds: Dataset, kinds: set[str], path: Path) -> Dataset:
    if not ds.examples:
        raise BertforgeError(f"{path}: no examples")
    if len(kinds) > 1:
        raise BertforgeError(f"{path}: mixes example kinds {sorted(kinds)}")
    ds.kind = kinds.pop() if kinds else "pair"
    return ds


def read_examples(path: str | Path) -> Dataset:
    """Read a pair / scored-pair / NLI / triplet file (see the module docstring for the layouts)."""
    path = Path(path)
    return _read_jsonl(path) if path.suffix in (".jsonl", ".json") else _read_tsv(path)


def read_texts(path: str | Path) -> list[str]:
    """One text per line (UTF-8). Empty lines are kept (as "") so output row i is input line i."""
    path = Path(path)
    if not path.is_file():
        raise BertforgeError(f"{path}: file not found")
    texts = []
    with open(path, "rb") as fh:
        for no, raw in enumerate(fh, 1):
            try:
                texts.append(raw.decode("utf-8").rstrip("\r\n"))
            except UnicodeDecodeError as err:
                raise BertforgeError(f"{path}:{no}: invalid UTF-8 ({err.reason} at byte {err.start})") from None
    return texts


def read_corpus(path: str | Path) -> tuple[list[str], list[str]]:
    """(ids, texts) of a corpus: jsonl {"id", "text"} records (id defaults to the line number), or a text file
    with one passage per line (id = "FILENAME:LINE", so adding the same file twice is caught as duplicate ids).

    Empty lines of a text file are skipped (an empty passage is never a useful search hit).
    """
    path = Path(path)
    ids: list[str] = []
    texts: list[str] = []
    if path.suffix == ".jsonl":
        for no, rec in jsonl_rows(path):
            text = rec.get("text")
            if text is None:
                raise BertforgeError(f"{path}:{no}: expected a JSON object with a \"text\" field")
            if not isinstance(text, str):
                raise BertforgeError(f"{path}:{no}: \"text\" must be a string")
            ids.append(str(rec.get("id", no)))
            texts.append(text)
    else:
        for no, line in text_lines(path):
            ids.append(f"{path.name}:{no}")
            texts.append(line)
    if not texts:
        raise BertforgeError(f"{path}: empty corpus")
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
