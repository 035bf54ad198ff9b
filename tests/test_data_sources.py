"""Data as users hold it: the same texts and examples as .txt, .csv, .tsv, .jsonl, .json, .parquet, a save_to_disk
folder, a dataset in the Hugging Face cache and data in memory give the same rows to every verb (byte-identical
`embed` output, the same `predict` records, the same fine-tuning metrics); a structured file is never read as lines;
a missing column is one line naming it and the columns there are."""
from __future__ import annotations

import csv
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
datasets = pytest.importorskip("datasets")
pd = pytest.importorskip("pandas")
datasets.disable_progress_bars()

from bertforge.cli import main  # noqa: E402
from bertforge.config import preset  # noqa: E402
from bertforge.errors import BertforgeError  # noqa: E402
from bertforge.io.tables import (Columns, find_split, open_table, pick_columns, read_texts,  # noqa: E402
                                 single_source)
from bertforge.model import Encoder  # noqa: E402
from bertforge.model.checkpoint import save_pretrained  # noqa: E402
from bertforge.tokenization import Tokenizer  # noqa: E402
from test_finetune import one_thread  # noqa: E402, F401 (fixture: tiny models train fastest on one thread)

BERTFORGE = shutil.which("bertforge", path=str(Path(sys.executable).parent)) or shutil.which("bertforge")
SST2 = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "glue" / "SST-2"
FORMATS = ("tsv", "csv", "jsonl", "json", "parquet", "saved")
POS, NEG = ["good", "great", "fine", "superb", "moving"], ["bad", "awful", "dull", "tedious", "flat"]
FILLER = "the movie film plot actor was is very a and of in , 's `` ''".split()


def sst2_rows(split: str, n: int) -> list[tuple[str, int]]:
    """The first `n` rows of SST-2's `split` (its sentences hold quotes, commas, `` and ''); the same kind of rows
    made up where ../shared/data is absent (a fresh clone)."""
    path = SST2 / f"{split}.tsv"
    if path.is_file():
        lines = path.read_text(encoding="utf-8").splitlines()[1:n + 1]
        return [(s, int(y)) for s, y in (line.rsplit("\t", 1) for line in lines)]
    rng = random.Random(split)
    rows = []
    for _ in range(n):
        y = rng.randint(0, 1)
        rows.append((" ".join(rng.choices(FILLER, k=6) + [rng.choice(POS if y else NEG)]), y))
    return rows


def write_table(rows: list[tuple[str, int]], path_stem: Path, fmt: str) -> Path:
    """`rows` as columns sentence, label in `fmt` (labels are text in csv / tsv, integers elsewhere)."""
    records = [{"sentence": s, "label": y} for s, y in rows]
    if fmt == "tsv":  # GLUE's layout: no quoting
        path = path_stem.with_suffix(".tsv")
        path.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows), encoding="utf-8")
    elif fmt == "csv":
        path = path_stem.with_suffix(".csv")
        with open(path, "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["sentence", "label"])
            writer.writerows(rows)
    elif fmt == "jsonl":
        path = path_stem.with_suffix(".jsonl")
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    elif fmt == "json":
        path = path_stem.with_suffix(".json")
        path.write_text(json.dumps(records), encoding="utf-8")
    elif fmt == "parquet":
        path = path_stem.with_suffix(".parquet")
        pq.write_table(pa.Table.from_pylist(records), path)
    else:
        path = path_stem
        datasets.Dataset.from_list(records).save_to_disk(str(path))
    return path


def write_input(rows: list[tuple[str, int]], folder: Path, fmt: str) -> Path:
    """`rows` in `fmt` as FOLDER/dev.*; "txt": the sentences alone, one a line."""
    folder.mkdir()
    if fmt != "txt":
        return write_table(rows, folder / "dev", fmt)
    path = folder / "dev.txt"
    path.write_text("".join(s + "\n" for s, _ in rows), encoding="utf-8")
    return path


def write_splits(folder: Path, splits: dict[str, list[tuple[str, int]]], fmt: str) -> Path:
    """A folder of splits in `fmt`; "saved" is one save_to_disk DatasetDict (train, validation)."""
    folder.mkdir(parents=True)
    if fmt == "saved":
        records = {("validation" if k == "dev" else k): [{"sentence": s, "label": y} for s, y in v]
                   for k, v in splits.items()}
        datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in records.items()}).save_to_disk(str(folder))
    else:
        for name, rows in splits.items():
            write_table(rows, folder / name, fmt)
    return folder


