"""Reliability (issue #33): no verb destroys or loses data. --out never clears or writes an input, --overwrite
deletes only what bertforge wrote, prune / tokenizer train refuse an earlier output, `index add` commits in one
step, a resume after a kill logs no line twice and survives a damaged checkpoint, a failed run leaves nothing in
the way and no partial files. Real console-script processes throughout."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from bertforge.cli import OUTPUT_DESTS, build_parser, input_actions
from bertforge.commands.bounds import Number
from bertforge.io.rundir import MANIFEST_FILE

BERTFORGE = shutil.which("bertforge", path=str(Path(sys.executable).parent)) or shutil.which("bertforge")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
REFUSAL = "bertforge never writes where it reads"


def start(*args: object, **kw) -> subprocess.Popen:
    assert BERTFORGE, "the bertforge console script is not installed"
    return subprocess.Popen([BERTFORGE, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV, **kw)


def finish(proc: subprocess.Popen, timeout: float = 300) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def cli(*args: object, **kw) -> subprocess.CompletedProcess:
    return finish(start(*args, **kw))


def one_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2 and exactly one line on stderr, holding every needle."""
    assert proc.returncode == 2, (proc.args, proc.returncode, proc.stderr[-3000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], (proc.args, lines[0])
    return lines[0]


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, (proc.args, proc.stderr[-3000:])
    return proc


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under root (links as links) with the sha256 of each file: equal snapshots = untouched."""
    found = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            found[rel] = "link:" + os.readlink(p)
        elif p.is_file():
            found[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            found[rel] = "dir"
    return found


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A tiny BERT encoder folder (config, weights, WordPiece tokenizer)."""
    from bertforge.model.checkpoint import save_pretrained
    from bertforge.config import ModelConfig
    from bertforge.model import Encoder
    from bertforge.tokenization import Tokenizer

    root = tmp_path_factory.mktemp("enc")
    lines = [f"the cat sat on the mat number {i} and the dog ran to the tree" for i in range(100)]
    tok = Tokenizer.train(lines, kind="wordpiece", vocab_size=100, min_frequency=1)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)
    save_pretrained(Encoder(cfg), root / "model", cfg, tokenizer=tok)
    return root / "model"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    sys.path.insert(0, str(Path(__file__).parent))
    from test_pretrain_reliability import write_corpus  # the same small grammar the pretraining tests use

    return write_corpus(tmp_path_factory.mktemp("corpus") / "small.txt")


# ---- 1. --out is never an input: every verb, every input flag, from the parsers -----------------------------------
def _leaf_parsers(parser: argparse.ArgumentParser, name: str = "") -> list[tuple[str, argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(name.strip(), parser)]
    return [leaf for verb, sp in subs[0].choices.items() for leaf in _leaf_parsers(sp, f"{name} {verb}")]


def _argv(verb: str, parser: argparse.ArgumentParser, tested: argparse.Action, value: Path, out: Path,
          other: Path) -> list[str]:
    """A command line the parser accepts: the tested input flag = value, --out = out, every other required option
    filled (a choice, a number, an unrelated existing folder, a word)."""
    argv = verb.split()
    one_of = {g._group_actions[0] for g in parser._mutually_exclusive_groups if g.required}
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction) or not (a.required or a is tested or a.dest in OUTPUT_DESTS
                                                       or a in one_of):
            continue
        if a.dest in OUTPUT_DESTS:
            v = str(out)
        elif a is tested:
            v = str(value)
        elif a.choices is not None:
            v = str(next(iter(a.choices)))
        elif a.type in (int, float) or isinstance(a.type, Number):
            v = "1"
            try:
                a.type(v)
            except Exception:  # a bound that excludes 1, e.g. a share in (0, 1)
                v = "0.5"
        elif a in input_actions(parser):
            v = str(other)
        else:
            v = "x"
        argv += [a.option_strings[-1], v] if a.option_strings else [v]
    return argv


