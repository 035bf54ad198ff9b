"""The adversarial table: each hostile command of the third reliability round, what it must do, what it must leave.

Every row is a function registered with `@row(case, must, left)`: the case as a hostile user tried it, what bertforge
must do about it, and what must be on disk afterwards. `test_row` runs each one on tiny models this module makes
(console-script processes, a real server on 127.0.0.1, a few steps at most). The kill / tamper loops over every step
boundary of the index commit and the manifest are in tests/test_reliability_kills.py.
"""
from __future__ import annotations

import json
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from test_reliability_inputs import BERTFORGE, ENV, cli, finish, ok, one_line, snapshot, start

ROWS: list = []


def row(case: str, must: str, left: str) -> Callable:
    """Register a row of the table (`case`: the hostile command; `must`: what bertforge does; `left`: on disk)."""
    def register(check: Callable) -> Callable:
        check.case, check.must, check.left = case, must, left
        ROWS.append(pytest.param(check, id=check.__name__))
        return check
    return register


@dataclass
class Kit:
    """What the rows work with: tiny model folders, data, and a fresh folder per row."""
    enc: Path      # a BERT encoder, 64 positions, WordPiece tokenizer
    clf: Path      # a fine-tuned sst2 classifier (its config.json records max_seq_len 32)
    mlm: Path      # a masked LM (distill general's teacher)
    sst: Path      # SST-2 style train.tsv / dev.tsv
    conll: Path    # CoNLL-2003 style train.txt / valid.txt (PER, LOC)
    corpus: Path   # text, one passage a line
    tmp: Path
    port: int      # a server of `enc` (read timeout 1.5 s, 16 connections at most)

    def model_with(self, name: str, **fields) -> Path:
        """A copy of `enc` whose config.json has `fields` changed."""
        d = self.tmp / name
        shutil.copytree(self.enc, d)
        cfg = json.loads((d / "config.json").read_text())
        cfg.update(fields)
        (d / "config.json").write_text(json.dumps(cfg))
        return d