@pytest.fixture(scope="module")
def sst(tmp_path_factory) -> dict:
    return {"train": sst2_rows("train", 64), "dev": sst2_rows("dev", 100)}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, sst) -> Path:
    """A tiny random BERT with a WordPiece vocabulary trained on the sample."""
    d = tmp_path_factory.mktemp("tiny")
    texts = [s for rows in sst.values() for s, _ in rows]
    tok = Tokenizer.train(texts * 3, vocab_size=400, min_frequency=1)
    cfg = preset("bert-tiny", vocab_size=tok.vocab_size, num_hidden_layers=2)
    torch.manual_seed(0)
    save_pretrained(Encoder(cfg), d / "model", cfg, tokenizer=tok)
    return d / "model"


def cli(*args: object) -> int:
    return main([str(a) for a in args])


def one_line(capsys, *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


# ---- the reader ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", [*FORMATS, "txt", "json-data", "list", "records", "DataFrame", "pyarrow", "Dataset",
                                 "DatasetDict"])
def test_the_same_texts_in_every_form_read_the_same(tmp_path, sst, fmt):
    rows = sst["dev"][:20] + [('a "quoted, comma" text', 1), ("ünïcödé ✓", 0)]
    texts = [s for s, _ in rows]
    records = [{"sentence": s, "label": y} for s, y in rows]
    source: object
    if fmt in FORMATS:
        source = write_table(rows, tmp_path / "dev", fmt)
    elif fmt == "txt":
        source = tmp_path / "dev.txt"
        source.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    elif fmt == "json-data":
        source = tmp_path / "dev.json"
        source.write_text(json.dumps({"version": 1, "data": records}), encoding="utf-8")
    else:
        source = {"list": texts, "records": records, "DataFrame": pd.DataFrame(records),
                  "pyarrow": pa.Table.from_pylist(records), "Dataset": datasets.Dataset.from_list(records),
                  "DatasetDict": datasets.DatasetDict(validation=datasets.Dataset.from_list(records))}[fmt]
    assert read_texts(source) == texts  # the text column found by its usual name (sentence), the header no text
    if fmt not in ("txt", "list"):
        table = open_table(source)
        assert pick_columns(table) == Columns("sentence", None, "label")
        assert [int(r["label"]) for r in table] == [y for _, y in rows]


def test_a_structured_file_is_never_read_as_lines(tmp_path):
    path = tmp_path / "dev.csv"
    path.write_text('text,label\n"first, with a comma",1\n"a quoted\nline break",0\n"he said ""no""",1\n',
                    encoding="utf-8")
    assert read_texts(path) == ["first, with a comma", "a quoted\nline break", 'he said "no"']
    rows = list(open_table(path))
    assert [r.where for r in rows] == ["dev.csv:2", "dev.csv:3", "dev.csv:5"]  # where each record starts
    # a parquet file is rows, not bytes decoded as UTF-8; a .json file of JSON Lines is JSON Lines
    pq.write_table(pa.table({"text": ["x", "y"]}), tmp_path / "x.parquet")
    assert read_texts(tmp_path / "x.parquet") == ["x", "y"]
    (tmp_path / "lines.json").write_text('{"text": "a"}\n{"text": "b"}\n', encoding="utf-8")
    assert read_texts(tmp_path / "lines.json") == ["a", "b"]
    # a tsv is GLUE's: quotes are characters, an unmatched one does not swallow the next lines
    (tmp_path / "q.tsv").write_text('sentence\tlabel\n"an open quote\t1\nnext\t0\n', encoding="utf-8")
    assert read_texts(tmp_path / "q.tsv") == ['"an open quote', "next"]


def test_usual_column_names_and_named_ones():
    def cols(names: list[str], **named) -> Columns:
        return pick_columns(open_table([dict.fromkeys(names, "x")]), **named)

    assert cols(["idx", "sentence", "label"]) == Columns("sentence", None, "label")  # SST-2
    assert cols(["index", "question", "sentence", "label"]) == Columns("question", "sentence", "label")  # QNLI
    assert cols(["sentence1", "sentence2", "score"]) == Columns("sentence1", "sentence2", "score")  # STS-B
    assert cols(["premise", "hypothesis", "label"]) == Columns("premise", "hypothesis", "label")  # MNLI
    assert cols(["Quality", "#1 String", "#2 String"]) == Columns("#1 String", "#2 String", "Quality")  # MRPC
    assert cols(["text", "text_pair", "y"], label="y") == Columns("text", "text_pair", "y")
    # a named text column: no pair unless one is named
    assert cols(["sentence1", "sentence2", "label"], text="sentence2") == Columns("sentence2", None, "label")
    with pytest.raises(BertforgeError, match=r"records: no text column \(looked for text, sentence.*columns: a, b"):
        cols(["a", "b"])