def _cases(tmp: Path) -> list[tuple[str, list[str], Path, str]]:
    """(verb, argv, the input folder to compare afterwards, what the refusal must say) for every verb with --out
    and every input option it has: --out = the input; for a verb's first input also --out inside it / holding it."""
    cases = []
    for verb, parser in _leaf_parsers(build_parser()):
        if not any(a.dest in OUTPUT_DESTS for a in parser._actions):
            continue
        overwrite = ["--overwrite"] if any(a.dest == "overwrite" for a in parser._actions) else []
        # --config is read (as a file) before anything else: its values are the verb's options, not an input here
        for i, action in enumerate(a for a in input_actions(parser) if "--config" not in a.option_strings):
            flag = action.option_strings[-1]
            x = tmp / f"{verb.replace(' ', '-')}{flag}"
            (x / "src").mkdir(parents=True)
            (x / "config.json").write_text('{"model_type": "bert"}\n')
            (x / "thesis.txt").write_text("years of work\n")
            (x / "src" / "a.py").write_text("print('mine')\n")
            holder = tmp / "holds" / x.name
            shutil.copytree(x, holder / "in")
            outs = [(x, x, "is the"), (x, x / "run", "is inside the"), (holder / "in", holder, "holds the")]
            for value, out, how in outs[:3 if i == 0 else 1]:
                cases.append((verb, _argv(verb, parser, action, value, out, tmp / "other") + overwrite, value,
                              f"{how} {flag}"))
    return cases


def test_out_overlapping_any_input_is_refused_for_every_verb(tmp_path, capsys):
    """Every (verb, input flag) pair, built from the parsers: a new verb or flag is in the table by itself. Run
    through `bertforge.cli.main` (what the console script calls) in this process: as ~45 processes that each
    import torch this took 12 minutes on the shared 2-core machine. The issue's own cases run as processes below."""
    from bertforge.cli import main

    (tmp_path / "other").mkdir()
    cases = _cases(tmp_path)
    verbs = {verb for verb, *_ in cases}
    # the verbs the issue found destroying their input are all in the table (built from the parsers)
    assert {"quantize", "export", "prune", "finetune", "embed-train", "pretrain", "distill task", "distill general",
            "longify", "tokenizer train", "index build", "prepare"} <= verbs, verbs
    for verb, argv, value, needle in cases:
        before = snapshot(value)
        capsys.readouterr()
        assert main(argv) == 2, argv
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0] and REFUSAL in lines[0], (argv, lines)
        assert lines[0].startswith(f"bertforge {verb.split()[0]}: error: --out "), lines[0]
        assert snapshot(value) == before, (argv, "the input changed")


def test_the_issues_cases_are_refused_by_the_console_script(model, corpus, tmp_path):
    """`--out X` = the input folder X, with --overwrite: X stays byte-identical (the issue's seven losses)."""
    x = tmp_path / "X"
    shutil.copytree(model, x)
    before = snapshot(x)
    data = tmp_path / "sst"
    data.mkdir()
    (data / "train.tsv").write_text("sentence\tlabel\nthe cat\t1\nthe dog\t0\n")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("the cat\tthe dog\t0.5\n")
    runs = [(["quantize", "--model", x], "--model"), (["export", "--model", x], "--model"),
            (["finetune", "--task", "sst2", "--data", data, "--model", x], "--model"),
            (["embed-train", "--model", x, "--train", pairs], "--model"),
            (["pretrain", "--init-from", x, "--corpus", corpus, "--max-steps", "1"], "--init-from"),
            (["prune", "--model", x, "--task", "sst2", "--data", data, "--fraction", "0.5"], "--model"),
            (["distill", "task", "--teacher", x, "--task", "sst2", "--data", data], "--teacher")]
    procs = [(flag, start(*argv, "--out", x, "--overwrite")) for argv, flag in runs]
    for flag, proc in procs:
        one_line(finish(proc), f"--out {x} is the {flag} folder {x}", REFUSAL)
    assert snapshot(x) == before


def test_a_default_out_that_is_an_input_is_refused_by_the_claim(corpus, tmp_path):
    """pretrain's --out defaults to runs/pretrain-RECIPE: the claim checks the inputs the CLI saw, defaults too."""
    x = tmp_path / "runs" / "pretrain-bert"
    shutil.copytree(corpus.parent, x)
    before = snapshot(x)
    one_line(cli("pretrain", "--corpus", x / corpus.name, "--overwrite", "--max-steps", "1", cwd=tmp_path),
             f"--out runs/pretrain-bert holds the --corpus file {x / corpus.name}", REFUSAL)
    assert snapshot(x) == before


def test_out_through_a_symlink_to_the_input_is_refused(model, tmp_path):
    x = tmp_path / "x"
    shutil.copytree(model, x)
    (tmp_path / "link").symlink_to(x)
    before = snapshot(x)
    for verb in ("quantize", "export"):
        one_line(cli(verb, "--model", x, "--out", tmp_path / "link", "--overwrite"),
                 f"--out {tmp_path / 'link'} is the --model folder {x}", REFUSAL)
    assert snapshot(x) == before


