"""The adversarial probe's input findings: compressed files read as their format by every reader, a key or column
named twice refused at its line or row, labels taken by value (1, "1", 1.0, true), ambiguous split files and
folders shadowing a Hub id said aloud, one Hub-id rule (the Hub's), long CSV fields and texts, invalid UTF-8
blamed on its own line. The console-script rows are in tests/test_reliability_table.py."""
from __future__ import annotations

import bz2
import gzip
import json
import lzma
import warnings
from pathlib import Path

import pytest

from bertforge.errors import BertforgeError
from bertforge.io.tables import find_split, open_table, read_texts

TEXTS = ["a good film", "a bad, dull film", "it was \"fine\""]
OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


def write(path: Path, text: str) -> Path:
    """`text` into `path`, compressed by its suffix."""
    opener = OPENERS.get(path.suffix)
    if opener is None:
        path.write_text(text, encoding="utf-8")
    else:
        with opener(path, "wt", encoding="utf-8") as f:
            f.write(text)
    return path


def formats() -> dict[str, str]:
    """The same three texts (labelled) in every format with a text form."""
    rows = [{"text": t, "label": i % 2} for i, t in enumerate(TEXTS)]
    return {
        "txt": "\n".join(TEXTS) + "\n",
        "csv": "text,label\n" + "".join(f'"{t.replace(chr(34), 2 * chr(34))}",{r["label"]}\n'
                                          for t, r in zip(TEXTS, rows)),
        "tsv": "text\tlabel\n" + "".join(f"{t}\t{r['label']}\n" for t, r in zip(TEXTS, rows)),
        "jsonl": "".join(json.dumps(r) + "\n" for r in rows),
        "json": json.dumps(rows),
    }


@pytest.mark.parametrize("compression", [".gz", ".bz2", ".xz"])
@pytest.mark.parametrize("fmt", ["txt", "csv", "tsv", "jsonl", "json"])
def test_a_compressed_file_is_read_as_the_format_under_its_compression_suffix(tmp_path, fmt, compression):
    path = write(tmp_path / f"data.{fmt}{compression}", formats()[fmt])
    assert read_texts(path) == TEXTS  # a gzipped JSON list is its records, never one text
    table = open_table(path)
    assert table.stem == "data"
    if fmt != "txt":
        assert [int(r["label"]) for r in table] == [0, 1, 0]


def test_a_compressed_corpus_is_read_by_its_format_and_a_zst_file_needs_zstandard(tmp_path, monkeypatch):
    import sys

    from bertforge.data.corpus import find_files, iter_texts

    write(tmp_path / "c" / "a.json.gz", "") if False else (tmp_path / "c").mkdir()
    write(tmp_path / "c" / "a.csv.gz", formats()["csv"])
    write(tmp_path / "c" / "b.jsonl.xz", formats()["jsonl"])
    write(tmp_path / "c" / "d.txt.bz2", "one line of text\n")
    assert sorted(p.name for p in find_files(tmp_path / "c")) == ["a.csv.gz", "b.jsonl.xz", "d.txt.bz2"]
    assert sorted(iter_texts(tmp_path / "c")) == sorted(TEXTS * 2 + ["one line of text"])
    listed = write(tmp_path / "list.json.gz", formats()["json"])
    assert list(iter_texts(listed)) == TEXTS  # rows, not the JSON document as one text
    (tmp_path / "x.csv.zst").write_bytes(b"\x28\xb5\x2f\xfd")
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(BertforgeError, match=r"x\.csv\.zst: reading a \.zst file needs zstandard"):
        read_texts(tmp_path / "x.csv.zst")


