"""The installed console script: `finetune --out D` leaves a transformers-loadable model in D; predictions of every
task kind; bad task data is one line naming the file and column, reported before any model is loaded."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertforge.model.checkpoint import save_pretrained
from bertforge.config import preset
from bertforge.model import Encoder
from bertforge.tasks.models import init_from_pretrained, load_task_model, save_task_model
from bertforge.tasks.predict import predict
from bertforge.tokenization import Tokenizer

BERTFORGE = shutil.which("bertforge", path=str(Path(sys.executable).parent)) or shutil.which("bertforge")
POS, NEG = ["good", "great", "fine", "superb"], ["bad", "awful", "terrible", "dull"]
FILLER = "the movie film plot actor was is very a and of in".split()
NAMES, PLACES = ["alice", "bob", "carol"], ["paris", "rome", "oslo"]


def run(*args: object) -> subprocess.CompletedProcess:
    assert BERTFORGE, "the bertforge console script is not installed"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([BERTFORGE, *map(str, args)], capture_output=True, text=True, env=env, timeout=300)


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def write_sst(folder: Path, n_train: int, n_dev: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, n, seed in (("train", n_train, 0), ("dev", n_dev, 1)):
        rng, lines = random.Random(seed), ["sentence\tlabel"]
        for _ in range(n):
            y = rng.randint(0, 1)
            lines.append(" ".join(rng.choices(FILLER, k=4) + [rng.choice(POS if y else NEG)]) + f"\t{y}")
        (folder / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A tiny random BERT whose WordPiece vocabulary holds every test word whole."""
    d = tmp_path_factory.mktemp("base")
    rng = random.Random(0)
    vocab = POS + NEG + FILLER + NAMES + PLACES + ["where", "does", "live", "who", "?", "."]
    (d / "corpus.txt").write_text("\n".join(" ".join(rng.choices(vocab, k=10)) for _ in range(400)), encoding="utf-8")
    tok = Tokenizer.train((d / "corpus.txt").read_text().splitlines(), vocab_size=120, min_frequency=1)
    cfg = preset("bert-tiny", vocab_size=tok.vocab_size, num_hidden_layers=2)
    torch.manual_seed(0)
    save_pretrained(Encoder(cfg), d / "model", cfg, tokenizer=tok)
    return d / "model"


def test_finetune_out_is_the_model_transformers_loads(base, tmp_path):
    transformers = pytest.importorskip("transformers")
    data, out = write_sst(tmp_path / "sst", 64, 32), tmp_path / "out"
    proc = run("finetune", "--task", "sst2", "--data", data, "--model", base, "--out", out, "--epochs", "3",
               "--lr", "1e-3", "--batch-size", "16", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith(f"-> {out}")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "best_metrics.json",
                 "metrics.jsonl", "results.json"):
        assert (out / name).is_file(), name
    assert (out / "checkpoints" / "latest").is_file() and not (out / "best").exists()
    # the model in OUT is the best evaluation's (the first epoch reaching the top accuracy), not the last one
    evals = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["split"] == "eval"]
    best = json.loads((out / "best_metrics.json").read_text())
    top = max(e["accuracy"] for e in evals)
    assert best["accuracy"] == top and best["step"] == next(e["step"] for e in evals if e["accuracy"] == top)

    hf = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    ours, _, labels = load_task_model(out)
    tok = Tokenizer.from_pretrained(out)
    texts = ["a great film", "the plot was awful", "superb actor in a dull movie"]
    enc = tok(texts, max_length=32)
    with torch.no_grad():
        ref = hf(**enc).logits
        torch.testing.assert_close(ours(**enc)["logits"], ref, atol=1e-5, rtol=1e-5)

    inputs, preds = tmp_path / "in.jsonl", tmp_path / "preds.jsonl"
    inputs.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    proc = run("predict", "--model", out, "--input", inputs, "--out", preds, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(x) for x in preds.read_text().splitlines()]
    for rec, p in zip(records, ref.softmax(-1), strict=True):
        assert rec["label"] == hf.config.id2label[int(p.argmax())] == labels[int(p.argmax())]
        assert rec["probabilities"]["1"] == pytest.approx(float(p[1]), abs=1e-5)

    proc = run("evaluate", "--model", out, "--task", "sst2", "--data", data, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["accuracy"] == pytest.approx(best["accuracy"])


# ---- predictions of the other kinds follow the model's own outputs ---------------------------------------------------
def saved_model(base: Path, folder: Path, kind: str, labels: list[str] | None, task: dict) -> torch.nn.Module:
    torch.manual_seed(3)
    model, _ = init_from_pretrained(base, kind, len(labels) if labels else 2)
    save_task_model(model, folder, labels, task, tokenizer=Tokenizer.from_pretrained(base))
    return model.eval()


def test_predict_tags_are_the_first_subtoken_argmax(base, tmp_path):
    labels = ["O", "B-LOC", "B-PER"]
    model = saved_model(base, tmp_path / "m", "tag", labels, {"name": "conll", "max_seq_len": 32})
    tok = Tokenizer.from_pretrained(base)
    whole = [w for w in FILLER + NAMES + PLACES if tok([w])["input_ids"].shape[1] == 3]  # [CLS] w [SEP]
    assert len(whole) >= 6
    sentences = [whole[:4], whole[-3:]]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"tokens": s}) + "\n" for s in sentences))
    records = predict(tmp_path / "m", tmp_path / "in.jsonl", progress=False)
    for rec, words in zip(records, sentences, strict=True):
        enc = tok([" ".join(words)])
        assert enc["input_ids"].shape[1] == len(words) + 2
        with torch.no_grad():
            ids = model(**enc)["logits"][0, 1:-1].argmax(-1)
        assert rec["tokens"] == words and rec["tags"] == [labels[i] for i in ids]