# ---- 2. --overwrite deletes only what bertforge wrote ---------------------------------------------------------------
def test_overwrite_deletes_only_files_bertforge_wrote(model, corpus, tmp_path):
    t = tmp_path / "tok"
    ok(cli("tokenizer", "train", "--corpus", corpus, "--out", t, "--vocab-size", "120"))
    written = json.loads((t / MANIFEST_FILE).read_text())["files"]
    assert sorted(written) == sorted(p.name for p in t.iterdir() if p.name != MANIFEST_FILE)  # exactly its own files
    for n in written:  # with each file's size and sha256
        data = (t / n).read_bytes()
        assert written[n] == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}, n
    (t / "thesis.txt").write_text("years of work\n")  # the user adds files afterwards
    (t / "src").mkdir()
    (t / "src" / "a.py").write_text("print('mine')\n")
    mine = {"thesis.txt": snapshot(t)["thesis.txt"], "src/a.py": snapshot(t)["src/a.py"]}
    proc = ok(cli("tokenizer", "train", "--corpus", corpus, "--out", t, "--kind", "bpe", "--vocab-size", "300",
                  "--overwrite"))
    assert "kept src/, thesis.txt (not written by bertforge, or changed since)" in proc.stderr
    assert {k: snapshot(t)[k] for k in mine} == mine
    assert json.loads((t / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    assert not (t / "vocab.txt").exists()  # the WordPiece run's own file went
    assert "thesis.txt" not in json.loads((t / MANIFEST_FILE).read_text())["files"]

    # the issue's folder: thesis.txt, src/ and a config.json, no manifest: quantize --overwrite keeps the first two
    d = tmp_path / "mine"
    (d / "src").mkdir(parents=True)
    (d / "thesis.txt").write_text("years of work\n")
    (d / "src" / "a.py").write_text("print('mine')\n")
    (d / "config.json").write_text("{}\n")
    keep = {k: v for k, v in snapshot(d).items() if k != "config.json"}
    ok(cli("quantize", "--model", model, "--out", d, "--overwrite"))
    assert {k: snapshot(d)[k] for k in keep} == keep
    assert json.loads((d / "config.json").read_text())["bertforge_quantization"]

    # only foreign files: refused even with --overwrite, untouched
    f = tmp_path / "foreign"
    (f / "src").mkdir(parents=True)
    (f / "thesis.txt").write_text("years of work\n")
    before = snapshot(f)
    one_line(cli("quantize", "--model", model, "--out", f, "--overwrite"), "holds files bertforge did not write")
    assert snapshot(f) == before


# ---- 3. prune and tokenizer train refuse an earlier output ------------------------------------------------------
def test_prune_and_tokenizer_train_refuse_an_existing_out(model, corpus, tmp_path):
    t = tmp_path / "tok"
    ok(cli("tokenizer", "train", "--corpus", corpus, "--out", t, "--vocab-size", "120"))
    run = tmp_path / "ft-run"
    shutil.copytree(model, run)  # an earlier fine-tuning run's folder (config.json, weights, tokenizer)
    before_t, before_run = snapshot(t), snapshot(run)
    data = tmp_path / "dev.tsv"
    data.write_text("sentence\tlabel\nthe cat\t1\nthe dog\t0\n")
    tok_p = start("tokenizer", "train", "--corpus", corpus, "--out", t, "--vocab-size", "110")
    prune_p = start("prune", "--model", model, "--task", "sst2", "--data", data, "--fraction", "0.5", "--out", run)
    one_line(finish(tok_p), f"--out {t} already holds an earlier run", "--overwrite to replace it")
    one_line(finish(prune_p), f"--out {run} already holds an earlier run", "--overwrite to replace it")
    assert snapshot(t) == before_t and snapshot(run) == before_run


# ---- 4. index add commits in one step -------------------------------------------------------------------------------
KILLED_ADD = textwrap.dedent("""
    import os, signal, sys
    from bertforge.cli import main

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    point = sys.argv[1]
    replace, unlink = os.replace, os.unlink
    removed = []
    if point == "before-commit":  # the new generation's files written, meta.json not yet switched
        os.replace = lambda a, b, **kw: die() if str(b).endswith("meta.json") else replace(a, b, **kw)
    else:  # after-commit: meta.json switched, the old generation not yet removed; mid-cleanup: half removed
        def unlink_then_die(path, **kw):
            if "idx" in str(path) and not str(path).endswith(".tmp"):
                removed.append(path)
                if point == "after-commit" or len(removed) == 2:
                    die()
            return unlink(path, **kw)
        os.unlink = unlink_then_die
    sys.exit(main(sys.argv[2:]))
""")


def test_index_add_killed_at_any_step_leaves_the_old_or_the_new_index(model, tmp_path):
    pytest.importorskip("faiss")
    from bertforge.embedding.index import VectorIndex

    first, more = tmp_path / "first.txt", tmp_path / "more.txt"
    first.write_text("".join(f"the cat sat on the mat {i}\n" for i in range(8)))
    more.write_text("".join(f"the dog ran to the tree {i}\n" for i in range(5)))
    idx = tmp_path / "idx"
    ok(cli("index", "build", "--model", model, "--corpus", first, "--out", idx, "--no-progress"))
    clean = tmp_path / "clean"
    shutil.copytree(idx, clean)
    for point, expected in (("before-commit", 8), ("after-commit", 13), ("mid-cleanup", 13)):
        shutil.rmtree(idx)
        shutil.copytree(clean, idx)
        proc = subprocess.run([sys.executable, "-c", KILLED_ADD, point, "index", "add", "--index", str(idx),
                               "--corpus", str(more), "--no-progress"], capture_output=True, text=True, env=ENV,
                              timeout=180)
        assert proc.returncode == -signal.SIGKILL, (point, proc.stderr[-2000:])
        loaded = VectorIndex.load(idx)  # the old index or the new one, never "damaged"
        assert len(loaded) == expected and loaded.index.ntotal == expected, point
        assert loaded.texts[-1] == ("the cat sat on the mat 7" if expected == 8 else "the dog ran to the tree 4")
        hits = finish(start("index", "query", "--index", idx, "the dog ran", "--json", "-k", "1"))
        assert hits.returncode == 0, (point, hits.stderr)
        proc = cli("index", "add", "--index", idx, "--corpus", more, "--no-progress")
        if expected == 8:  # the killed add never happened: it can simply be run again
            ok(proc)
            assert len(VectorIndex.load(idx)) == 13
            # the killed add's files and temporaries are gone: one generation is left
            assert sorted(p.name for p in idx.iterdir()) == [MANIFEST_FILE, "docs.2.jsonl", "index.2.faiss",
                                                             "meta.json"]
            assert sorted(json.loads((idx / MANIFEST_FILE).read_text())["files"]) == [  # the manifest follows
                "docs.2.jsonl", "index.2.faiss", "meta.json"]
        else:  # it happened: the same documents again are refused by their ids, the index stays as it is
            assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
            assert len(VectorIndex.load(idx)) == 13


# ---- 5. resume: no line twice, damaged checkpoints, a latest pointer outside the run ------------------------------
PT = ["--size", "bert-tiny", "--vocab-size", "200", "--seq-len", "32", "--batch-size", "8", "--save-every", "10",
      "--log-every", "5", "--no-progress", "--heldout-fraction", "0.1", "--eval-batches", "2", "--threads", "1"]


def pretrain_until(corpus: Path, out: Path, needle: str, *args: str) -> None:
    """Start PT and SIGKILL it as soon as `needle` is printed."""
    proc = subprocess.Popen([BERTFORGE, "pretrain", "--corpus", str(corpus), "--out", str(out), *PT, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    for line in proc.stdout:
        if needle in line:
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL, "the run ended before it printed " + needle


def test_resume_after_a_kill_past_the_last_checkpoint_logs_no_line_twice(corpus, tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    ok(cli("pretrain", "--corpus", corpus, "--out", whole, *PT, "--max-steps", "20"))
    # step 20 is checkpointed, then the final eval is logged and printed: killed before the model is written
    pretrain_until(corpus, killed, "eval step 20", "--max-steps", "20")
    ok(cli("pretrain", "--corpus", corpus, "--out", killed, *PT, "--max-steps", "20", "--resume"))
    lines = (killed / "metrics.jsonl").read_text().splitlines()
    keys = [(json.loads(x)["step"], json.loads(x)["split"]) for x in lines]
    assert len(keys) == len(set(keys)) and (20, "eval") in keys
    assert (killed / "metrics.jsonl").read_bytes() == (whole / "metrics.jsonl").read_bytes()


def test_a_damaged_checkpoint_falls_back_and_latest_is_never_followed_outside(corpus, tmp_path):
    out = tmp_path / "run"
    ok(cli("pretrain", "--corpus", corpus, "--out", out, *PT, "--max-steps", "20"))
    ckpts = out / "checkpoints"
    outside = tmp_path / "outside" / "step-99"
    shutil.copytree(ckpts / "step-20", outside)
    before_outside = snapshot(outside.parent)
    corpus_before = corpus.read_bytes()

    os.truncate(ckpts / "step-20" / "trainer_state.pt", 1000)
    proc = ok(cli("pretrain", "--corpus", corpus, "--out", out, *PT, "--max-steps", "30", "--resume"))
    warnings = [x for x in proc.stderr.splitlines() if ": warning: " in x]
    assert len(warnings) == 1 and "step-20/trainer_state.pt: unreadable" in warnings[0] \
        and f"resuming from {ckpts / 'step-10'} instead" in warnings[0], proc.stderr
    assert "Traceback" not in proc.stderr
    keys = [(json.loads(x)["step"], json.loads(x)["split"]) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(keys) == len(set(keys)) and keys[-1] == (30, "eval")

    (ckpts / "latest").write_text("../../../outside/step-99\n")  # relative to checkpoints/: tmp_path/outside
    torch.save({"step": 99, "f": os.system}, ckpts / "step-30" / "trainer_state.pt")  # a pickle torch refuses
    proc = ok(cli("pretrain", "--corpus", corpus, "--out", out, *PT, "--max-steps", "40", "--resume"))
    assert "checkpoints/latest names '../../../outside/step-99', not a checkpoint of this run" in proc.stderr
    assert "step-30/trainer_state.pt: unreadable (holds objects a checkpoint never holds" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert json.loads((out / "eval_results.json").read_text())["steps"] == 40
    assert snapshot(outside.parent) == before_outside  # never read as the run's, never written

    for state in ckpts.glob("step-*/trainer_state.pt"):
        os.truncate(state, 100)
    proc = cli("pretrain", "--corpus", corpus, "--out", out, *PT, "--max-steps", "50", "--resume")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    *warned, error = proc.stderr.strip().splitlines()  # one warning per older checkpoint tried, then one error
    assert len(warned) == len(list(ckpts.glob("step-*"))) - 1 and all(": warning: " in w for w in warned)
    assert error.startswith("bertforge pretrain: error: ") and "trainer_state.pt: unreadable" in error \
        and f"no readable checkpoint to resume from in {ckpts}" in error, error
    assert corpus.read_bytes() == corpus_before


# ---- 6. a failed run is not in the way; no partial files ------------------------------------------------------------
def test_a_failed_run_leaves_nothing_in_the_way_of_the_corrected_rerun(corpus, tmp_path):
    out = tmp_path / "run"
    proc = cli("pretrain", "--corpus", corpus, "--out", out, *PT, "--max-steps", "2", "--lr", "-1")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    ok(cli("pretrain", "--corpus", corpus, "--out", out, *PT, "--max-steps", "2"))  # no flag needed
    assert json.loads((out / "eval_results.json").read_text())["steps"] == 2


def test_export_leaves_no_partial_file_and_stale_temporaries_are_swept(model, tmp_path):
    pytest.importorskip("onnxruntime")
    import resource

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    out = tmp_path / "onnx"

    def small_disk():  # room for the small files, not for the ONNX graph
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.RLIM_INFINITY))

    proc = cli("export", "--model", model, "--out", out, preexec_fn=small_disk)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr  # (the tracer's warning may precede)
    assert proc.stderr.strip().splitlines()[-1].endswith(f"{out / 'model.onnx'}: cannot write: File too large")
    assert not [p.name for p in tmp_path.rglob("*partial*")], list(tmp_path.rglob("*"))
    out.mkdir(exist_ok=True)
    (out / f".model.onnx.{dead}.partial.tmp").write_bytes(b"half a graph")  # a killed export's leftover
    ok(cli("export", "--model", model, "--out", out, "--overwrite"))
    assert (out / "model.onnx").is_file() and not list(out.glob("*partial*"))

    # a killed `embed` left its hidden temporary beside --out: the next embed of that file removes it
    texts = tmp_path / "in.txt"
    texts.write_text("the cat\nthe dog\n")
    stale = tmp_path / f".vec.npy.{dead}.a1b2c3d4.tmp"
    live = tmp_path / f".vec.npy.{os.getpid()}.e5f6g7h8.tmp"  # a running writer's: never touched
    stale.write_bytes(b"x")
    live.write_bytes(b"y")
    ok(cli("embed", "--model", model, "--input", texts, "--out", tmp_path / "vec.npy", "--no-progress"))
    assert not stale.exists() and live.read_bytes() == b"y" and (tmp_path / "vec.npy").is_file()
