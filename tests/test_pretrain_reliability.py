"""Pretraining runs that never mix, resume only what they can, fail in one line and repeat themselves (issue #15).

Every test runs the installed console script on tiny corpora made here (bert-tiny, a few steps); where the issue
speaks of two runs or a killed run, those are real processes.
"""
from __future__ import annotations

import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertforge.training import load_trainer_state

BERTFORGE = shutil.which("bertforge", path=str(Path(sys.executable).parent)) or shutil.which("bertforge")
TINY = ["--size", "bert-tiny", "--seq-len", "32", "--batch-size", "8", "--vocab-size", "200", "--no-progress",
        "--heldout-fraction", "0.1", "--eval-batches", "2", "--threads", "1"]
WORDS = ("the cat dog bird fish sat ran flew swam on under near over a mat tree river house garden quickly slowly "
         "red green blue small big old young happy sad and but then because").split()


def write_corpus(path: Path, seed: int = 0, extra: tuple[str, ...] = ()) -> Path:
    """~150 documents of 4-7 short sentences from a small grammar (deterministic for a seed)."""
    rng = random.Random(seed)
    words = WORDS + list(extra)
    docs = []
    for _ in range(150):
        sents = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 10))).capitalize() + "."
                 for _ in range(rng.randint(4, 7))]
        docs.append(" ".join(sents))
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "tiny.txt")


def start(*args: str, **kw) -> subprocess.Popen:
    assert BERTFORGE, "the bertforge console script is not installed"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([BERTFORGE, *args], stdout=kw.pop("stdout", subprocess.PIPE),
                            stderr=subprocess.PIPE, text=True, env=env, **kw)


def cli(*args: str, **kw) -> subprocess.CompletedProcess:
    proc = start(*args, **kw)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def one_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2 and exactly one line on stderr, holding every needle."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def pretrain(corpus: Path, out: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return cli("pretrain", "--corpus", str(corpus), "--out", str(out), *TINY, *args, **kw)


def steps_logged(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
            if json.loads(line)["split"] == "train"]


# ---- --out problems and failed runs -------------------------------------------------------------------------------
def test_an_out_that_cannot_be_made_is_one_line_naming_it(corpus, tmp_path):
    (tmp_path / "tok").mkdir()
    afile = tmp_path / "afile"
    afile.write_text("x")
    cases = {"/proc/bertforge-run": "the file system at /proc does not allow new entries",
             str(afile): "exists and is not a directory",
             str(afile / "run"): f"{afile} is not a directory"}
    procs = []
    for out, reason in cases.items():  # all at once: each fails before any work, the wait is the start-up
        procs.append((start("pretrain", "--corpus", str(corpus), "--out", out, "--max-steps", "1", *TINY),
                      out, reason))
        procs.append((start("prepare", "--corpus", str(corpus), "--tokenizer", str(tmp_path / "tok"), "--out", out),
                      out, reason))
    for proc, out, reason in procs:
        _, err = proc.communicate(timeout=120)
        one_line(subprocess.CompletedProcess(proc.args, proc.returncode, "", err), f"--out {out}", reason)
    assert afile.read_text() == "x"


def test_a_run_that_fails_leaves_no_empty_folder(corpus, tmp_path):
    (tmp_path / "not-a-tokenizer").mkdir()  # fails after --out is claimed, before anything is written there
    runs = [start("pretrain", "--corpus", str(corpus), "--tokenizer", str(tmp_path / "not-a-tokenizer"),
                  "--out", str(tmp_path / "run"), "--max-steps", "1", *TINY),
            start("prepare", "--corpus", str(corpus), "--tokenizer", str(tmp_path / "not-a-tokenizer"),
                  "--out", str(tmp_path / "shards"))]
    for proc in runs:
        _, err = proc.communicate(timeout=120)
        one_line(subprocess.CompletedProcess(proc.args, proc.returncode, "", err), "not-a-tokenizer")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-tokenizer"]


# ---- an earlier run is neither replaced nor mixed -----------------------------------------------------------------
def test_a_finished_run_is_refused_unless_overwrite(corpus, tmp_path):
    out = tmp_path / "run"
    ok(pretrain(corpus, out, "--max-steps", "2"))
    before = {name: (out / name).read_bytes() for name in ("model.safetensors", "vocab.txt", "metrics.jsonl")}
    other = write_corpus(tmp_path / "other.txt", seed=1, extra=("zebra", "okapi", "quagga"))
    one_line(pretrain(other, out, "--max-steps", "2"), f"--out {out} already holds an earlier run", "--resume",
             "--overwrite")
    assert before == {name: (out / name).read_bytes() for name in before}  # untouched, not "replaced with a note"
    ok(pretrain(other, out, "--max-steps", "3", "--overwrite"))
    assert "zebra" in (out / "vocab.txt").read_text().split()  # the new corpus's tokenizer, model and checkpoints
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step-3"]
    assert steps_logged(out) == [3]
    assert json.loads((out / "run_options.json").read_text())["options"]["corpus"] == [str(other)]


def test_resume_refuses_a_changed_option_or_corpus_naming_it(corpus, tmp_path):
    text = tmp_path / "text.txt"
    shutil.copy(corpus, text)
    out = tmp_path / "run"
    ok(pretrain(text, out, "--max-steps", "2", "--save-every", "2"))
    manifest = (out / "data" / "manifest.json").stat().st_mtime_ns
    one_line(pretrain(text, out, "--max-steps", "4", "--resume", "--seq-len", "16"),
             "--seq-len was 32 in the run being resumed, now 16")
    one_line(pretrain(corpus, out, "--max-steps", "4", "--resume"),
             "--corpus was ", "text.txt", "in the run being resumed, now", "tiny.txt",
             "start a new --out or drop --resume")  # long values: shown around where they differ
    # how long, and how it is watched, may change
    ok(pretrain(text, out, "--max-steps", "4", "--resume", "--log-every", "1", "--threads", "2"))
    # the first run's last record (step 2, logged after its checkpoint) is not kept: the resumed run's logging
    # window continues from the checkpoint, so its step-3 record covers steps 1-3 again
    assert steps_logged(out) == [3, 4]
    write_corpus(text, seed=2)  # same path, new contents
    one_line(pretrain(text, out, "--max-steps", "6", "--resume"), "--corpus: the data changed")
    assert (out / "data" / "manifest.json").stat().st_mtime_ns == manifest  # data/ was not rebuilt
    assert steps_logged(out) == [3, 4]