WORDS = ("the cat dog sat ran on a mat tree good bad film movie was very not great awful Anna Bob Rome Oslo "
         "in at of and to").split()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    from bertforge.config import ModelConfig
    from bertforge.model import Encoder
    from bertforge.model.checkpoint import save_pretrained
    from bertforge.model.heads import MaskedLM
    from bertforge.tasks.models import init_from_pretrained, save_task_model
    from bertforge.tokenization import Tokenizer

    root = tmp_path_factory.mktemp("table")
    rng = random.Random(0)
    lines = [" ".join(rng.choices(WORDS, k=rng.randint(3, 12))) for _ in range(300)]
    (root / "corpus.txt").write_text("\n".join(lines) + "\n")
    tok = Tokenizer.train(lines, kind="wordpiece", vocab_size=100, min_frequency=1)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)
    save_pretrained(Encoder(cfg), root / "enc", cfg, tokenizer=tok)
    clf, _ = init_from_pretrained(root / "enc", "classify", 2)
    save_task_model(clf, root / "clf", ["0", "1"], {"name": "sst2", "max_seq_len": 32}, tokenizer=tok)
    MaskedLM(cfg).save_pretrained(root / "mlm", tokenizer=tok)
    (root / "sst").mkdir()
    for name, n in (("train", 64), ("dev", 16)):
        rows = [f"{' '.join(rng.choices(WORDS, k=rng.randint(2, 20)))}\t{rng.randint(0, 1)}" for _ in range(n)]
        (root / "sst" / f"{name}.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    (root / "conll").mkdir()
    for name, n in (("train", 40), ("valid", 10)):
        out = []
        for _ in range(n):
            out += [f"{w} X X {'B-PER' if w in ('Anna', 'Bob') else 'B-LOC' if w in ('Rome', 'Oslo') else 'O'}"
                    for w in rng.choices(WORDS, k=6)] + [""]
        (root / "conll" / f"{name}.txt").write_text("\n".join(out) + "\n")
    return {"enc": root / "enc", "clf": root / "clf", "mlm": root / "mlm", "sst": root / "sst",
            "conll": root / "conll", "corpus": root / "corpus.txt"}


@pytest.fixture
def kit(models, served, tmp_path) -> Kit:
    return Kit(tmp=tmp_path, port=served, **models)


@pytest.mark.parametrize("check", ROWS)
def test_row(check, kit):
    assert check.case and check.must and check.left
    check(kit)


def test_the_table_has_a_row_per_case():
    assert len(ROWS) >= 30, len(ROWS)


def python_cli(script: str, *args: object, **kw) -> subprocess.CompletedProcess:
    """`script` (which ends by running bertforge's main on sys.argv[1:]) in a python process of its own."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)], capture_output=True,
                          text=True, env={**ENV, **kw.pop("env", {})}, timeout=300, **kw)


# ---- an index that two kills destroyed ---------------------------------------------------------------------------
KILL_AT = """
    import os, signal, sys
    from bertforge.cli import main

    point, argv = sys.argv[1], sys.argv[2:]
    replace, unlink = os.replace, os.unlink
    if point == "before-commit":  # the next generation written, meta.json not switched yet
        os.replace = lambda a, b, **kw: os.kill(os.getpid(), signal.SIGKILL) if str(b).endswith("meta.json") \\
            else replace(a, b, **kw)
    else:  # after the commit: killed at the first removal of the older generation
        os.unlink = lambda p, **kw: os.kill(os.getpid(), signal.SIGKILL) if "/index." in str(p) or "/docs." in str(p) \\
            else unlink(p, **kw)
    sys.exit(main(argv))
"""


@row("index add killed after its commit, then the next index add killed before its commit",
     "the last committed index loads, answers a query and takes the next add",
     "meta.json and one generation's index.G.faiss / docs.G.jsonl (the older ones removed by the next add)")
def index_killed_twice(kit: Kit) -> None:
    pytest.importorskip("faiss")
    idx = kit.tmp / "idx"
    a, b = kit.tmp / "a.txt", kit.tmp / "b.txt"
    a.write_text("".join(f"the dog ran to the tree {i}\n" for i in range(3)))
    b.write_text("".join(f"a good film {i}\n" for i in range(2)))
    ok(cli("index", "build", "--model", kit.enc, "--corpus", kit.corpus, "--out", idx, "--no-progress"))
    first = python_cli(KILL_AT, "after-commit", "index", "add", "--index", idx, "--corpus", a, "--no-progress")
    second = python_cli(KILL_AT, "before-commit", "index", "add", "--index", idx, "--corpus", b, "--no-progress")
    assert first.returncode == second.returncode == -signal.SIGKILL, (first.stderr[-500:], second.stderr[-500:])
    hits = ok(cli("index", "query", "--index", idx, "the dog ran", "--json", "-k", "2"))
    assert len(json.loads(hits.stdout.splitlines()[0])["hits"]) == 2
    ok(cli("index", "add", "--index", idx, "--corpus", b, "--no-progress"))
    from bertforge.embedding.index import VectorIndex

    index = VectorIndex.load(idx)
    assert len(index) == 300 + 3 + 2 and index.texts[-1] == "a good film 1"
    gen = json.loads((idx / "meta.json").read_text())["generation"]
    assert sorted(p.name for p in idx.iterdir() if p.name.endswith((".faiss", ".jsonl"))) == [
        f"docs.{gen}.jsonl", f"index.{gen}.faiss"]


# ---- the --overwrite manifest ------------------------------------------------------------------------------------
DURING = """
    import sys
    from pathlib import Path
    import bertforge.tokenization.tokenizer as t
    from bertforge.cli import main

    mine, argv = Path(sys.argv[1]), sys.argv[2:]
    train = t.Tokenizer.train.__func__

    def train_while_the_user_saves(cls, *args, **kwargs):
        mine.parent.mkdir(parents=True, exist_ok=True)
        mine.write_text("saved into the folder while the run went on\\n")  # the user, not bertforge's writers
        if "--fail" in argv:
            raise SystemExit(main(["tokenizer", "train", "--corpus", "/no/such/corpus"]))
        return train(cls, *args, **kwargs)

    t.Tokenizer.train = classmethod(train_while_the_user_saves)
    sys.exit(main([a for a in argv if a != "--fail"]))
"""


def recorded_exactly(out: Path, besides: tuple[str, ...] = ()) -> None:
    """The folder's manifest records every file in it (but the claim's own and `besides`), each as it is."""
    import hashlib

    files = json.loads((out / ".bertforge-written.json").read_text())["files"]
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} - {
        ".bertforge-written.json", "run_options.json", ".lock", *besides}
    assert sorted(files) == sorted(on_disk), (sorted(set(files) ^ on_disk))
    for rel, rec in files.items():
        data = (out / rel).read_bytes()
        assert rec == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}, rel


@row("pretrain (with its data/ shards and TensorBoard events), export, quantize, longify, embed-train: what does "
     "each manifest hold?",
     "exactly the files the verb wrote, each with its size and sha256",
     "the verbs' outputs and their manifests")
def every_writer_records(kit: Kit) -> None:
    from test_pretrain_reliability import write_corpus

    corpus = write_corpus(kit.tmp / "grammar.txt")
    (kit.tmp / "pairs.tsv").write_text("".join(f"a good film {i}\tthe movie was great {i}\n" for i in range(24)))
    runs = {
        "pretrain": ["pretrain", "--corpus", corpus, "--size", "bert-tiny", "--vocab-size", "120", "--seq-len", "32",
                     "--batch-size", "8", "--max-steps", "4", "--save-every", "2", "--no-progress", "--threads", "1",
                     "--heldout-fraction", "0.2", "--eval-batches", "1", "--report-to", "tensorboard"],
        "export": ["export", "--model", kit.enc],
        "quantize": ["quantize", "--model", kit.enc],
        "longify": ["longify", "--model", kit.enc, "--max-length", "128", "--attention-window", "16"],
        "embed-train": ["embed-train", "--model", kit.enc, "--train", kit.tmp / "pairs.tsv", "--loss", "mnrl",
                        "--max-steps", "2", "--batch-size", "8"],
    }
    for name, args in runs.items():
        if name == "pretrain":
            pytest.importorskip("tensorboard")
        if name == "export":
            pytest.importorskip("onnxruntime")
        out = kit.tmp / name
        ok(cli(*args, "--out", out))
        recorded_exactly(out)


def tokenizer_run(kit: Kit, out: Path, *extra: object) -> subprocess.CompletedProcess:
    return cli("tokenizer", "train", "--corpus", kit.corpus, "--out", out, "--vocab-size", "90", *extra)


@row("a file the user saves into the folder while a run writes it, then the same command with --overwrite",
     "the file is not recorded as bertforge's and --overwrite keeps it (a warning names it)",
     "the user's file, byte for byte, beside the new run's files")
def user_file_saved_during_a_run(kit: Kit) -> None:
    out = kit.tmp / "tok"
    mine = out / "notes.txt"
    ok(python_cli(DURING, mine, "tokenizer", "train", "--corpus", kit.corpus, "--out", out, "--vocab-size", "90"))
    recorded_exactly(out, besides=("notes.txt",))  # the tokenizer's files, not the user's
    proc = ok(tokenizer_run(kit, out, "--overwrite"))
    assert "kept notes.txt" in proc.stderr
    assert mine.read_text() == "saved into the folder while the run went on\n"


@row("a run that fails while the user saves a file into its folder, then the plain rerun (no flag)",
     "the rerun refuses the folder in one line (it holds a file bertforge did not write) instead of clearing it",
     "the user's file; nothing deleted")
def failed_run_then_plain_rerun(kit: Kit) -> None:
    out = kit.tmp / "tok"
    mine = out / "notes.txt"
    failed = python_cli(DURING, mine, "tokenizer", "train", "--corpus", kit.corpus, "--out", out, "--vocab-size",
                        "90", "--fail")
    assert failed.returncode == 2, failed.stderr
    before = snapshot(out)
    one_line(tokenizer_run(kit, out), "already holds files (notes.txt)")
    assert snapshot(out) == before


@row("rm -rf D/* after a run (the hidden manifest survives), the user creates D/data/mine.txt, then --overwrite",
     "refused in one line: nothing in D is a file bertforge wrote (the manifest's entries are gone or differ)",
     "data/mine.txt, untouched")
def overwrite_after_rm(kit: Kit) -> None:
    out = kit.tmp / "tok"
    ok(tokenizer_run(kit, out))
    for p in out.iterdir():
        if not p.name.startswith("."):
            p.unlink()
    (out / "data").mkdir()
    (out / "data" / "mine.txt").write_text("the user's own data\n")
    one_line(tokenizer_run(kit, out, "--overwrite"), "holds files bertforge did not write")
    assert (out / "data" / "mine.txt").read_text() == "the user's own data\n"


@row("a manifest planted in a folder of the user's files (naming every one of them), then --overwrite",
     "refused in one line: no file matches the size and sha256 the manifest records",
     "every file of the folder, byte for byte")
def planted_manifest(kit: Kit) -> None:
    d = kit.tmp / "mine"
    (d / "src").mkdir(parents=True)
    for name in ("thesis.txt", "config.json", "src/a.py"):
        (d / name).write_text(f"the user's {name}\n")
    files = {n: {"size": (d / n).stat().st_size, "sha256": "0" * 64} for n in ("thesis.txt", "config.json", "src/a.py")}
    (d / ".bertforge-written.json").write_text(json.dumps({"version": 2, "files": files}))
    before = snapshot(d)
    one_line(tokenizer_run(kit, d, "--overwrite"), "holds files bertforge did not write")
    assert snapshot(d) == before


@row("the manifest replaced by a link to a file outside the run, then --resume (and --overwrite)",
     "the link is replaced by the run's own manifest, never written through",
     "the outside file unchanged; a regular manifest in the run")
def manifest_link(kit: Kit) -> None:
    out, outside = kit.tmp / "ft", kit.tmp / "outside.json"
    finetune = ["finetune", "--task", "sst2", "--model", kit.enc, "--data", kit.sst, "--out", out, "--batch-size", "8",
                "--no-progress", "--device", "cpu"]
    ok(cli(*finetune, "--max-steps", "2"))
    outside.write_text('{"mine": true}\n')
    (out / ".bertforge-written.json").unlink()
    (out / ".bertforge-written.json").symlink_to(outside)
    ok(cli(*finetune, "--max-steps", "3", "--resume"))
    assert outside.read_text() == '{"mine": true}\n' and not (out / ".bertforge-written.json").is_symlink()


@row("run_options.json replaced by a link to a file outside the run, then --resume",
     "refused in one line naming the link (a run's record is never read or written through a link)",
     "the outside file and the run unchanged")
def run_options_link(kit: Kit) -> None:
    out, outside = kit.tmp / "ft", kit.tmp / "outside.json"
    finetune = ["finetune", "--task", "sst2", "--model", kit.enc, "--data", kit.sst, "--out", out, "--max-steps", "2",
                "--batch-size", "8", "--no-progress", "--device", "cpu"]
    ok(cli(*finetune))
    outside.write_text(json.dumps({"options": {}, "fingerprint": {}}))
    (out / "run_options.json").unlink()
    (out / "run_options.json").symlink_to(outside)
    before, before_outside = snapshot(out), outside.read_text()
    one_line(cli(*finetune, "--resume"), "run_options.json is a link to", "remove the link")
    assert snapshot(out) == before and outside.read_text() == before_outside


# ---- one positions rule ---------------------------------------------------------------------------------------------
@row("distill task --max-seq-len 100000 (and 1000, past the teacher's 64 positions)",
     "refused in one line before any work: 100000 by the flag's bound, 1000 by the positions rule",
     "no --out folder")
def distill_task_length(kit: Kit) -> None:
    out = kit.tmp / "student"
    base = ["distill", "task", "--teacher", kit.clf, "--task", "sst2", "--data", kit.sst, "--out", out,
            "--student", "layers:1", "--max-steps", "2"]
    one_line(cli(*base, "--max-seq-len", "100000"), "--max-seq-len must be in 1..65536 (got 100000)")
    one_line(cli(*base, "--max-seq-len", "1000"), "--max-seq-len 1000 is longer than the 64 positions of",
             "use --max-seq-len 64 or less")
    assert not out.exists()


@row("predict and evaluate on a fine-tuned model whose config.json records max_seq_len 100000",
     "one line naming config.json's max_seq_len and the model's 64 positions, before the model is loaded",
     "no --out file")
def saved_length(kit: Kit) -> None:
    model = kit.tmp / "clf"
    shutil.copytree(kit.clf, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["bertforge_task"]["max_seq_len"] = 100000
    (model / "config.json").write_text(json.dumps(cfg))
    (kit.tmp / "in.txt").write_text("a good film\n" * 3)
    one_line(cli("predict", "--model", model, "--input", kit.tmp / "in.txt", "--out", kit.tmp / "p.jsonl"),
             f"{model / 'config.json'}: max_seq_len 100000 is longer than the 64 positions of")
    one_line(cli("evaluate", "--model", model, "--task", "sst2", "--data", kit.sst),
             f"{model / 'config.json'}: max_seq_len 100000 is longer than the 64 positions of")
    assert not (kit.tmp / "p.jsonl").exists()


@row("analyze heads --max-length 100000 (and 1000), analyze attention --max-length 1000",
     "refused in one line: the flag's bound, then the positions rule naming the flag and the 64 positions",
     "no --out folder")
def analyze_length(kit: Kit) -> None:
    out = kit.tmp / "heads"
    (kit.tmp / "s.txt").write_text("the cat sat on the mat\n" * 4)
    one_line(cli("analyze", "heads", "--model", kit.enc, "--input", kit.tmp / "s.txt", "--out", out, "--max-length",
                 "100000"), "--max-length must be in 1..65536")
    one_line(cli("analyze", "heads", "--model", kit.enc, "--input", kit.tmp / "s.txt", "--out", out, "--max-length",
                 "1000"), "--max-length 1000 is longer than the 64 positions of")
    one_line(cli("analyze", "attention", "--model", kit.enc, "--text", "the cat", "--out", kit.tmp / "a.html",
                 "--max-length", "1000"), "--max-length 1000 is longer than the 64 positions")
    assert not out.exists() and not (kit.tmp / "a.html").exists()


@row("distill general --seq-len 1024 on a teacher of 64 positions; the default --seq-len on that teacher",
     "1024 is refused in one line; the default trains at the teacher's 64 and records the 64 it trained at",
     "no folder for the refused run; results.json's seq_len = the length trained at")
def distill_general_length(kit: Kit) -> None:
    out = kit.tmp / "general"
    base = ["distill", "general", "--teacher", kit.mlm, "--corpus", kit.corpus, "--out", out, "--max-steps", "2",
            "--batch-size", "8", "--device", "cpu"]
    one_line(cli(*base, "--seq-len", "1024"), "--seq-len 1024 is longer than the 64 positions of")
    assert not out.exists()
    ok(cli(*base))
    recorded_exactly(out)
    assert json.loads((out / "results.json").read_text())["seq_len"] == 64
    assert json.loads((out / "run_options.json").read_text())["options"]["seq_len"] == 64


@row("a sentence-encoder folder whose sentence_bert_config.json records max_seq_length 100000, then embed",
     "one line naming the file's max_seq_length and the 64 positions",
     "no --out file")
def encoder_saved_length(kit: Kit) -> None:
    model = kit.tmp / "st"
    shutil.copytree(kit.enc, model)
    (model / "sentence_bert_config.json").write_text('{"max_seq_length": 100000, "do_lower_case": false}')
    (kit.tmp / "in.txt").write_text("a good film\n")
    one_line(cli("embed", "--model", model, "--input", kit.tmp / "in.txt", "--out", kit.tmp / "v.npy"),
             "sentence_bert_config.json: max_seq_length 100000 is longer than the 64 positions of")
    assert not (kit.tmp / "v.npy").exists()


# ---- config.json fields --------------------------------------------------------------------------------------------
@row("config.json with type_vocab_size 1e9 / 16, pad_token_id 5000, layer_norm_eps \"abc\", a dropout of 7, "
     "vocab_size 50 (the weights hold 100)",
     "one line naming config.json and the field (its type, range, or what the weights hold), before anything is "
     "built; the vocabulary is blamed on the config, not on the tokenizer",
     "no --out file")
def config_fields(kit: Kit) -> None:
    (kit.tmp / "in.txt").write_text("a good film\n")
    vocab = json.loads((kit.enc / "config.json").read_text())["vocab_size"]
    cases = [
        (dict(type_vocab_size=10**9), "type_vocab_size must be in 0..1024 (got 1000000000)"),
        (dict(type_vocab_size=16), "type_vocab_size is 16 but model.safetensors holds 2 token types"),
        (dict(pad_token_id=5000), "pad_token_id is 5000, past the vocabulary"),
        (dict(layer_norm_eps="abc"), "layer_norm_eps must be a number (got 'abc')"),
        (dict(hidden_dropout_prob=7), "hidden_dropout_prob must be between 0 and 1 (got 7)"),
        (dict(vocab_size=50), f"vocab_size is 50 but model.safetensors holds {vocab} word embeddings"),
    ]
    for i, (fields, message) in enumerate(cases):
        model = kit.model_with(f"bad{i}", **fields)
        line = one_line(cli("embed", "--model", model, "--input", kit.tmp / "in.txt", "--out", kit.tmp / "v.npy"),
                        f"{model / 'config.json'}: {message}")
        assert "belongs to another model" not in line
    assert not (kit.tmp / "v.npy").exists()


# ---- bounds ----------------------------------------------------------------------------------------------------------
@row("--max-steps 1e26 as a flag (finetune, pretrain, distill, embed-train) and in a --config file",
     "refused in one line: --max-steps must be in 1..1000000000",
     "nothing written")
def max_steps_bound(kit: Kit) -> None:
    big = str(10**26)
    one_line(cli("finetune", "--task", "sst2", "--model", kit.enc, "--data", kit.sst, "--out", kit.tmp / "a",
                 "--max-steps", big), "--max-steps must be in 1..1000000000")
    one_line(cli("pretrain", "--corpus", kit.corpus, "--out", kit.tmp / "b", "--max-steps", "1e26"),
             "--max-steps must be a whole number in 1..1000000000")
    (kit.tmp / "c.json").write_text(json.dumps({"max_steps": 10**26}))
    one_line(cli("finetune", "--task", "sst2", "--model", kit.enc, "--data", kit.sst, "--out", kit.tmp / "c",
                 "--config", kit.tmp / "c.json"), "max_steps must be in 1..1000000000")
    (kit.tmp / "d.json").write_text(json.dumps({"max_steps": 1e26}))
    one_line(cli("finetune", "--task", "sst2", "--model", kit.enc, "--data", kit.sst, "--out", kit.tmp / "d",
                 "--config", kit.tmp / "d.json"), "max_steps: expected an integer")
    assert not any((kit.tmp / n).exists() for n in "abcd")


@row("longify --max-length 1e12",
     "refused in one line by the flag's bound (65536), before the model is read",
     "no --out folder")
def longify_bound(kit: Kit) -> None:
    one_line(cli("longify", "--model", kit.enc, "--max-length", str(10**12), "--out", kit.tmp / "long"),
             "--max-length must be in 1..65536")
    assert not (kit.tmp / "long").exists()


def mlflow_env(uri: str) -> dict[str, str]:
    """The test environment with MLFLOW_TRACKING_URI=uri, and none of MLflow's switches the user might have set."""
    env = {k: v for k, v in ENV.items() if not k.startswith("MLFLOW_")}
    return {**env, "MLFLOW_TRACKING_URI": uri}


