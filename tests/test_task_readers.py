"""Readers: small files written by the tests (formats, quoting, errors with file:line) and the real data."""

import json
import logging
from pathlib import Path

import pytest

from bertforge.errors import BertforgeError
from bertforge.tasks.readers import (
    TASKS,
    ChoiceExample,
    TextExample,
    detect_tag_scheme,
    get_task,
    iob1_to_iob2,
    read_cola,
    read_conll,
    read_mrpc,
    read_nli_jsonl,
    read_qnli,
    read_rte,
    read_sst2,
    read_stsb,
    read_swag,
    read_table,
    tag_list,
)



def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


# ----------------------------------------------------------------------------------------------- GLUE formats


def test_sst2_quotes_are_plain_characters(tmp_path):
    # an unmatched quote must not swallow the following lines (GLUE tsv has no quoting)
    p = write(tmp_path, "train.tsv", 'sentence\tlabel\n"a quote opens here \t1\nplain text\t0\n')
    ex = read_sst2(p)
    assert ex == [
        TextExample('"a quote opens here', None, "1", "train-0"),
        TextExample("plain text", None, "0", "train-1"),
    ]


def test_sst2_test_split_is_unlabelled(tmp_path):
    p = write(tmp_path, "test.tsv", "index\tsentence\n0\tgood film\n")
    assert read_sst2(p)[0].label is None and read_sst2(p)[0].text == "good film"


def test_cola_no_header(tmp_path):
    p = write(tmp_path, "dev.tsv", "gj04\t1\t\tThe sailors rode the breeze.\ngj04\t0\t*\tRope the stretch.\n")
    ex = read_cola(p)
    assert [(e.text, e.label) for e in ex] == [("The sailors rode the breeze.", "1"), ("Rope the stretch.", "0")]


def test_mrpc_with_byte_order_mark(tmp_path):
    text = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t11\t12\tHe said \"yes.\tShe said yes.\n"
    ex = read_mrpc(write(tmp_path, "train.tsv", text))
    assert ex[0].text == 'He said "yes.' and ex[0].text_pair == "She said yes." and ex[0].label == "1"


def test_stsb_columns_by_header_name(tmp_path):
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    row = "0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\tA man dances.\tA man is dancing.\t4.750\n"
    ex = read_stsb(write(tmp_path, "dev.tsv", header + row))
    assert ex[0].text == "A man dances." and ex[0].text_pair == "A man is dancing." and ex[0].label == 4.75


def test_rte_and_qnli(tmp_path):
    rte = write(tmp_path, "rte.tsv", "index\tsentence1\tsentence2\tlabel\n0\tA b.\tC d.\tnot_entailment\n")
    assert read_rte(rte)[0].label == "not_entailment"
    qnli = write(tmp_path, "qnli.tsv", "index\tquestion\tsentence\tlabel\n0\tWho?\tHim.\tentailment\n")
    assert (read_qnli(qnli)[0].text, read_qnli(qnli)[0].text_pair) == ("Who?", "Him.")