def test_a_missing_column_is_one_line_naming_it_and_the_columns_there_are(tmp_path, sst):
    rows = sst["dev"][:3]
    for fmt, expected in (("csv", "dev.csv:1: header has no column 'review' for the text (columns: sentence, label)"),
                          ("tsv", "dev.tsv:1: header has no column 'review' for the text (columns: sentence, label)"),
                          ("jsonl", "dev.jsonl:1: missing field 'review' (its fields: sentence, label)"),
                          ("parquet", "dev.parquet: no column 'review' for the text (columns: sentence, label)"),
                          ("saved", "dev: no column 'review' for the text (columns: sentence, label)")):
        path = write_table(rows, tmp_path / "dev", fmt)
        with pytest.raises(BertforgeError) as err:
            read_texts(path, "review")
        assert str(err.value).endswith(expected) and "\n" not in str(err.value)
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    with pytest.raises(BertforgeError, match=r"^DataFrame: no column 'review' for the text \(columns: a\)$"):
        read_texts(pd.DataFrame({"a": ["x"]}), "review")


def test_bad_sources_are_one_line(tmp_path, monkeypatch):
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    (tmp_path / "obj.json").write_text('{\n  "text": ["a"],\n  "more": 1\n}\n', encoding="utf-8")
    (tmp_path / "folder").mkdir()
    (tmp_path / "wide.csv").write_text("text,label\nok,1\ntoo,many,cells\n", encoding="utf-8")
    for source, message in ((tmp_path / "bad.parquet", "bad.parquet: not a readable Parquet file"),
                            (tmp_path / "obj.json", "obj.json: expected a JSON list of objects"),
                            (tmp_path / "folder", "folder: a folder, but not one that datasets' save_to_disk wrote"),
                            (tmp_path / "wide.csv", "wide.csv:3: expected 2 columns, found 3"),
                            (tmp_path / "missing.csv", "missing.csv: no such file"),
                            ([1, 2], "a list of data must hold strings")):
        with pytest.raises(BertforgeError, match=message):
            read_texts(source)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # the data extra missing: one line naming it
    with pytest.raises(BertforgeError, match=r"bad.parquet: reading Parquet needs pyarrow: pip install "
                                             r"'bertforge\[data\]'"):
        read_texts(tmp_path / "bad.parquet")


def test_splits_of_folders_saved_datasetdicts_and_dicts(tmp_path, sst):
    folder = tmp_path / "mixed"
    folder.mkdir()
    write_table(sst["train"][:4], folder / "train", "parquet")
    write_table(sst["dev"][:3], folder / "validation", "csv")
    assert find_split(folder, "train") == folder / "train.parquet"
    assert find_split(folder, "dev") == folder / "validation.csv"  # dev and validation name one split
    assert find_split(folder, "test") is None
    with pytest.raises(BertforgeError, match=r"mixed: several splits \(train, validation\); name the one to read"):
        single_source(folder)
    assert len(read_texts(single_source(folder, "validation"))) == 3
    saved = write_splits(tmp_path / "saved", {"train": sst["train"][:4], "dev": sst["dev"][:3]}, "saved")
    assert find_split(saved, "dev") == saved / "validation"
    assert read_texts(single_source(saved, "dev")) == [s for s, _ in sst["dev"][:3]]
    with pytest.raises(BertforgeError, match=r"no split 'test' \(splits: train, validation\)"):
        single_source(saved, "test")
    assert read_texts(single_source({"train": ["a", "b"]})) == ["a", "b"]