def test_a_second_run_is_refused_while_the_first_holds_out_and_a_killed_run_resumes(corpus, tmp_path):
    out = tmp_path / "run"
    first = start("pretrain", "--corpus", str(corpus), "--out", str(out), "--max-steps", "100000", "--save-every",
                  "3", "--log-every", "1", *TINY, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not (out / "checkpoints" / "latest").is_file():
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read() if first.poll() else ""
            time.sleep(0.2)
        # the second run (same command; or a resume) must not write into the first one's folder
        one_line(pretrain(corpus, out, "--max-steps", "5"), f"{out} is in use by another bertforge run "
                                                           f"(pid {first.pid})")
        one_line(pretrain(corpus, out, "--max-steps", "5", "--resume"), f"(pid {first.pid})")
        assert first.poll() is None
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    stray = out / "checkpoints" / f".latest.{first.pid}.k1ll3d00.tmp"  # what a kill inside atomic_write leaves
    stray.write_text("step-")
    latest = int((out / "checkpoints" / "latest").read_text().strip().removeprefix("step-"))
    # the dead run's lock does not block the resume
    ok(pretrain(corpus, out, "--max-steps", str(latest + 2), "--resume", "--log-every", "1"))
    assert not stray.exists()
    result = json.loads((out / "eval_results.json").read_text())
    assert result["steps"] == latest + 2 and result["segments"] == 2
    assert steps_logged(out) == list(range(1, latest + 3))  # lines the killed run logged past its checkpoint: gone
    # every segment's tokens: at most the padded size of every batch, and most of it
    assert 0.5 * (latest + 2) * 8 * 32 < result["tokens_seen"] <= (latest + 2) * 8 * 32


def test_a_full_disk_while_checkpointing_is_one_line_and_keeps_the_previous_checkpoint(corpus, tmp_path):
    out = tmp_path / "run"
    ok(pretrain(corpus, out, "--max-steps", "4", "--save-every", "4"))
    step4 = out / "checkpoints" / "step-4"
    weights, state = (step4 / "model.safetensors").stat().st_size, (step4 / "trainer_state.pt").stat().st_size
    assert weights < state

    def small_disk():  # a file may grow to between the two sizes: the weights fit, the optimizer state does not
        resource.setrlimit(resource.RLIMIT_FSIZE, ((weights + state) // 2, resource.RLIM_INFINITY))

    one_line(pretrain(corpus, out, "--max-steps", "8", "--save-every", "4", "--resume", preexec_fn=small_disk),
             f"{out}/checkpoints/step-8: cannot write: write failed (torch: unexpected pos")
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step-4"]  # no half checkpoint
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-4"
    assert load_trainer_state(step4)["step"] == 4
    ok(pretrain(corpus, out, "--max-steps", "8", "--save-every", "4", "--resume"))
    assert json.loads((out / "eval_results.json").read_text())["steps"] == 8


# ---- the same command, the same numbers ---------------------------------------------------------------------------
@pytest.mark.parametrize("tokenizer", ["given", "trained"])
def test_two_fresh_identical_runs_write_identical_metrics_and_weights(tmp_path, tokenizer):
    # made-up words the 200-piece vocabulary cannot hold whole: the corpus is tokenised into word pieces too
    text = write_corpus(tmp_path / "text.txt", extra=("zorbulate", "quixotrin", "plimber", "vastrodome"))
    args = ["pretrain", "--corpus", str(text), "--max-steps", "30", "--log-every", "5", "--eval-batches", "2",
            *TINY]
    if tokenizer == "given":
        from bertforge.data.corpus import iter_texts
        from bertforge.tokenization import Tokenizer
        Tokenizer.train(iter_texts(text), kind="wordpiece", vocab_size=200).save_pretrained(tmp_path / "tok")
        args += ["--tokenizer", str(tmp_path / "tok")]
    runs = [start(*args, "--out", str(tmp_path / name), stdout=subprocess.DEVNULL) for name in ("a", "b")]
    for proc in runs:
        assert proc.wait(timeout=300) == 0, proc.stderr.read()[-3000:]
    a, b = tmp_path / "a", tmp_path / "b"
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    assert (a / "metrics.jsonl").read_bytes() == (b / "metrics.jsonl").read_bytes()
    assert len(steps_logged(a)) == 6
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    # the timing is kept, for the same steps, where it cannot spoil the comparison
    speed = [json.loads(line) for line in (a / "speed.jsonl").read_text().splitlines()]
    assert [s["step"] for s in speed] == steps_logged(a) and all(s["tokens_per_s"] > 0 for s in speed)


# ---- the command line ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [["ablate", "--list"], ["--help"]])
def test_a_reader_that_stops_early_ends_the_command_quietly(args):
    proc = start(*args)
    proc.stdout.close()  # `bertforge ... | head`: the reader is gone before the command writes
    err = proc.stderr.read()
    proc.wait(timeout=60)
    assert "Traceback" not in err and "Broken pipe" not in err and "BrokenPipeError" not in err, err
    assert proc.returncode in (0, 128 + signal.SIGPIPE)