def test_nli_jsonl_string_and_int_labels_and_skips_dash(tmp_path, caplog):
    rows = [
        {"premise": "A.", "hypothesis": "B.", "label": "contradiction"},
        {"premise": "A.", "hypothesis": "C.", "label": 1},
        {"premise": "A.", "hypothesis": "D.", "label": "-"},
    ]
    p = write(tmp_path, "dev.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level(logging.WARNING):
        ex = read_nli_jsonl(p)
    assert [e.label for e in ex] == ["contradiction", "neutral"]  # 1 -> NLI3_LABELS[1]
    assert "skipped 1 examples" in caplog.text


# ----------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "reader,name,text,message",
    [
        (read_sst2, "train.tsv", "sentence\tlabel\ngood\t1\nno label here\n", "train.tsv:3: expected 2 columns, found 1"),
        (read_sst2, "train.tsv", "sentence\tlabel\ngood\t2\n", "train.tsv:2: unknown label '2'"),
        (read_sst2, "train.tsv", "sentence\tlabel\n  \t1\n", "train.tsv:2: empty text 'sentence'"),
        (read_cola, "dev.tsv", "gj04\t1\t\tFine.\ngj04\t1\tOops.\n", "dev.tsv:2: expected 4 columns, found 3"),
        (read_stsb, "dev.tsv", "sentence1\tsentence2\tscore\na\tb\thigh\n", "dev.tsv:2: expected a number"),
        (read_rte, "dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n", "dev.tsv:2: unknown label 'maybe'"),
        (read_qnli, "dev.tsv", "index\tquestion\tlabel\n", "dev.tsv:1: header has no column 'sentence'"),
        (read_nli_jsonl, "dev.jsonl", '{"premise": "a", "hypothesis": "b", "label": 0}\n{"premise": "a"\n', "dev.jsonl:2: invalid JSON"),
        (read_nli_jsonl, "dev.jsonl", '{"premise": "a", "hypothesis": "b", "label": "yes"}\n', "dev.jsonl:1: unknown label 'yes'"),
        (read_nli_jsonl, "dev.jsonl", '{"premise": "a", "label": 0}\n', "dev.jsonl:1: missing field 'hypothesis'"),
        (read_conll, "train.txt", "EU NNP B-NP B-ORG\nrejects VBZ B-VP\n", "train.txt:2: expected 4 columns, found 3"),
        (read_swag, "val.jsonl", '{"context": "c", "endings": ["a", "b"], "label": 2}\n', "val.jsonl:1: label 2 out of range"),
    ],
)
def test_malformed_files_name_file_and_line(tmp_path, reader, name, text, message):
    with pytest.raises(BertforgeError) as err:
        reader(write(tmp_path, name, text))
    assert message in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(BertforgeError, match="no such file"):
        read_sst2(tmp_path / "nope.tsv")


# ----------------------------------------------------------------------------------------------- generic reader


def test_read_table_csv_collects_sorted_labels(tmp_path):
    p = write(tmp_path, "d.csv", 'text,other,label\n"hello, world",x,10\nbye,y,2\n"multi\nline",z,2\n')
    ex, labels = read_table(p, text_col="text", text_pair_col="other", label_col="label")
    assert labels == ["2", "10"]  # numeric order, not "10" < "2"
    assert ex[0].text == "hello, world" and ex[0].text_pair == "x" and ex[0].label == "10"
    assert ex[2].text == "multi\nline"


def test_read_table_tsv_given_labels_and_regression(tmp_path):
    p = write(tmp_path, "d.tsv", "s\ty\nfine\tpos\nbad\tneg\n")
    ex, labels = read_table(p, "s", label_col="y", label_list=["neg", "pos"])
    assert labels == ["neg", "pos"] and [e.label for e in ex] == ["pos", "neg"]
    with pytest.raises(BertforgeError, match="d.tsv:3: unknown label 'neg'"):
        read_table(p, "s", label_col="y", label_list=["pos"])
    r = write(tmp_path, "r.tsv", "s\ty\nfine\t0.5\n")
    ex, labels = read_table(r, "s", label_col="y", regression=True)
    assert labels is None and ex[0].label == 0.5


def test_read_table_jsonl_and_headerless(tmp_path):
    p = write(tmp_path, "d.jsonl", '{"q": "a?", "a": "b", "y": true}\n\n{"q": "c?", "a": "d", "y": false}\n')
    ex, labels = read_table(p, "q", "a", "y")
    assert labels == ["0", "1"] and [e.label for e in ex] == ["1", "0"]
    with pytest.raises(BertforgeError, match="d.jsonl:1: missing field 'nope'"):
        read_table(p, "nope")
    h = write(tmp_path, "h.tsv", "one\tA\ntwo\tB\n")
    ex, labels = read_table(h, 0, label_col=1, header=False)
    assert [e.text for e in ex] == ["one", "two"] and labels == ["A", "B"]


# ----------------------------------------------------------------------------------------------- CoNLL


CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP I-ORG
rejects VBZ B-VP O
German JJ B-NP I-MISC
call NN I-NP O