def cli_env(*args: object, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([BERTFORGE, *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=300)


@row("MLFLOW_TRACKING_URI=http://127.0.0.1:9 (nothing listens) with --report-to mlflow",
     "one line naming MLFLOW_TRACKING_URI, within seconds, before any data is read (no retry loop)",
     "no --out folder")
def mlflow_unreachable(kit: Kit) -> None:
    pytest.importorskip("mlflow")
    t = time.perf_counter()
    one_line(cli_env("finetune", "--task", "sst2", "--model", kit.enc, "--data", kit.sst, "--out", kit.tmp / "ft",
                     "--max-steps", "2", "--report-to", "mlflow", env=mlflow_env("http://127.0.0.1:9")),
             "MLFLOW_TRACKING_URI http://127.0.0.1:9: the MLflow store cannot be used")
    assert time.perf_counter() - t < 60 and not (kit.tmp / "ft").exists()


@row("MLFLOW_TRACKING_URI=./mlstore (a folder the user chose) with --report-to mlflow; and one under /proc",
     "the folder store works (the run's metrics are in it); an unusable one is one line before any work",
     "./mlstore holding the run; no --out folder for the refused one")
def mlflow_file_store(kit: Kit) -> None:
    pytest.importorskip("mlflow")
    out = kit.tmp / "ft"
    env = mlflow_env("./mlstore")
    ok(cli_env("finetune", "--task", "sst2", "--model", kit.enc, "--data", kit.sst, "--out", out, "--max-steps", "2",
               "--batch-size", "8", "--no-progress", "--device", "cpu", "--report-to", "mlflow", cwd=kit.tmp,
               env=env))
    runs = [p for p in (kit.tmp / "mlstore").rglob("meta.yaml") if p.parent.parent.name != "mlstore"]
    assert runs and any((p.parent / "metrics").is_dir() for p in runs), sorted((kit.tmp / "mlstore").rglob("*"))
    one_line(cli_env("finetune", "--task", "sst2", "--model", kit.enc, "--data", kit.sst, "--out", kit.tmp / "ft2",
                     "--max-steps", "2", "--report-to", "mlflow", env=mlflow_env("/proc/mlstore")),
             "MLFLOW_TRACKING_URI /proc/mlstore: the MLflow store cannot be used")
    assert not (kit.tmp / "ft2").exists()


# ---- the server and slow clients -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served(models):
    """One server for the module's rows: the tiny encoder, a 1.5 s read timeout, at most 16 connections."""
    from test_serve import _free_port

    port = _free_port()
    proc = start("serve", "--model", models["enc"], "--port", port, "--read-timeout", "1.5", "--max-connections",
                 "16")
    deadline = time.time() + 120
    while time.time() < deadline:
        assert proc.poll() is None, finish(proc).stderr
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    time.sleep(0.5)  # the probe connections above are gone
    yield port
    proc.send_signal(signal.SIGTERM)
    finish(proc, timeout=30)


def _talk(port: int, *parts: bytes, pause: float = 0.0, wait: float = 10.0) -> tuple[bytes, float]:
    """Send `parts` (`pause` seconds apart) until the server stops reading, then read until it closes the
    connection; (answer, seconds taken)."""
    t = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(wait)
        for part in parts:
            try:
                s.sendall(part)
            except OSError:  # closed on us: the answer is waiting
                break
            time.sleep(pause)
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except (socket.timeout, ConnectionResetError):
            pass
    return answer, time.perf_counter() - t


def _json_body(answer: bytes) -> dict:
    return json.loads(answer.split(b"\r\n\r\n", 1)[1])


@row("a client that sends its headers a byte every 0.1 s; one that sends half its body and stops; one that "
     "trickles a chunked body a byte every 0.4 s",
     "408 as JSON and the connection closed once --read-timeout (1.5 s here) has passed, for all three",
     "no connection left open")
def slow_clients(kit: Kit) -> None:
    headers = b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n"
    answer, took = _talk(kit.port, *(headers[i:i + 1] for i in range(len(headers))), pause=0.1)
    assert answer.startswith(b"HTTP/1.1 408") and _json_body(answer)["type"] == "timeout", answer
    assert 1.5 <= took < 8, took
    answer, took = _talk(kit.port, b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                   b"Content-Length: 100\r\n\r\n{\"inputs\": ")
    assert answer.startswith(b"HTTP/1.1 408") and _json_body(answer)["field"] == "body", answer
    assert 1.5 <= took < 8, took
    trickle = [b"POST /embed HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"] + [b"1\r\na\r\n"] * 12
    answer, took = _talk(kit.port, *trickle, pause=0.4)
    assert answer.startswith(b"HTTP/1.1 408") and took < 8, (answer, took)


@row("200 idle connections opened at once to one server",
     "each one over --max-connections (16 here) makes room: the oldest idle one gets 503 at once and is closed; "
     "the last 16 are closed with 408 by the read timeout; the server answers the next request",
     "no connection left open")
def many_connections(kit: Kit) -> None:
    idle = []
    for _ in range(200):
        s = socket.create_connection(("127.0.0.1", kit.port))
        s.settimeout(10)
        idle.append(s)
    first = [s.recv(4096)[:12] for s in idle]
    for s in idle:
        s.close()
    assert first.count(b"HTTP/1.1 503") == 200 - 16 and first.count(b"HTTP/1.1 408") == 16, first
    answer, _ = _talk(kit.port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200"), answer


@row("POST /v1/embeddings with \"dimensions\": 8 to a 32-dimensional model",
     "422 as JSON naming dimensions (the model was not trained to be shortened); dimensions 32 is served",
     "nothing")
def openai_dimensions(kit: Kit) -> None:
    for dims, status in ((8, b"422"), (32, b"200")):
        body = json.dumps({"input": ["a good film"], "dimensions": dims}).encode()
        answer, _ = _talk(kit.port, b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        assert answer.startswith(b"HTTP/1.1 " + status), answer
        if dims == 8:
            assert _json_body(answer)["field"] == "dimensions", answer
        else:
            assert len(_json_body(answer)["data"][0]["embedding"]) == 32


@row("24 connections trickling header bytes against --max-connections 16, then a client with a complete request",
     "the oldest waiting connections are closed with an HTTP 503 to make room (never a reset); the complete request "
     "is answered",
     "no connection left open")
def waiting_connections_make_room(kit: Kit) -> None:
    waiting = []
    for _ in range(24):
        s = socket.create_connection(("127.0.0.1", kit.port))
        s.sendall(b"GET /info HTTP/1.1\r\nHost: x\r\nX-Slow: a")
        s.settimeout(10)
        waiting.append(s)
    answer, took = _talk(kit.port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    first = [s.recv(4096)[:12] for s in waiting[:9]]
    for s in waiting:
        s.close()
    assert answer.startswith(b"HTTP/1.1 200") and took < 1, (answer, took)
    assert first == [b"HTTP/1.1 503"] * 9, first  # 8 for the 8 over the cap, one for the /health


@row("16 connections inside a request (headers in, body pending), then 20 more, each sending a request and 20 KB "
     "more at once",
     "each of the 20 reads an HTTP 503 with a JSON body (the server reads and drops what it still sends before "
     "closing), none a TCP reset",
     "no connection left open")
def full_server_503(kit: Kit) -> None:
    busy = []
    for _ in range(16):
        s = socket.create_connection(("127.0.0.1", kit.port))
        s.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n")
        busy.append(s)
    time.sleep(0.2)
    try:
        answers = [_talk(kit.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + b"X" * 20000, wait=1)[0]
                   for _ in range(20)]
    finally:
        for s in busy:
            s.close()
    assert all(a.startswith(b"HTTP/1.1 503") for a in answers), [a[:40] for a in answers]
    assert _json_body(answers[0])["type"] == "overloaded"


@row("POST /embed with 1.2 million characters of text (truncate: true); then 800,000 characters",
     "413 in one line naming inputs and the --max-request-chars limit (1,000,000 by default); the 800,000 are cut "
     "to the model's length by characters before tokenizing, and answered within seconds",
     "nothing")
def request_chars(kit: Kit) -> None:
    for chars, status in ((1_200_000, b"413"), (800_000, b"200")):
        body = json.dumps({"inputs": ["good film " * (chars // 10)], "truncate": True}).encode()
        head = b"POST /embed HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
        answer, took = _talk(kit.port, head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert answer.startswith(b"HTTP/1.1 " + status) and took < 10, (answer[:300], took)
        if status == b"413":
            error = _json_body(answer)
            assert error["field"] == "inputs" and "1000000" in error["error"] and "\n" not in error["error"]


@row("index query --rerank with a 2-label classifier (a no/yes cross-encoder, or a classifier by mistake); then "
     "with a 3-label one",
     "the 2-label model re-ranks by its label-1 logit; the 3-label one is refused in one line naming the model and "
     "its 3 labels, before any query runs",
     "the index as it was")
def rerank_label_counts(kit: Kit) -> None:
    pytest.importorskip("faiss")
    from bertforge.embedding.cross_encoder import CrossEncoder
    from bertforge.tasks.models import init_from_pretrained, save_task_model
    from bertforge.tokenization import Tokenizer

    idx, three = kit.tmp / "idx", kit.tmp / "three"
    clf, _ = init_from_pretrained(kit.enc, "classify", 3)
    save_task_model(clf, three, ["a", "b", "c"], {"name": "x", "max_seq_len": 32},
                    tokenizer=Tokenizer.from_pretrained(kit.enc))
    ok(cli("index", "build", "--model", kit.enc, "--corpus", kit.corpus, "--out", idx, "--no-progress"))
    hits = json.loads(ok(cli("index", "query", "--index", idx, "the dog ran", "--json", "-k", "4", "--rerank",
                             kit.clf)).stdout.splitlines()[0])["hits"]
    logits = CrossEncoder.from_pretrained(kit.clf).predict(["the dog ran"] * 4, [h["text"] for h in hits])
    assert [h["rerank_score"] for h in hits] == pytest.approx(sorted(logits[:, 1], reverse=True), abs=1e-5)
    before = snapshot(idx)
    one_line(cli("index", "query", "--index", idx, "the dog ran", "--rerank", three), str(three), "3 labels")
    assert snapshot(idx) == before


# ---- smaller ones ---------------------------------------------------------------------------------------------------
@row("a CoNLL training file with three B-FOO typos among PER / LOC entities, --task conll; then with --labels FOO",
     "refused at the first B-FOO's file:line (FOO is no CoNLL-2003 type); --labels FOO trains it as a label",
     "no --out folder for the refused run; a model with B-FOO among its labels for the other")
def conll_typos(kit: Kit) -> None:
    data = kit.tmp / "conll"
    shutil.copytree(kit.conll, data)
    lines = (data / "train.txt").read_text().splitlines()
    for at in (3, 30, 60):
        lines[at] = "Zurich X X B-FOO"
    (data / "train.txt").write_text("\n".join(lines) + "\n")
    out = kit.tmp / "ner"
    base = ["finetune", "--task", "conll", "--model", kit.enc, "--data", data, "--out", out, "--max-steps", "2",
            "--batch-size", "8", "--no-progress", "--device", "cpu"]
    one_line(cli(*base), "train.txt:4: entity type 'FOO' (B-FOO) is not one of the task's",
             "pass --labels FOO")
    assert not out.exists()
    ok(cli(*base, "--labels", "FOO"))
    assert "B-FOO" in json.loads((out / "config.json").read_text())["id2label"].values()


KILLED_AT_STEP = """
    import os, signal, sys
    from bertforge.distillation.task import Distiller
    from bertforge.cli import main

    forward, calls, at = Distiller.forward, [0], int(sys.argv[1])

    def forward_until(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return forward(self, *args, **kwargs)

    Distiller.forward = forward_until
    sys.exit(main(sys.argv[2:]))
"""


@row("distill task SIGKILLed in its second epoch after a checkpoint, then --resume",
     "the same weights and the same metrics.jsonl, byte for byte, as the uninterrupted run",
     "model.safetensors and metrics.jsonl equal to the uninterrupted run's")
def distill_task_resume(kit: Kit) -> None:
    args = ["distill", "task", "--teacher", kit.clf, "--task", "sst2", "--data", kit.sst, "--student", "layers:1",
            "--max-steps", "12", "--save-every", "2", "--batch-size", "8", "--device", "cpu", "--seed", "1"]
    whole, broken = kit.tmp / "whole", kit.tmp / "broken"
    ok(cli(*args, "--out", whole))
    recorded_exactly(whole)
    killed = python_cli(KILLED_AT_STEP, 11, *args, "--out", broken)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    ok(cli(*args, "--out", broken, "--resume"))
    for name in ("model.safetensors", "metrics.jsonl"):
        assert (broken / name).read_bytes() == (whole / name).read_bytes(), name


@row("finetune --report-to tensorboard --logging-dir OUT/tb --out OUT, then the same command with --resume",
     "both run: the logging folder inside --out is output, not an input",
     "OUT/tb with the event files, the run resumed")
def logging_dir_inside_out(kit: Kit) -> None:
    pytest.importorskip("tensorboard")
    out = kit.tmp / "ft"
    args = ["finetune", "--task", "sst2", "--model", kit.enc, "--data", kit.sst, "--out", out, "--batch-size", "8",
            "--no-progress", "--device", "cpu", "--report-to", "tensorboard", "--logging-dir", out / "tb"]
    ok(cli(*args, "--max-steps", "2"))
    ok(cli(*args, "--max-steps", "4", "--resume"))
    assert list((out / "tb").glob("events.out.tfevents.*"))
    recorded_exactly(out)  # the event files of both segments too
    assert json.loads((out / "run_options.json").read_text())["options"]["max_steps"] == 4


@row("finetune --config OUT/run_options.json --out OUT --resume (the run's own record given back to it)",
     "accepted: the record is read whole before the run starts, so it is no input the run could overwrite",
     "the run resumed with its recorded options")
def config_from_the_run_itself(kit: Kit) -> None:
    out = kit.tmp / "ft"
    ok(cli("finetune", "--task", "sst2", "--model", kit.enc, "--data", kit.sst, "--out", out, "--max-steps", "2",
           "--batch-size", "8", "--no-progress", "--device", "cpu"))
    ok(cli("finetune", "--config", out / "run_options.json", "--model", kit.enc, "--out", out, "--resume",
           "--max-steps", "3"))
    assert json.loads((out / "run_options.json").read_text())["options"]["max_steps"] == 3


@row("two --config files on one command line",
     "refused in one line naming both (which one wins for a key both hold is no rule to guess)",
     "nothing written")
def two_configs(kit: Kit) -> None:
    (kit.tmp / "a.json").write_text('{"max_steps": 2}')
    (kit.tmp / "b.json").write_text('{"max_steps": 3}')
    one_line(cli("finetune", "--task", "sst2", "--model", kit.enc, "--data", kit.sst, "--out", kit.tmp / "ft",
                 "--config", kit.tmp / "a.json", "--config", kit.tmp / "b.json"),
             "--config is given 2 times", "a.json", "b.json")
    assert not (kit.tmp / "ft").exists()


# ---- the input probe: what a file says, read as it says it ------------------------------------------------------
def _gzip(path: Path, text: str) -> Path:
    import gzip

    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(text)
    return path


FINETUNE = ["--max-steps", "2", "--batch-size", "8", "--no-progress", "--device", "cpu"]


@row("tokenizer train on corpus.csv.gz and a gzipped JSON list (.json.gz); finetune on train.tsv.gz / dev.tsv.gz; "
     "a .zst corpus without zstandard",
     "each read as the format under the compression suffix (rows of the text column, never the compressed or JSON "
     "text itself); the .zst file one line naming zstandard",
     "a tokenizer whose vocabulary holds no JSON punctuation; a fine-tuned model")
def compressed_inputs(kit: Kit) -> None:
    lines = kit.corpus.read_text().splitlines()
    _gzip(kit.tmp / "corpus.csv.gz", "text\n" + "\n".join(f'"{t}"' for t in lines) + "\n")
    _gzip(kit.tmp / "corpus.json.gz", json.dumps([{"text": t} for t in lines]))
    ok(cli("tokenizer", "train", "--corpus", kit.tmp / "corpus.csv.gz", kit.tmp / "corpus.json.gz", "--out",
           kit.tmp / "tok", "--vocab-size", "80", "--min-frequency", "1", "--no-progress"))
    vocab = json.loads((kit.tmp / "tok" / "tokenizer.json").read_text())["model"]["vocab"]
    assert not {"{", "[", ":", "text"} & set(vocab), sorted(vocab)[:40]
    data = kit.tmp / "sst"
    data.mkdir()
    for name in ("train", "dev"):
        _gzip(data / f"{name}.tsv.gz", (kit.sst / f"{name}.tsv").read_text())
    ok(cli("finetune", "--task", "sst2", "--model", kit.enc, "--data", data, "--out", kit.tmp / "ft", *FINETUNE))
    (kit.tmp / "c.txt.zst").write_bytes(b"\x28\xb5\x2f\xfd")
    script = "import sys; sys.modules['zstandard'] = None\nfrom bertforge.cli import main\nsys.exit(main(sys.argv[1:]))"
    one_line(python_cli(script, "tokenizer", "train", "--corpus", kit.tmp / "c.txt.zst", "--out", kit.tmp / "t2",
                        "--no-progress"),
             "c.txt.zst: reading a .zst file needs zstandard")


@row("train.jsonl with a line naming \"label\" twice; a Parquet file with two columns named text",
     "refused in one line naming the key and the line (the column and the row), as a CSV header naming a column twice",
     "no --out folder")
def duplicate_keys(kit: Kit) -> None:
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = kit.tmp / "d"
    data.mkdir()
    (data / "train.jsonl").write_text('{"text": "a good film", "label": 1}\n{"text": "bad", "label": 0, "label": 1}\n')
    base = ["finetune", "--task", "classify", "--model", kit.enc, "--out", kit.tmp / "ft", *FINETUNE]
    one_line(cli(*base, "--data", data), "train.jsonl:2: the key 'label' appears twice in one object")
    (data / "train.jsonl").unlink()
    pq.write_table(pa.Table.from_arrays([pa.array(["a", "b"]), pa.array(["c", "d"]), pa.array([0, 1])],
                                        names=["text", "text", "label"]), data / "train.parquet")
    one_line(cli(*base, "--data", data), "train.parquet row 0: the schema names the column 'text' more than once")
    assert not (kit.tmp / "ft").exists()


@row("a binary train.csv whose labels are written 1, 1.0, \"1\", true (and 0, 0.0, false), finetune --task classify",
     "one class per value: 2 classes, named 0 and 1",
     "a model whose config.json has two labels, 0 and 1")
def labels_by_value(kit: Kit) -> None:
    data = kit.tmp / "d"
    data.mkdir()
    rows = [(t, lab) for t, lab in zip(kit.corpus.read_text().splitlines()[:48],
                                       ["1", "1.0", '"1"', "true", "0", "0.0", "false", "0"] * 6)]
    (data / "train.csv").write_text("text,label\n" + "".join(f"{t},{lab}\n" for t, lab in rows))
    ok(cli("finetune", "--task", "classify", "--model", kit.enc, "--data", data, "--out", kit.tmp / "ft", *FINETUNE))
    assert json.loads((kit.tmp / "ft" / "config.json").read_text())["id2label"] == {"0": "0", "1": "1"}


@row("--data holding train.csv and train.jsonl; a folder ./acme/fr beside a Hub id acme/fr, with and without "
     "--revision; hf://acme/fr",
     "the two files refused in one line naming both; the folder read with a notice naming it; with --revision one "
     "line saying a folder shadows the id and to write hf://acme/fr; hf:// asks the Hub (offline: its cache)",
     "no --out folder but the one the shadowing folder's run wrote")
def silent_choices(kit: Kit) -> None:
    data = kit.tmp / "d"
    data.mkdir()
    (data / "train.csv").write_text("text,label\na,1\n")
    (data / "train.jsonl").write_text('{"text": "a", "label": 1}\n')
    one_line(cli("finetune", "--task", "classify", "--model", kit.enc, "--data", data, "--out", kit.tmp / "ft",
                 *FINETUNE), "both train.csv and train.jsonl hold the train split")
    shutil.copytree(kit.clf, kit.tmp / "acme" / "fr")
    (kit.tmp / "in.txt").write_text("a good film\n")
    base = ["predict", "--input", "in.txt", "--out", "p.jsonl"]
    done = ok(cli(*base, "--model", "acme/fr", cwd=kit.tmp))
    assert "--model acme/fr: read from the local folder" in done.stderr and "hf://acme/fr" in done.stderr
    one_line(cli(*base, "--model", "acme/fr", "--revision", "v1", cwd=kit.tmp),
             "--model acme/fr: --revision v1 names a version of a Hugging Face Hub model, but a local folder of "
             "that name shadows the id; write hf://acme/fr")
    one_line(cli(*base, "--model", "hf://acme/fr", cwd=kit.tmp), "--model hf://acme/fr: not in the Hugging Face cache")
    assert not (kit.tmp / "ft").exists()


@row("--model acme/a--b, --model acmé/fr, --model acme/fr. (predict, and serve's model registration)",
     "one line: no such folder, and not a Hugging Face Hub id (the Hub's own reason), never an HFValidationError",
     "nothing written")
def invalid_hub_ids(kit: Kit) -> None:
    (kit.tmp / "in.txt").write_text("a good film\n")
    for name in ("acme/a--b", "acmé/fr", "acme/fr."):
        one_line(cli("predict", "--model", name, "--input", kit.tmp / "in.txt", "--out", kit.tmp / "p.jsonl"),
                 f"--model {name}: no such folder, and not a Hugging Face Hub id")
    one_line(cli("serve", "--model", f"m=acme/a--b", "--port", "0"), "--model m=acme/a--b: no such folder, and not")
    assert not (kit.tmp / "p.jsonl").exists()


@row("predict on a CSV whose text field is 200 KB, and on a one-line text of 5 MB",
     "both predicted (the csv module's 128 KiB field limit raised; a text over 1,000,000 characters cut before "
     "tokenizing)",
     "one prediction per input row")
def long_fields(kit: Kit) -> None:
    words = kit.corpus.read_text().split()
    long = " ".join(words * (200_000 // len(" ".join(words)) + 1))
    (kit.tmp / "long.csv").write_text(f'text\n"{long}"\nshort\n')
    (kit.tmp / "huge.txt").write_text(" ".join(words * (5_000_000 // len(" ".join(words)) + 1)) + "\n")
    for name in ("long.csv", "huge.txt"):
        ok(cli("predict", "--model", kit.clf, "--input", kit.tmp / name, "--out", kit.tmp / f"{name}.jsonl"))
    assert len((kit.tmp / "long.csv.jsonl").read_text().splitlines()) == 2
    assert len((kit.tmp / "huge.txt.jsonl").read_text().splitlines()) == 1


@row("predict on a CSV with an invalid UTF-8 byte on line 700 (past the decoder's first chunk)",
     "one line naming line 700, the line that holds the byte",
     "no --out file")
def utf8_line(kit: Kit) -> None:
    data = ("text\n" + "".join(f"sentence number {i} is plain text\n" for i in range(2, 1000))).encode()
    at = data.index(b"number 700 ")
    (kit.tmp / "bad.csv").write_bytes(data[:at] + b"\xff" + data[at:])
    one_line(cli("predict", "--model", kit.clf, "--input", kit.tmp / "bad.csv", "--out", kit.tmp / "p.jsonl"),
             "bad.csv:700: invalid UTF-8 (byte 0xff)")
    assert not (kit.tmp / "p.jsonl").exists()


HIDE_ONNXRUNTIME = "import sys; sys.modules['onnxruntime'] = None\nfrom bertforge.cli import main\n" \
                   "sys.exit(main(sys.argv[1:]))"


@row("predict and embed on a folder `export` wrote (model.onnx, no PyTorch weights) where onnxruntime is missing",
     "one line naming the export extra, before the input is read",
     "no --out file")
def onnx_without_runtime(kit: Kit) -> None:
    exported = kit.tmp / "exported"
    shutil.copytree(kit.clf, exported)
    (exported / "model.safetensors").unlink()
    (exported / "model.onnx").write_bytes(b"never read")
    for verb in ("predict", "embed"):
        one_line(python_cli(HIDE_ONNXRUNTIME, verb, "--model", exported, "--input", kit.tmp / "absent.txt", "--out",
                            kit.tmp / "o.jsonl"),
                 f"--model {exported} needs onnxruntime, which is not installed: pip install 'bertforge[export]'")
    assert not (kit.tmp / "o.jsonl").exists()


@row("a model folder whose config.json says model_type deberta-v2 over another family's model.safetensors",
     "one line: the config and the weights disagree about the model's family (not a field the config lacks)",
     "nothing written")
def config_family(kit: Kit) -> None:
    model = kit.model_with("mixed", model_type="deberta-v2")
    (kit.tmp / "in.txt").write_text("a good film\n")
    one_line(cli("embed", "--model", model, "--input", kit.tmp / "in.txt", "--out", kit.tmp / "e.npy"),
             "config.json: the config and the weights disagree about the model's family: model_type is "
             "'deberta-v2', but model.safetensors names its tensors as another family does (bert")
    assert not (kit.tmp / "e.npy").exists()


@row("finetune --resume after the --model folder moved to a path that shares its first 60 characters",
     "refused in one line that shows where the two paths differ, with context",
     "the run as it was")
def resume_moved_model(kit: Kit) -> None:
    deep = kit.tmp / ("checkpoints-of-the-encoder-used-for-this-experiment" + "-x" * 10)
    shutil.copytree(kit.enc, deep / "one" / "enc")
    shutil.copytree(kit.enc, deep / "two" / "enc")
    out = kit.tmp / "ft"
    args = ["finetune", "--task", "sst2", "--data", kit.sst, "--out", out, *FINETUNE]
    ok(cli(*args, "--model", deep / "one" / "enc"))
    line = one_line(cli(*args, "--model", deep / "two" / "enc", "--resume"), "--model was ...")
    assert "one/enc" in line and "two/enc" in line, line
# ---- the second probe ------------------------------------------------------------------------------------------------
SAVED_IN_THE_STORE = """
    import sys
    from pathlib import Path
    import bertforge.training.reporting as r
    from bertforge.cli import main

    out, argv = Path(sys.argv[1]), sys.argv[2:]
    write = r.MlflowReporter.write

    def write_while_the_user_saves(self, record):
        run = next((out / "mlruns").glob(f"*/{self.run_id}"))
        for mine in (out / "mlruns" / "notes.txt", run / "notes.txt"):  # the user, not bertforge's writers
            mine.write_text("saved into the store while the run went on\\n")
        return write(self, record)

    r.MlflowReporter.write = write_while_the_user_saves
    sys.exit(main(argv))
"""


@row("finetune --report-to mlflow (the store in OUT/mlruns) while the user saves files into OUT/mlruns and into the "
     "run's folder there, then the same command with --overwrite",
     "the manifest records the files MLflow wrote for the run, not the user's; --overwrite keeps them (a warning "
     "names mlruns/)",
     "the user's two files, byte for byte, beside the new run's store")
def user_file_in_the_mlflow_store(kit: Kit) -> None:
    pytest.importorskip("mlflow")
    out = kit.tmp / "ft"
    args = ["finetune", "--task", "sst2", "--model", kit.enc, "--data", kit.sst, "--out", out, "--max-steps", "2",
            "--batch-size", "8", "--no-progress", "--device", "cpu", "--report-to", "mlflow"]
    env = {k: v for k, v in ENV.items() if not k.startswith("MLFLOW_")}  # the store in OUT/mlruns
    ok(subprocess.run([sys.executable, "-c", textwrap.dedent(SAVED_IN_THE_STORE), str(out), *map(str, args)],
                      capture_output=True, text=True, env=env, timeout=300))
    mine = sorted(p.relative_to(out).as_posix() for p in out.rglob("notes.txt"))
    assert len(mine) == 2, mine
    recorded_exactly(out, besides=tuple(mine))  # MLflow's files of the run are recorded; the user's are not
    proc = ok(cli_env(*args, "--overwrite", env=env))
    assert "kept mlruns" in proc.stderr, proc.stderr
    for rel in mine:
        assert (out / rel).read_text() == "saved into the store while the run went on\n", rel
    recorded_exactly(out, besides=tuple(mine))  # the new run's store: its own files again, the user's still not


PRETRAIN_KILLED_AT_STEP = """
    import os, signal, sys
    import torch
    from bertforge.pretraining.objectives import ELECTRAObjective
    from bertforge.cli import main

    forward, steps, at = ELECTRAObjective.forward, [0], int(sys.argv[1])

    def forward_until(self, *args, **kwargs):
        steps[0] += torch.is_grad_enabled()  # training steps, not the held-out evaluation
        if steps[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return forward(self, *args, **kwargs)

    ELECTRAObjective.forward = forward_until
    sys.exit(main(sys.argv[2:]))
"""


@row("pretrain --recipe deberta-v3 (gradient-disentangled embedding sharing) SIGKILLed in step 3, after its step-2 "
     "checkpoint, then --resume",
     "the same weights (discriminator, generator, E_delta) and metrics.jsonl, byte for byte, as the uninterrupted run",
     "the model files and metrics.jsonl equal to the uninterrupted run's")
def deberta_v3_resume(kit: Kit) -> None:
    from test_pretrain_reliability import write_corpus

    corpus = write_corpus(kit.tmp / "grammar.txt")
    args = ["pretrain", "--recipe", "deberta-v3", "--corpus", corpus, "--size", "bert-tiny", "--vocab-size", "150",
            "--seq-len", "32", "--batch-size", "8", "--max-steps", "4", "--save-every", "2", "--log-every", "1",
            "--no-progress", "--threads", "1", "--heldout-fraction", "0.2", "--eval-batches", "1"]
    whole, broken = kit.tmp / "whole", kit.tmp / "broken"
    ok(cli(*args, "--out", whole))
    killed = python_cli(PRETRAIN_KILLED_AT_STEP, 3, *args, "--out", broken)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (broken / "checkpoints" / "step-2").is_dir() and not (broken / "model.safetensors").exists()
    ok(cli(*args, "--out", broken, "--resume"))
    for name in ("model.safetensors", "discriminator/model.safetensors", "generator/model.safetensors",
                 "gdes_delta.safetensors", "metrics.jsonl"):
        assert (broken / name).read_bytes() == (whole / name).read_bytes(), name


@row("bertforge pretrain with no arguments (the README's demo; here with --time-budget 10s), watched as it runs",
     "a first line within a second of the start, a progress bar whose total (the budget's seconds) never changes, "
     "and a final report that says what to expect of a few minutes' model and how to get one that fills masks",
     "the demo's model in --out")
def demo_says_what_to_expect(kit: Kit) -> None:
    out = kit.tmp / "demo"
    t = time.perf_counter()
    proc = start("pretrain", "--time-budget", "10s", "--out", out)
    first = proc.stdout.readline()
    waited = time.perf_counter() - t
    rest = finish(proc)
    ok(rest)
    assert first.startswith("pretrain: bert on the built-in demo corpus") and "10s of training" in first, first
    assert waited < 2.0, waited  # a second where the machine is not shared by parallel tests
    totals = set(re.findall(r"train:[^\r\n]*?\| [\d.]+/(\d+) s", rest.stderr))
    assert totals == {"10"}, (totals, rest.stderr[-2000:])  # one total, known at the start: never re-estimated
    note = next((line for line in rest.stdout.splitlines() if line.startswith("what to expect: ")), "")
    # Ten seconds of training usually leaves guesses that miss their answers, but how many steps fit depends on the
    # machine: the note must say what the saved fill-mask examples show (missed answers, one first guess for all).
    from bertforge.pretraining.report import expectation

    result = json.loads((out / "eval_results.json").read_text())
    fills, want = result["fill_mask"], expectation(result)
    assert note == (want or ""), (note, want, rest.stdout)
    missed = sum(f["answer"] not in [p["token"] for p in f["predictions"]] for f in fills)
    if missed * 2 >= len(fills):
        assert "is not among the guesses for" in note and "--time-budget" in note, rest.stdout


@row("the README's test command, run as written: do the skipped tests say why, as the README promises?",
     "-rs in the README's command and in CI's (.ci/run), the two otherwise the same command; the stated time honest",
     "nothing (the files are read)")
def readme_test_command_shows_skip_reasons(kit: Kit) -> None:
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text(encoding="utf-8")
    theirs = readme.splitlines()[1].split(" && ")[-1]  # the README's second command ends with the test run
    ours = next(line for line in (root / ".ci" / "run").read_text().splitlines() if "-m pytest" in line)
    assert theirs.split() == ours.replace(" -p no:cacheprovider", "").split(), (theirs, ours)
    assert "-rs" in theirs.split(), theirs
    assert "about 15–35 minutes on two cores, depending on load" in " ".join(readme.split())


@row("the Python API given what the command line's parser used to refuse: embed(model=3), batch_size=\"32\", "
     "normalize=\"no\", finetune(task=None), out=None, epochs=\"3\", max_steps=10**30, lr=nan, resume=\"yes\", "
     "Index.search(None), create_app(None)",
     "one bertforge.ArgumentError each (a ValueError and a TypeError) whose one line starts with the parameter, "
     "before any file is read or model loaded (tests/test_api_arguments.py holds a row per public function)",
     "nothing: no output folder, the inputs unchanged")
def python_api_checks_its_arguments(kit: Kit) -> None:
    out = kit.tmp / "api-out"
    script = f"""
        import math, bertforge
        from bertforge.errors import ArgumentError
        m, d, o = {str(kit.clf)!r}, {str(kit.sst)!r}, {str(out)!r}
        index = object.__new__(bertforge.Index)
        cases = [("model", lambda: bertforge.embed(3, ["a"])),
                 ("batch_size", lambda: bertforge.embed(m, ["a"], batch_size="32")),
                 ("normalize", lambda: bertforge.embed(m, ["a"], normalize="no")),
                 ("task", lambda: bertforge.finetune(m, d, task=None, out=o)),
                 ("out", lambda: bertforge.finetune(m, d, task="sst2", out=None)),
                 ("epochs", lambda: bertforge.finetune(m, d, task="sst2", out=o, epochs="3")),
                 ("max_steps", lambda: bertforge.finetune(m, d, task="sst2", out=o, max_steps=10**30)),
                 ("lr", lambda: bertforge.finetune(m, d, task="sst2", out=o, lr=math.nan)),
                 ("resume", lambda: bertforge.finetune(m, d, task="sst2", out=o, resume="yes")),
                 ("queries", lambda: index.search(None)),
                 ("models", lambda: bertforge.create_app(None))]
        for param, call in cases:
            try:
                call()
            except ArgumentError as err:
                assert isinstance(err, ValueError) and isinstance(err, TypeError)
                line = str(err)
                assert line.startswith(param) and "\\n" not in line and "--" not in line, line
                print(line)
            else:
                raise SystemExit(f"{{param}}: no error")
        """
    before = snapshot(kit.clf), snapshot(kit.sst)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, env=ENV,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(proc.stdout.strip().splitlines()) == 11, proc.stdout
    assert not out.exists() and (snapshot(kit.clf), snapshot(kit.sst)) == before
