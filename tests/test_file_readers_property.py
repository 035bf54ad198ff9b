"""Property-based tests of the file readers (issue #33): whatever the bytes, encoding, column count or numbers
(NaN, inf) of a user's file, a reader returns rows or raises one BertforgeError naming the file; never another
exception (a traceback on the command line)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertforge.io import read as files
from bertforge.embedding.data import read_corpus, read_examples, read_texts
from bertforge.errors import BertforgeError
from bertforge.tasks.conll import read_conll
from bertforge.tasks.glue import read_cola, read_mrpc, read_nli_jsonl, read_sst2, read_stsb
from bertforge.tasks.inputs import choice_inputs, qa_inputs, tagging_inputs, text_inputs
from bertforge.tasks.squad import read_squad
from bertforge.tasks.swag import read_swag
from bertforge.tasks.table import read_table

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Cells a hostile or careless file holds: numbers that are not finite, quotes, empty cells, control characters.
CELLS = st.one_of(
    st.sampled_from(["nan", "NaN", "inf", "-inf", "Infinity", "1e309", "-1", "0", "1", "2.5", "", " ", '"', "'",
                     "label", "sentence", "sentence1", "sentence2", "score", "B-PER", "I-LOC", "O", "\x00", "\r",
                     "-DOCSTART-", "{}", "[]", "null"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\t\n"), max_size=12),
)
ENCODINGS = ["utf-8", "utf-8-sig", "utf-16", "latin-1", "cp1252"]


def _table_bytes(rows: list[list[str]], sep: str, encoding: str) -> bytes:
    return "\n".join(sep.join(r) for r in rows).encode(encoding, errors="replace")


TABLES = st.builds(_table_bytes, st.lists(st.lists(CELLS, min_size=0, max_size=6), min_size=0, max_size=8),
                   st.sampled_from(["\t", ",", " "]), st.sampled_from(ENCODINGS))
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=True, allow_infinity=True) | CELLS,
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(CELLS, inner, max_size=4),
                           max_leaves=8)
KEYS = st.sampled_from(["text", "label", "sentence", "sentence1", "sentence2", "score", "premise", "hypothesis",
                        "anchor", "positive", "negative", "query", "texts", "id", "question", "context", "answers",
                        "data", "paragraphs", "qas", "title", "ending0", "ending1", "sent1", "sent2", "startphrase"])


def _jsonl_bytes(records: list, encoding: str) -> bytes:
    import json
    return "\n".join(json.dumps(r, allow_nan=True) for r in records).encode(encoding, errors="replace")


JSONL = st.builds(_jsonl_bytes, st.lists(st.dictionaries(KEYS, JSON_VALUES, max_size=5) | JSON_VALUES, max_size=5),
                  st.sampled_from(ENCODINGS))
ANY_BYTES = st.one_of(st.binary(max_size=600), TABLES, JSONL)


def _rows_or_one_line_error(read, path: Path) -> None:
    try:
        out = read(path)
        if hasattr(out, "__iter__") and not isinstance(out, (str, bytes, dict)):
            out = list(out)  # generators read lazily: the errors come while iterating
    except BertforgeError as err:
        message = str(err)
        assert path.name in message, message  # names the file (and the line where there is one)
        assert "\n" not in message.strip(), message


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("readers")


READERS = {
    "text_lines": (lambda p: files.text_lines(p), ".txt"),
    "jsonl_rows": (lambda p: files.jsonl_rows(p), ".jsonl"),
    "tsv_rows": (lambda p: files.tsv_rows(p), ".tsv"),
    "csv_rows": (lambda p: files.csv_rows(p), ".csv"),
    "read_json": (lambda p: files.read_json(p), ".json"),
    "safetensors_shapes": (lambda p: files.safetensors_shapes(p), ".safetensors"),
    "read_conll": (read_conll, ".txt"),
    "read_sst2": (read_sst2, ".tsv"),
    "read_cola": (read_cola, ".tsv"),
    "read_mrpc": (read_mrpc, ".tsv"),
    "read_stsb": (read_stsb, ".tsv"),
    "read_nli_jsonl": (read_nli_jsonl, ".jsonl"),
    "read_squad": (read_squad, ".json"),
    "read_swag": (read_swag, ".csv"),
    "read_table tsv": (lambda p: read_table(p, "text", "text_b", "label"), ".tsv"),
    "read_table csv regression": (lambda p: read_table(p, "sentence1", "sentence2", "score", regression=True), ".csv"),
    "read_table jsonl": (lambda p: read_table(p, "text", None, "label"), ".jsonl"),
    "predict text_inputs": (lambda p: text_inputs(p, None, "text", None), ".tsv"),
    "predict tagging_inputs": (tagging_inputs, ".txt"),
    "predict qa_inputs": (qa_inputs, ".jsonl"),
    "predict choice_inputs": (choice_inputs, ".jsonl"),
    "embed read_examples tsv": (read_examples, ".tsv"),
    "embed read_examples jsonl": (read_examples, ".jsonl"),
    "embed read_texts": (read_texts, ".txt"),
    "embed read_corpus": (read_corpus, ".jsonl"),
}


@pytest.mark.parametrize("name", list(READERS))
@SETTINGS
@given(data=ANY_BYTES)
def test_a_reader_returns_rows_or_one_error_naming_the_file(folder, name, data):
    read, suffix = READERS[name]
    path = folder / f"input-{name.replace(' ', '-')}{suffix}"
    path.write_bytes(data)
    _rows_or_one_line_error(read, path)


@SETTINGS
@given(scores=st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=6))
def test_scores_are_finite_or_the_error_names_the_line(folder, scores):
    path = folder / "scores.tsv"
    path.write_text("sentence1\tsentence2\tscore\n" + "".join(f"a {i}\tb {i}\t{s!r}\n" for i, s in enumerate(scores)))
    bad = [i for i, s in enumerate(scores) if not math.isfinite(s)]
    for read in (lambda p: read_examples(p).examples, read_stsb,
                 lambda p: read_table(p, "sentence1", "sentence2", "score", regression=True)[0]):
        if bad:
            with pytest.raises(BertforgeError, match=f"scores.tsv:{bad[0] + 2}: the score .* is not a finite number"):
                read(path)
        else:
            assert [e.label for e in read(path)] == pytest.approx(scores)