def test_predict_choice_probabilities_are_the_softmax_over_endings(base, tmp_path):
    model = saved_model(base, tmp_path / "m", "choice", None, {"name": "swag"})
    row = {"context": "the actor was", "endings": ["very good", "in rome", "dull"]}
    (tmp_path / "in.jsonl").write_text(json.dumps(row) + "\n")
    [rec] = predict(tmp_path / "m", tmp_path / "in.jsonl", progress=False)
    tok = Tokenizer.from_pretrained(base)
    enc = {k: v[None] for k, v in tok([row["context"]] * 3, row["endings"]).items()}
    with torch.no_grad():
        p = model(**enc)["logits"][0].softmax(-1)
    assert rec["probabilities"] == pytest.approx(p.tolist(), abs=1e-5) and rec["label"] == int(p.argmax())


def test_predict_qa_answers_are_spans_of_the_context(base, tmp_path):
    saved_model(base, tmp_path / "m", "qa", None, {"name": "squad2", "version_2": True, "null_threshold": 1e9,
                                                  "max_seq_len": 32, "doc_stride": 8, "max_query_length": 8})
    rows = [{"id": "a", "question": "where does alice live ?", "context": "alice was in paris . bob was in rome ."}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    [rec] = predict(tmp_path / "m", tmp_path / "in.jsonl", progress=False)
    # a threshold this high never abstains: the answer is the best span, cut from the context at its offsets
    assert rec["id"] == "a" and rec["answer"] and rec["answer"] == rows[0]["context"][rec["start"]:rec["end"]]
    assert isinstance(rec["score"], float) and rec["null_score_diff"] < 1e9


# ---- task-data errors: one line, the file and the column, before the model is loaded ---------------------------------
@pytest.fixture(scope="module")
def unloadable(base, tmp_path_factory) -> dict[str, Path]:
    """A base model and an SST-2 fine-tuned model whose weights are garbage: any attempt to load them fails, so
    an error about the data proves the data was checked first."""
    root = tmp_path_factory.mktemp("unloadable")
    shutil.copytree(base, root / "base")
    saved_model(base, root / "sst2", "classify", ["0", "1"], {"name": "sst2", "max_seq_len": 32})
    for d in ("base", "sst2"):
        (root / d / "model.safetensors").write_bytes(b"not a safetensors file")
    return {"base": root / "base", "sst2": root / "sst2"}


def test_model_dirs_are_really_unloadable(unloadable, tmp_path):
    data = write_sst(tmp_path / "sst", 4, 4)
    one_line_error(run("evaluate", "--model", unloadable["sst2"], "--task", "sst2", "--data", data),
                   "model.safetensors", "not a readable safetensors file")


def test_finetune_missing_label_column(unloadable, tmp_path):
    data = write_sst(tmp_path / "sst", 4, 4)
    (data / "train.tsv").write_text("sentence\ngood film\nbad film\n")
    one_line_error(run("finetune", "--task", "sst2", "--data", data, "--model", unloadable["base"], "--out",
                       tmp_path / "out"), f"{data / 'train.tsv'}: no 'label' column")
    table = tmp_path / "train.csv"
    table.write_text("review,stars\ngood film,5\n")
    one_line_error(run("finetune", "--task", "classify", "--train", table, "--text-col", "review", "--model",
                       unloadable["base"], "--out", tmp_path / "out2"), "train.csv:1", "no column 'label'")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()


def test_evaluate_missing_label_column(unloadable, tmp_path):
    f = tmp_path / "test.tsv"
    f.write_text("index\tsentence\n0\tgood film\n")  # a GLUE test split: no labels
    one_line_error(run("evaluate", "--model", unloadable["sst2"], "--task", "sst2", "--eval", f),
                   f"{f}: no 'label' column")


def test_evaluate_header_only_and_missing_dev_file(unloadable, tmp_path):
    f = tmp_path / "dev.tsv"
    f.write_text("sentence\tlabel\n")
    one_line_error(run("evaluate", "--model", unloadable["sst2"], "--task", "sst2", "--eval", f),
                   f"{f}: no examples")
    folder = tmp_path / "glue"
    folder.mkdir()
    line = one_line_error(run("evaluate", "--model", unloadable["sst2"], "--task", "sst2", "--data", folder),
                          f"no dev file found in {folder}", "dev.tsv")
    assert "None" not in line
    one_line_error(run("evaluate", "--model", unloadable["sst2"], "--task", "sst2", "--eval", tmp_path / "nope.tsv"),
                   "--eval", "nope.tsv: no such file")
