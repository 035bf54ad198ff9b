"""Issue #15 for `finetune` and `predict`, through the installed console script: --out problems are one line (exit
2), predictions are written through symlinks and devices and a full device is reported, a finished OUT is not
replaced without --overwrite, two jobs cannot share an OUT (and a killed one does not block its resume), a resume
that changes what the checkpoints depend on is refused naming the option, a failed job leaves no empty folder."""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bertforge.model.checkpoint import save_pretrained
from bertforge.config import preset
from bertforge.model import Encoder
from bertforge.io.rundir import LOCK_FILE, OPTIONS_FILE, is_locked
from bertforge.tasks.models import init_from_pretrained, save_task_model
from bertforge.tokenization import Tokenizer

BERTFORGE = shutil.which("bertforge", path=str(Path(sys.executable).parent)) or shutil.which("bertforge")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
POS, NEG = ["good", "great", "fine", "superb"], ["bad", "awful", "terrible", "dull"]
FILLER = "the movie film plot actor was is very a and of in".split()


def cli(*args: object, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    assert BERTFORGE, "the bertforge console script is not installed"
    return subprocess.run([BERTFORGE, *map(str, args)], stdout=stdout, stderr=subprocess.PIPE, text=True, env=ENV,
                          timeout=300)


def one_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """The command failed with exit 2 and exactly one line on stderr that holds every needle."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def write_sst(folder: Path, n_train: int = 64, n_dev: int = 16, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, n, s in (("train", n_train, seed), ("dev", n_dev, seed + 1)):
        rng, lines = random.Random(s), ["sentence\tlabel"]
        for _ in range(n):
            y = rng.randint(0, 1)
            lines.append(" ".join(rng.choices(FILLER, k=4) + [rng.choice(POS if y else NEG)]) + f"\t{y}")
        (folder / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def private_device(directory: Path, name: str) -> Path:
    """A character device that behaves like /dev/full, made here: a regression that renames over it must not hit
    the machine's real /dev/full."""
    path = directory / name
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    except PermissionError:
        pytest.skip("creating a device node needs root")
    return path


def leftovers(directory: Path) -> list[str]:
    """Temporary files and directories a writer left behind."""
    return sorted(p.name for p in directory.rglob("*") if p.name.endswith(".tmp") or p.name.startswith((".tmp-",
                                                                                                         ".old-")))


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A tiny random BERT whose WordPiece vocabulary holds every test word whole."""
    d = tmp_path_factory.mktemp("base")
    rng = random.Random(0)
    vocab = POS + NEG + FILLER
    (d / "corpus.txt").write_text("\n".join(" ".join(rng.choices(vocab, k=10)) for _ in range(300)), encoding="utf-8")
    tok = Tokenizer.train((d / "corpus.txt").read_text().splitlines(), vocab_size=100, min_frequency=1)
    cfg = preset("bert-tiny", vocab_size=tok.vocab_size, num_hidden_layers=1)
    torch.manual_seed(0)
    save_pretrained(Encoder(cfg), d / "model", cfg, tokenizer=tok)
    return d / "model"


@pytest.fixture(scope="module")
def sst_model(base, tmp_path_factory) -> Path:
    """An SST-2 classifier saved as `finetune` saves one (untrained head: predictions only need to exist)."""
    d = tmp_path_factory.mktemp("sst2") / "model"
    torch.manual_seed(1)
    model, _ = init_from_pretrained(base, "classify", 2)
    save_task_model(model, d, ["0", "1"], {"name": "sst2", "max_seq_len": 32},
                    tokenizer=Tokenizer.from_pretrained(base))
    return d


def finetune_args(base: Path, data: Path, out: Path, *extra: object) -> list[object]:
    return ["finetune", "--task", "sst2", "--data", data, "--model", base, "--out", out, "--batch-size", "16",
            "--max-seq-len", "16", "--lr", "1e-3", "--no-progress", *extra]


# ---- --out that cannot be made -------------------------------------------------------------------------------------
def test_out_that_cannot_be_created_is_one_line(base, sst_model, tmp_path):
    data = write_sst(tmp_path / "sst", 8, 4)
    (tmp_path / "file").write_text("x")
    one_line(cli(*finetune_args(base, data, "/proc/bertforge-test/run")),
             "--out /proc/bertforge-test/run", "does not allow new entries")
    one_line(cli(*finetune_args(base, data, tmp_path / "file" / "run")), f"{tmp_path / 'file'} is not a directory")
    one_line(cli(*finetune_args(base, data, tmp_path / "file")), f"--out {tmp_path / 'file'}: exists and is not a "
                                                                 "directory")
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('{"text": "a good film"}\n')
    predict = ["predict", "--model", sst_model, "--input", inputs, "--no-progress", "--out"]
    one_line(cli(*predict, "/proc/bertforge-test/p.jsonl"), "--out /proc/bertforge-test", "does not allow new entries")
    one_line(cli(*predict, tmp_path / "file" / "p.jsonl"), f"{tmp_path / 'file'} is not a directory")
    one_line(cli(*predict, tmp_path / "sst"), f"--out {tmp_path / 'sst'}: is a directory")
    assert (tmp_path / "file").read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == [
        "file", "in.jsonl", "sst"]


# ---- predict writes through links and devices ----------------------------------------------------------------------
def test_predict_writes_through_symlinks_and_reports_a_full_device(sst_model, tmp_path):
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('{"text": "a good film"}\n{"text": "the plot was awful"}\n')
    predict = ["predict", "--model", sst_model, "--input", inputs, "--no-progress"]
    full = private_device(tmp_path, "full.jsonl")
    one_line(cli(*predict, "--out", full), f"{full}: cannot write: No space left on device")
    assert stat.S_ISCHR(os.stat(full).st_mode)  # still the device, not a regular file renamed over it
    with open(full, "w") as stdout:  # the same for stdout: reported now, not lost when Python exits
        one_line(cli(*predict, stdout=stdout), "<stdout>: cannot write: No space left")
    # a symlink is followed: the target gets the predictions, the link stays a link
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "real.jsonl").write_text("old\n")
    os.chmod(tmp_path / "data" / "real.jsonl", 0o640)
    (tmp_path / "link.jsonl").symlink_to(Path("data") / "real.jsonl")
    proc = cli(*predict, "--out", tmp_path / "link.jsonl")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "link.jsonl").is_symlink() and os.readlink(tmp_path / "link.jsonl") == "data/real.jsonl"
    records = [json.loads(x) for x in (tmp_path / "data" / "real.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["1", "2"] and all(r["label"] in ("0", "1") for r in records)
    assert stat.S_IMODE(os.stat(tmp_path / "data" / "real.jsonl").st_mode) == 0o640  # the target keeps its mode
    assert leftovers(tmp_path) == []


# ---- the output folder: no silent overwrite, resume checks ---------------------------------------------------------
def evals(out: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
            if r["split"] == "eval"]


def test_finished_out_is_refused_unless_resume_or_overwrite_and_resume_checks_options(base, tmp_path):
    data, out = write_sst(tmp_path / "sst"), tmp_path / "out"
    proc = cli(*finetune_args(base, data, out, "--max-steps", "2"))
    assert proc.returncode == 0, proc.stderr
    model = (out / "model.safetensors").read_bytes()
    recorded = json.loads((out / OPTIONS_FILE).read_text())
    assert recorded["options"]["lr"] == 1e-3 and recorded["options"]["train"] == str(data / "train.tsv")
    assert recorded["fingerprint"]["train"][1] == (data / "train.tsv").stat().st_size

    one_line(cli(*finetune_args(base, data, out, "--max-steps", "2")),
             f"--out {out} already holds an earlier run", "--resume", "--overwrite")
    one_line(cli(*finetune_args(base, data, out, "--max-steps", "2", "--resume", "--overwrite")), "give one of them")
    lr = one_line(cli(*finetune_args(base, data, out, "--max-steps", "2", "--resume", "--lr", "5e-4")))
    assert lr.endswith("error: --lr was 0.001 in the run being resumed, now 0.0005; start a new --out or drop "
                       "--resume")
    one_line(cli(*finetune_args(base, data, out, "--max-steps", "2", "--resume", "--max-seq-len", "32")),
             "--max-seq-len was 16")
    assert (out / "model.safetensors").read_bytes() == model and evals(out) == [2]  # nothing was touched

    # a killed writer's temporaries are swept when the folder is claimed again
    dead = subprocess.Popen(["true"])
    dead.wait()
    (out / "checkpoints" / f".latest.{dead.pid}.k2j4h5g6.tmp").write_text("step-")
    (out / f".tmp-best-{dead.pid}").mkdir()
    # a longer budget may change: the run continues from its checkpoint at step 2
    proc = cli(*finetune_args(base, data, out, "--max-steps", "4", "--resume"))
    assert proc.returncode == 0, proc.stderr
    assert evals(out) == [2, 4] and leftovers(out) == []
    assert json.loads((out / OPTIONS_FILE).read_text())["options"]["max_steps"] == 4

    # the training data changed: a resume would mix two data sets
    with open(data / "train.tsv", "a", encoding="utf-8") as fh:
        fh.write("a superb film\t1\n")
    one_line(cli(*finetune_args(base, data, out, "--max-steps", "4", "--resume")),
             "--train: the data changed since the run being resumed started")

    proc = cli(*finetune_args(base, data, out, "--max-steps", "2", "--overwrite"))
    assert proc.returncode == 0, proc.stderr
    assert evals(out) == [2] and sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step-2"]
    assert not (out / LOCK_FILE).exists()


def test_runs_claim_the_folder_once(base, tmp_path):
    data, out = write_sst(tmp_path / "sst", 32, 8), tmp_path / "out"
    proc = cli(*finetune_args(base, data, out, "--max-steps", "2", "--runs", "2"))
    assert proc.returncode == 0, proc.stderr
    assert (out / OPTIONS_FILE).is_file() and not (out / LOCK_FILE).exists()
    for run in ("run-0", "run-1"):
        assert (out / run / "config.json").is_file() and not (out / run / OPTIONS_FILE).exists()
    one_line(cli(*finetune_args(base, data, out, "--max-steps", "2", "--runs", "3", "--resume")),
             "--runs was 2 in the run being resumed, now 3")


# ---- one job per folder; a killed job does not block its resume ---------------------------------------------------
def test_second_finetune_is_refused_while_the_first_runs_and_a_killed_one_resumes(base, tmp_path):
    data, out = write_sst(tmp_path / "sst"), tmp_path / "out"
    first = subprocess.Popen([BERTFORGE, *map(str, finetune_args(base, data, out, "--max-steps", "100000"))],
                             env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not is_locked(out):
            assert first.poll() is None, first.stderr.read()
            assert time.monotonic() < deadline, "the first finetune never claimed its --out"
            time.sleep(0.1)
        one_line(cli(*finetune_args(base, data, out, "--max-steps", "2")),
                 f"{out} is in use by another bertforge run (pid {first.pid})")
        one_line(cli(*finetune_args(base, data, out, "--max-steps", "2", "--resume")), "is in use")
        deadline = time.monotonic() + 120
        while not (out / "checkpoints" / "latest").is_file():  # let it write something worth resuming
            assert first.poll() is None, first.stderr.read()
            assert time.monotonic() < deadline, "the first finetune wrote no checkpoint"
            time.sleep(0.1)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    assert (out / LOCK_FILE).exists() and not is_locked(out)  # the lock died with its process
    proc = cli(*finetune_args(base, data, out, "--max-steps", "2", "--resume"))
    assert proc.returncode == 0, proc.stderr
    assert (out / "config.json").is_file() and leftovers(out) == [] and not (out / LOCK_FILE).exists()


# ---- failures leave no empty folder --------------------------------------------------------------------------------
def test_a_failed_finetune_leaves_no_empty_folder(base, tmp_path):
    data = write_sst(tmp_path / "sst", 8, 4)
    (data / "train.tsv").write_text("sentence\ngood film\n")  # found only when the data is read, after the claim
    one_line(cli(*finetune_args(base, data, tmp_path / "out")), "no 'label' column")
    assert not (tmp_path / "out").exists()
    # the data is fine, the model's weights are not: fails after the data was read and the tokenizer loaded
    write_sst(data, 8, 4)
    broken = tmp_path / "broken"
    shutil.copytree(base, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    one_line(cli(*finetune_args(base.parent / "nowhere", data, tmp_path / "out")), "model directory not found")
    one_line(cli(*finetune_args(broken, data, tmp_path / "out")), "model.safetensors")
    assert not (tmp_path / "out").exists()
    (tmp_path / "mine").mkdir()  # a folder the user made is theirs: emptied of our files, kept
    one_line(cli(*finetune_args(broken, data, tmp_path / "mine")), "model.safetensors")
    assert (tmp_path / "mine").is_dir() and list((tmp_path / "mine").iterdir()) == []