# ---- the verbs -----------------------------------------------------------------------------------------------------
def test_embed_output_is_byte_identical_in_every_format(tmp_path, tiny, sst, capsys):
    rows = sst["dev"][:40]
    inputs = {fmt: write_input(rows, tmp_path / fmt, fmt) for fmt in (*FORMATS, "txt")}
    outputs = {}
    for fmt, path in inputs.items():
        out = tmp_path / f"{fmt}.npy"
        assert cli("embed", "--model", tiny, "--input", path, "--out", out, "--no-progress") == 0, fmt
        outputs[fmt] = out.read_bytes()
    assert len(set(outputs.values())) == 1, [k for k, v in outputs.items() if v != outputs["txt"]]
    import numpy as np
    assert np.load(tmp_path / "csv.npy").shape[0] == len(rows)  # no header row embedded
    capsys.readouterr()
    # a named column that is not there: one line, exit 2, nothing written
    assert cli("embed", "--model", tiny, "--input", inputs["csv"], "--text-col", "review", "--out",
               tmp_path / "no.npy") == 2
    one_line(capsys, "dev.csv:1: header has no column 'review'", "(columns: sentence, label)")
    assert cli("embed", "--model", tiny, "--input", inputs["jsonl"], "--text-col", "review", "--out",
               tmp_path / "no.npy") == 2
    one_line(capsys, "dev.jsonl:1: missing field 'review' (its fields: sentence, label)")
    assert not (tmp_path / "no.npy").exists()


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, tiny, sst) -> tuple[Path, dict[str, Path], dict[str, str]]:
    """(the tsv folder's model, the split folders by format, each format's metrics.jsonl)."""
    root = tmp_path_factory.mktemp("finetune")
    folders, metrics = {}, {}
    for fmt in FORMATS:
        folders[fmt] = write_splits(root / f"data-{fmt}", {"train": sst["train"], "dev": sst["dev"][:32]}, fmt)
        out = root / f"out-{fmt}"
        assert cli("finetune", "--task", "sst2", "--data", folders[fmt], "--model", tiny, "--out", out, "--epochs", 2,
                   "--batch-size", 16, "--lr", "1e-3", "--max-seq-len", 32, "--no-progress") == 0, fmt
        metrics[fmt] = (out / "metrics.jsonl").read_text()
    return root / "out-tsv", folders, metrics


def test_finetune_gives_the_same_metrics_in_every_format(finetuned):
    _, _, metrics = finetuned
    assert all(m == metrics["tsv"] for m in metrics.values()), [f for f, m in metrics.items() if m != metrics["tsv"]]
    evals = [r for r in map(json.loads, metrics["tsv"].splitlines()) if r.get("split") == "eval"]
    assert len(evals) == 2 and all(0.0 <= r["accuracy"] <= 1.0 for r in evals)


def test_predict_writes_one_record_per_row_the_same_in_every_format(finetuned, tmp_path, sst, capsys):
    model, _, _ = finetuned
    rows = sst["dev"]
    assert len(rows) == 100
    outputs = {}
    for fmt in (*FORMATS, "txt"):
        path = write_input(rows, tmp_path / fmt, fmt)
        out = tmp_path / f"{fmt}.jsonl"
        assert cli("predict", "--model", model, "--input", path, "--text-col", "sentence", "--out", out,
                   "--no-progress") == 0, fmt
        outputs[fmt] = out.read_text()
    records = [json.loads(x) for x in outputs["csv"].splitlines()]
    assert len(records) == 100 and [r["id"] for r in records] == [str(i) for i in range(1, 101)]
    assert all(o == outputs["csv"] for o in outputs.values()), [f for f, o in outputs.items() if o != outputs["csv"]]
    # without --text-col: the column the model was trained on
    assert cli("predict", "--model", model, "--input", tmp_path / "parquet" / "dev.parquet", "--out",
               tmp_path / "default.jsonl", "--no-progress") == 0
    assert (tmp_path / "default.jsonl").read_text() == outputs["csv"]
    capsys.readouterr()


def test_prune_and_evaluate_take_the_folder_finetune_takes(finetuned, tmp_path, capsys):
    model, folders, _ = finetuned
    scores = set()
    for fmt in ("parquet", "saved", "tsv"):
        assert cli("evaluate", "--model", model, "--task", "sst2", "--data", folders[fmt]) == 0, fmt
        scores.add(json.loads(capsys.readouterr().out)["accuracy"])
    assert len(scores) == 1
    out = tmp_path / "pruned"
    assert cli("prune", "--model", model, "--task", "sst2", "--data", folders["parquet"], "--fraction", "0.5",
               "--out", out) == 0
    report = json.loads((out / "pruning.json").read_text())
    assert report["heads_removed"] == report["heads_total"] // 2
    assert report["metrics_before"]["accuracy"] in scores  # measured on the folder's dev split