def test_a_key_or_column_named_twice_is_refused_at_its_line_or_row(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    (tmp_path / "d.jsonl").write_text('{"text": "a", "label": 1}\n{"text": "b", "label": 0, "label": 1}\n')
    with pytest.raises(BertforgeError, match=r"^d\.jsonl:2: the key 'label' appears twice in one object$"):
        open_table(tmp_path / "d.jsonl")
    write(tmp_path / "d.json.gz", '[{"text": "a"}, {"text": "b"}, {"text": "c", "text": "d"}]')
    with pytest.raises(BertforgeError, match=r"^d\.json\.gz row 2: the key 'text' appears twice in one object$"):
        open_table(tmp_path / "d.json.gz")
    (tmp_path / "n.json").write_text('[{"text": "a", "meta": {"id": 1, "id": 2}}]')
    with pytest.raises(BertforgeError, match=r"^n\.json row 0: the key 'id' appears twice"):
        open_table(tmp_path / "n.json")
    pq.write_table(pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"])], names=["text", "text"]),
                   tmp_path / "d.parquet")
    with pytest.raises(BertforgeError, match=r"^d\.parquet row 0: the schema names the column 'text' more than"):
        open_table(tmp_path / "d.parquet")
    (tmp_path / "d.csv").write_text("text,text\na,b\n")
    with pytest.raises(BertforgeError, match=r"^d\.csv:1: the header names 'text' more than once$"):
        open_table(tmp_path / "d.csv")


def test_labels_are_one_class_by_value_whatever_their_form(tmp_path):
    from bertforge.tasks.table import read_table

    (tmp_path / "t.csv").write_text('text,label\na,1\nb,1.0\nc,"1"\nd,true\ne,0\nf,0.0\ng,false\nh,+1\n')
    examples, labels = read_table(tmp_path / "t.csv")
    assert labels == ["0", "1"]
    assert [e.label for e in examples] == ["1", "1", "1", "1", "0", "0", "0", "1"]
    (tmp_path / "b.csv").write_text("text,label\na,true\nb,false\n")  # booleans alone stay what they are
    assert read_table(tmp_path / "b.csv")[1] == ["false", "true"]
    (tmp_path / "f.csv").write_text("text,label\na,0.5\nb,0.50\nc,2\n")
    with pytest.warns(UserWarning, match=r"f\.csv: the labels '0\.5' and '0\.50' are one number written"):
        assert read_table(tmp_path / "f.csv")[1] == ["0.5", "0.50", "2"]
    # a fixed label list (sst2's 0 / 1) takes 1.0 and true too
    from bertforge.tasks.glue import read_sst2

    (tmp_path / "s.tsv").write_text("sentence\tlabel\na\t1.0\nb\ttrue\nc\t0\n")
    assert [e.label for e in read_sst2(tmp_path / "s.tsv")] == ["1", "1", "0"]


def test_two_files_of_one_split_are_refused_naming_both(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\na,1\n")
    (tmp_path / "train.jsonl").write_text('{"text": "a", "label": 1}\n')
    with pytest.raises(BertforgeError, match=r"both train\.csv and train\.jsonl hold the train split"):
        find_split(tmp_path, "train")
    (tmp_path / "dev.tsv").write_text("text\tlabel\na\t1\n")
    (tmp_path / "validation.csv").write_text("text,label\na,1\n")
    with pytest.raises(BertforgeError, match=r"both dev\.tsv and validation\.csv hold the dev split"):
        find_split(tmp_path, "dev")
    (tmp_path / "train.jsonl").unlink()
    assert find_split(tmp_path, "train") == tmp_path / "train.csv"


def test_a_folder_named_like_a_hub_id_is_read_with_a_notice_and_hf_means_the_hub(tmp_path, monkeypatch):
    from bertforge.io.hub import resolve_model_option, resolve_model_path

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "acme" / "fr").mkdir(parents=True)
    with pytest.warns(UserWarning, match=r"--model acme/fr: read from the local folder .*acme/fr, not the Hugging "
                                         r"Face Hub model of that id \(write hf://acme/fr for the Hub\)"):
        assert resolve_model_path("acme/fr") == Path("acme/fr")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_model_path("./acme/fr") == Path("acme/fr")  # written as a path: no notice
    for resolve in (resolve_model_path, resolve_model_option):
        with pytest.raises(BertforgeError, match=r"--revision v2 names a version of a Hugging Face Hub model, but a "
                                                 r"local folder of that name shadows the id; write hf://acme/fr"):
            resolve("acme/fr", "v2")
    with pytest.raises(BertforgeError, match=r"^--model hf://acme/fr: not in the Hugging Face cache"):
        resolve_model_path("hf://acme/fr")  # offline, not cached: the Hub was asked, not the folder
    (tmp_path / "acme" / "ds").mkdir()
    (tmp_path / "acme" / "ds" / "train.csv").write_text("text\nhello\n")
    with pytest.warns(UserWarning, match=r"acme/ds: read from the local folder .*, not the Hugging Face Hub dataset"):
        assert find_split("acme/ds", "train") == Path("acme/ds/train.csv")


@pytest.mark.parametrize("name", ["acme/a--b", "acmé/fr", "acme/fr.", "acme/.fr"])
def test_a_name_the_hub_refuses_is_one_line_not_an_hf_validation_error(name, tmp_path, monkeypatch):
    from bertforge.api.serving import model_specs
    from bertforge.io.hub import looks_like_hub_id, resolve_model_path
    from bertforge.io.tables import looks_like_hub_id as looks_like_dataset_id

    monkeypatch.chdir(tmp_path)
    assert not looks_like_hub_id(name) and not looks_like_dataset_id(name)
    for call in (lambda: resolve_model_path(name), lambda: model_specs([name]), lambda: model_specs({"m": name})):
        with pytest.raises(BertforgeError) as err:
            call()
        assert "\n" not in str(err.value) and name in str(err.value)
    with pytest.raises(BertforgeError, match="not a Hugging Face Hub id"):
        resolve_model_path("hf://" + name)


def test_a_csv_field_over_128_kib_is_read_and_a_5_mb_text_is_cut_before_tokenizing(tmp_path):
    import time

    from bertforge.tokenization import Tokenizer
    from bertforge.tokenization.tokenizer import MAX_TEXT_CHARS

    long = "word " * 40_000  # 200 KB in one field
    (tmp_path / "long.csv").write_text(f'text,label\n"{long}",1\nshort,0\n')
    assert read_texts(tmp_path / "long.csv") == [long, "short"]
    write(tmp_path / "long.tsv.gz", f"text\tlabel\n{long}\t1\n")
    assert read_texts(tmp_path / "long.tsv.gz") == [long]
    tok = Tokenizer.train(["word other words here"] * 20, kind="wordpiece", vocab_size=60, min_frequency=1)
    huge = "word other " * 500_000  # 5 MB
    assert len(huge) > MAX_TEXT_CHARS
    backend, seen = tok.backend, []

    class Spy:  # what reaches the Rust tokenizer
        def __getattr__(self, name):
            return getattr(backend, name)

        def encode_batch(self, inputs, **kw):
            seen.extend(len(t) for t in inputs)
            return backend.encode_batch(inputs, **kw)

    tok.backend = Spy()
    start = time.perf_counter()
    enc = tok([huge, "word"], max_length=16, return_tensors=None, return_offsets=True)
    assert time.perf_counter() - start < 10
    assert seen == [MAX_TEXT_CHARS, 4]
    assert len(enc["input_ids"][0]) == 16 and enc["input_ids"][0][1:3] == tok.encode_ids(["word other"])[0]
    assert enc["input_ids"][1][:3] == tok(["word"], max_length=16, return_tensors=None)["input_ids"][0]


@pytest.mark.parametrize("fmt", ["csv", "tsv"])
def test_invalid_utf8_is_blamed_on_the_line_holding_the_byte(tmp_path, fmt):
    sep = "," if fmt == "csv" else "\t"
    lines = [f"text{sep}label"] + [f"sentence number {i} is plain text{sep}{i % 2}" for i in range(2, 1000)]
    data = "\n".join(lines).encode() + b"\n"
    at = data.index(b"number 700 ")
    (tmp_path / f"bad.{fmt}").write_bytes(data[:at] + b"\xff" + data[at:])
    with pytest.raises(BertforgeError, match=rf"^bad\.{fmt}:700: invalid UTF-8 \(byte 0xff\)$"):
        open_table(tmp_path / f"bad.{fmt}").rows()
    (tmp_path / "bad.json").write_bytes(b'[\n{"text": "a"},\n{"text": "\xff"}\n]')
    with pytest.raises(BertforgeError, match=r"bad\.json:3: invalid UTF-8"):
        open_table(tmp_path / "bad.json")


def exported_folder(root: Path) -> Path:
    """A folder as `bertforge export` leaves it (config.json beside model.onnx, no PyTorch weights); the graph's
    bytes are never read when onnxruntime is missing."""
    from bertforge.config import ModelConfig

    folder = root / "exported"
    folder.mkdir()
    cfg = ModelConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)
    (folder / "config.json").write_text(json.dumps(cfg.to_hf_dict(["BertModel"])))
    (folder / "model.onnx").write_bytes(b"not read")
    return folder