Peter NNP B-NP I-PER
Blackburn NNP I-NP I-PER
"""


def test_conll_reads_sentences_and_converts_iob1(tmp_path):
    p = write(tmp_path, "train.txt", CONLL)
    sents = read_conll(p)  # auto: I- starting a chunk means IOB1 -> converted
    assert [s.tokens for s in sents] == [["EU", "rejects", "German", "call"], ["Peter", "Blackburn"]]
    assert sents[0].tags == ["B-ORG", "O", "B-MISC", "O"] and sents[1].tags == ["B-PER", "I-PER"]
    assert read_conll(p, scheme="iob2")[0].tags == ["I-ORG", "O", "I-MISC", "O"]
    assert read_conll(p, tag_col=2, scheme="iob2")[0].tags == ["B-NP", "B-VP", "B-NP", "I-NP"]
    assert read_conll(p, tag_col=None)[1].tags == []


def test_iob_scheme_helpers():
    assert detect_tag_scheme([["B-PER", "I-PER", "O", "B-LOC"]]) == "iob2"
    assert detect_tag_scheme([["O", "I-PER"]]) == "iob1"
    # IOB1 uses B- only between two adjacent chunks of one type
    assert iob1_to_iob2(["I-PER", "I-PER", "B-PER", "I-LOC", "O", "I-LOC"]) == [
        "B-PER", "I-PER", "B-PER", "B-LOC", "O", "B-LOC"
    ]
    assert tag_list([]) == ["O"]


# ----------------------------------------------------------------------------------------------- SWAG


def test_swag_csv_and_jsonl(tmp_path):
    header = "video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n"
    row = 'anetv_1,5,"She opens the door. She","She opens the door.",She,gold,walks in.,flies.,eats it.,sings.,0\n'
    ex = read_swag(write(tmp_path, "val.csv", header + row))
    assert ex == [ChoiceExample("She opens the door.", ["She walks in.", "She flies.", "She eats it.", "She sings."], 0, "5")]
    j = write(tmp_path, "val.jsonl", '{"context": "c", "endings": ["x", "y", "z"], "label": 2}\n')
    assert read_swag(j)[0] == ChoiceExample("c", ["x", "y", "z"], 2, "val-0")
    bad = write(tmp_path, "bad.csv", "sent1,sent2,ending0\n")
    with pytest.raises(BertforgeError, match="bad.csv:1: header has no column"):
        read_swag(bad)


# ----------------------------------------------------------------------------------------------- registry + real data


def test_registry():
    assert get_task("SST-2") is TASKS["sst2"] and get_task("sts_b").is_regression
    assert get_task("mnli").num_labels == 3 and get_task("stsb").num_labels == 1
    for spec in TASKS.values():
        assert spec.main_metric in spec.metrics


REAL = [
    ("sst2", "train", 67349), ("sst2", "dev", 872),
    ("stsb", "train", 5749), ("stsb", "dev", 1500),
    ("mrpc", "train", 3668), ("mrpc", "dev", 408),
    ("cola", "train", 8551), ("cola", "dev", 1043),
    ("rte", "train", 2490), ("rte", "dev", 277),
    ("qnli", "dev", 5463),
    ("mnli", "dev", 9815),
    ("snli", "dev", 9842),  # this copy of SNLI dev holds no "-" gold labels
]


@pytest.mark.parametrize("task,split,count", REAL)
def test_real_glue_files(task, split, count, shared_data):
    spec = TASKS[task]
    ex = spec.read(shared_data(spec.files[split]))  # about 0.5 s for the largest (SST-2 train), so not marked slow
    assert len(ex) == count
    if spec.is_regression:
        assert all(0.0 <= e.label <= 5.0 for e in ex)
    else:
        assert {e.label for e in ex} == set(spec.labels)


@pytest.mark.parametrize("split,count", [("train", 14041), ("valid", 3250), ("test", 3453)])
def test_real_conll(split, count, shared_data):
    sents = read_conll(shared_data("conll2003", f"{split}.txt"))
    assert len(sents) == count
    assert detect_tag_scheme([s.tags for s in sents]) == "iob2"  # as the manifest says
    assert tag_list(sents) == ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]


def test_jsonl_invalid_utf8_names_file_and_line(tmp_path):
    from bertforge.tasks.readers import read_nli_jsonl
    p = tmp_path / "dev.jsonl"
    p.write_bytes(b'{"premise": "a", "hypothesis": "b", "label": 0}\n{"premise": "\xff", "hypothesis": "b"}\n')
    with pytest.raises(BertforgeError, match=r"dev.jsonl:2: invalid UTF-8"):
        read_nli_jsonl(p)