def test_index_reads_a_table_corpus_with_its_columns(tiny, tmp_path, sst, capsys):
    pytest.importorskip("faiss")
    rows = [{"doc": f"d{i}", "body": s} for i, (s, _) in enumerate(sst["dev"][:12])]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "corpus.parquet")
    assert cli("index", "build", "--model", tiny, "--corpus", tmp_path / "corpus.parquet", "--text-col", "body",
               "--id-col", "doc", "--out", tmp_path / "idx", "--no-progress") == 0
    from bertforge.embedding.index import VectorIndex

    index = VectorIndex.load(tmp_path / "idx")
    assert index.ids == [r["doc"] for r in rows] and index.texts == [r["body"] for r in rows]
    capsys.readouterr()
    assert cli("index", "build", "--model", tiny, "--corpus", tmp_path / "corpus.parquet", "--out",
               tmp_path / "idx2") == 2
    one_line(capsys, "corpus.parquet: no text column (looked for text, sentence", "columns: doc, body")


def test_a_corpus_table_gives_one_document_a_row(tmp_path, sst):
    from bertforge.data.corpus import iter_documents

    rows = sst["train"][:5]
    folder = tmp_path / "corpus"
    folder.mkdir()
    write_table(rows, folder / "part1", "parquet")
    write_table(rows[:2], folder / "part2", "csv")
    datasets.Dataset.from_list([{"sentence": "from a saved dataset"}]).save_to_disk(str(folder / "saved"))
    docs = list(iter_documents(folder))
    texts = [s.strip() for s, _ in rows]
    assert [d.text for d in docs] == texts + texts[:2] + ["from a saved dataset"]  # part1, part2, saved: sorted
    with pytest.raises(BertforgeError, match=r"part2.csv:1: header has no column 'body'"):
        list(iter_documents(folder / "part2.csv", text_col="body"))


# ---- datasets on the Hugging Face Hub, from the cache when offline --------------------------------------------------
def cache_hub_dataset(home: Path, repo_id: str, config: str, splits: dict[str, Path]) -> None:
    """Put a parquet dataset into `home`'s datasets cache as `datasets.load_dataset(repo_id, config)` leaves it
    after a download: the packaged Parquet builder (the one load_dataset picks for a repository of parquet files)
    prepares it under OWNER___NAME/CONFIG/VERSION/HASH, where load_dataset looks when the Hub cannot be reached."""
    from datasets.packaged_modules.parquet.parquet import Parquet

    owner, name = repo_id.split("/")
    cache = home / "datasets"
    builder = Parquet(cache_dir=str(cache), dataset_name=name, config_name=config, config_id=config, hash="0",
                      data_files={k: str(v) for k, v in splits.items()})
    builder.download_and_prepare()
    shutil.move(cache / name, cache / f"{owner}___{name}")


def run_offline(home: Path, *args: object) -> subprocess.CompletedProcess:
    assert BERTFORGE, "the bertforge console script is not installed"
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([BERTFORGE, *map(str, args)], capture_output=True, text=True, env=env, timeout=300)


def test_a_hub_dataset_is_read_from_the_cache_offline(finetuned, tiny, tmp_path, sst):
    model, folders, metrics = finetuned
    home = tmp_path / "hf"
    files = {"train": folders["parquet"] / "train.parquet", "validation": folders["parquet"] / "dev.parquet"}
    cache_hub_dataset(home, "nyu-mll/glue", "sst2", files)
    proc = run_offline(home, "embed", "--model", tiny, "--input", "nyu-mll/glue", "--data-config", "sst2",
                       "--data-split", "validation", "--out", tmp_path / "hub.npy", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert cli("embed", "--model", tiny, "--input", files["validation"], "--out", tmp_path / "local.npy",
               "--no-progress") == 0
    assert (tmp_path / "hub.npy").read_bytes() == (tmp_path / "local.npy").read_bytes()
    # finetune takes the hub id as --data: its train and validation splits, the same metrics as the local folder
    out = tmp_path / "out"
    proc = run_offline(home, "finetune", "--task", "sst2", "--data", "nyu-mll/glue", "--data-config", "sst2",
                       "--model", tiny, "--out", out, "--epochs", 2, "--batch-size", 16, "--lr", "1e-3",
                       "--max-seq-len", 32, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert (out / "metrics.jsonl").read_text() == metrics["parquet"]
    # a dataset that is not in the cache: one line, exit 2
    proc = run_offline(home, "embed", "--model", tiny, "--input", "nobody/nothing", "--out", tmp_path / "x.npy")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "nobody/nothing: no such file or folder, and no Hugging Face Hub dataset of that name in the cache" in lines[0]