def test_an_exported_model_without_onnxruntime_is_one_line_naming_the_export_extra(tmp_path, monkeypatch):
    import sys

    import bertforge
    from bertforge.model.folder import ModelFolder

    folder = exported_folder(tmp_path)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as when the export extra is not installed
    expected = r"exported: an exported ONNX model; running it needs onnxruntime, which is not installed: " \
               r"pip install 'bertforge\[export\]'"
    with pytest.raises(BertforgeError, match=expected):
        ModelFolder.open(folder)
    with pytest.raises(BertforgeError, match=expected):
        bertforge.embed(str(folder), ["a text"])
    with pytest.raises(BertforgeError, match=expected):
        bertforge.predict(str(folder), ["a text"])


def test_a_config_whose_family_the_weights_do_not_share_says_they_disagree(tmp_path):
    from bertforge.config import ModelConfig
    from bertforge.model import Encoder
    from bertforge.model.checkpoint import save_pretrained
    from bertforge.model.folder import ModelFolder

    cfg = ModelConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=66, model_type="xlm-roberta")
    save_pretrained(Encoder(cfg), tmp_path / "m", cfg)
    assert ModelFolder.open(tmp_path / "m").model_config.model_type == "xlm-roberta"
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "model_type": "deberta-v2"}))
    with pytest.raises(BertforgeError, match=r"config\.json: the config and the weights disagree about the model's "
                                             r"family: model_type is 'deberta-v2', but model\.safetensors names its "
                                             r"tensors as another family does \(xlm-roberta, "):
        ModelFolder.open(tmp_path / "m")


def test_a_resume_refused_for_a_moved_model_shows_where_the_two_paths_differ(tmp_path):
    from bertforge.io.rundir import claim_output_dir

    out = tmp_path / "run"
    base = "/data/experiments/2024/checkpoints/encoders/bert-base-finetuned-on-sst2/seed-"
    with claim_output_dir(out, resume=False, overwrite=False, options={"model": base + "1/best"}):
        (out / "config.json").write_text("{}")
    with pytest.raises(BertforgeError) as err:
        claim_output_dir(out, resume=True, overwrite=False, options={"model": base + "2/best"})
    message = str(err.value)
    assert message.startswith("--model was ...") and "seed-1/best" in message and "seed-2/best" in message, message
