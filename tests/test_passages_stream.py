"""A passage corpus streams: its rows are read as they are used, never held whole (a 1M-passage JSONL file is 600 MB
of text; the shard build holds one chunk of it). Shown by a bad last line that is reached only at the end."""
from __future__ import annotations

import json

import pytest

from bertforge.errors import BertforgeError
from bertforge.io.tables import open_table
from bertforge.retrieval.passages import iter_passages


def _corpus(path, n=5):
    lines = [json.dumps({"id": f"p{i}", "title": "t", "text": f"passage number {i}"}) for i in range(n)]
    path.write_text("\n".join(lines) + "\n{not json\n", encoding="utf-8")
    return path


def test_a_streamed_table_reads_as_it_goes(tmp_path):
    corpus = _corpus(tmp_path / "c.jsonl")
    with pytest.raises(BertforgeError, match=r"c\.jsonl:6: invalid JSON"):
        open_table(corpus)  # held whole: the bad line is found at once
    rows = iter(open_table(corpus, stream=True))  # streamed: nothing read yet
    assert next(rows)["text"] == "passage number 0"


def test_passages_stream_up_to_a_bad_line(tmp_path):
    corpus = _corpus(tmp_path / "c.jsonl")
    got = []
    with pytest.raises(BertforgeError, match=r"c\.jsonl:6: invalid JSON"):
        for p in iter_passages(corpus, id_col="id", title_col="title"):
            got.append(p.id)
    assert got == []  # the column check reads the whole file first: the bad line stops it before any passage


def test_passages_of_a_good_file_stream_in_order(tmp_path):
    path = tmp_path / "good.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "text": f"t {i}"}) + "\n" for i in range(4)), encoding="utf-8")
    assert [p.id for p in iter_passages(path)] == ["p0", "p1", "p2", "p3"]
