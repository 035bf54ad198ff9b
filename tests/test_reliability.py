"""Reliability (issue #15): atomic writes through links and devices, one-line write errors, run-directory locks,
overwrite refusal, resume checks, stale temporaries, one-line warnings. Real processes where the issue asks."""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from bertforge.errors import BertforgeError
from bertforge.io.write import atomic_write, atomic_write_text, ensure_dir, prepare_output_file, remove_stale_temps
from bertforge.io.rundir import LOCK_FILE, OPTIONS_FILE, claim_output_dir, is_locked, lock_dir

BERTFORGE = shutil.which("bertforge", path=str(Path(sys.executable).parent)) or shutil.which("bertforge")


def cli(*args: str, **kw) -> subprocess.CompletedProcess:
    assert BERTFORGE, "the bertforge console script is not installed"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **kw.pop("env", {})}
    return subprocess.run([BERTFORGE, *args], capture_output=True, text=True, env=env, timeout=180, **kw)


def one_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """The command failed with exit 2 and exactly one line on stderr that holds every needle."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def full_device(directory: Path, name: str, device: str = "full") -> Path:
    """A character device that behaves like /dev/full (or /dev/null). A private node (mknod, as root) keeps the
    real device safe should a regression rename over it; otherwise a symlink to it."""
    path = directory / name
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, {"null": 3, "full": 7}[device]))
    except (PermissionError, AttributeError):
        path.symlink_to(f"/dev/{device}")
    return path


def temps(directory: Path) -> list[str]:
    return [p.name for p in directory.rglob("*.tmp")]


# ---- fileio ------------------------------------------------------------------------------------------------------
def test_new_files_respect_the_umask_and_existing_files_keep_their_mode(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_write_text(tmp_path / "a.txt", "one")
        assert stat.S_IMODE(os.stat(tmp_path / "a.txt").st_mode) == 0o640  # not mkstemp's 0600
        os.chmod(tmp_path / "a.txt", 0o604)
        atomic_write_text(tmp_path / "a.txt", "two")
        assert stat.S_IMODE(os.stat(tmp_path / "a.txt").st_mode) == 0o604
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").read_text() == "two" and temps(tmp_path) == []


def test_atomic_write_goes_through_a_symlink_and_keeps_it(tmp_path):
    (tmp_path / "data").mkdir()
    target = tmp_path / "data" / "real.jsonl"
    target.write_text("old\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(Path("data") / "real.jsonl")
    atomic_write_text(link, "new\n")
    assert link.is_symlink() and os.readlink(link) == str(Path("data") / "real.jsonl")
    assert target.read_text() == "new\n"
    dangling = tmp_path / "dangling.txt"
    dangling.symlink_to(tmp_path / "data" / "created.txt")
    atomic_write_text(dangling, "made\n")  # like `echo > link`: the target is created
    assert dangling.is_symlink() and (tmp_path / "data" / "created.txt").read_text() == "made\n"
    assert temps(tmp_path) == []


def test_device_full_gives_one_line_and_stays_a_device(tmp_path):
    dev = full_device(tmp_path, "full")
    writers = {
        "text": lambda tmp: Path(tmp).write_text("x" * 10_000),
        "torch": lambda tmp: torch.save({"w": torch.zeros(1000)}, tmp),
        # safetensors replaces the path it is given: it must never see the device itself
        "safetensors": lambda tmp: __import__("safetensors.torch").torch.save_file({"w": torch.zeros(10)}, tmp),
    }
    for name, write in writers.items():
        with pytest.raises(BertforgeError) as err:
            atomic_write(dev, write)
        assert str(err.value) == f"{dev}: cannot write: No space left on device", name
        assert stat.S_ISCHR(os.stat(dev).st_mode), name
    null = full_device(tmp_path, "null", "null")
    atomic_write_text(null, "discarded")
    assert stat.S_ISCHR(os.stat(null).st_mode) and temps(tmp_path) == []


def test_fifo_is_written_in_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    atomic_write_text(fifo, "through the pipe\n")
    assert reader.communicate(timeout=30)[0] == b"through the pipe\n"
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and temps(tmp_path) == []


def test_torch_writer_failure_becomes_one_line_and_leaves_no_temp(tmp_path):
    # A file-size limit makes every write past 4 KiB fail, as a full disk does: torch reports "unexpected pos".
    script = textwrap.dedent("""
        import resource, signal, sys, torch
        from bertforge.errors import BertforgeError
        from bertforge.io.write import atomic_write
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            atomic_write(sys.argv[1], lambda tmp: torch.save({"w": torch.zeros(100_000)}, tmp))
        except BertforgeError as err:
            print(err)
    """)
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "state.pt")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert line.startswith(f"{tmp_path / 'state.pt'}: cannot write: write failed (torch: unexpected pos"), line
    assert "\n" not in line and os.listdir(tmp_path) == []


def test_ensure_dir_one_line_errors(tmp_path):
    (tmp_path / "file").write_text("x")
    cases = {tmp_path / "file": "exists and is not a directory",
             tmp_path / "file" / "sub": f"{tmp_path / 'file'} is not a directory",
             Path("/proc/bertforge-test/run"): "does not allow new entries"}
    for path, why in cases.items():
        with pytest.raises(BertforgeError) as err:
            ensure_dir(path, what="--out")
        assert str(err.value).startswith(f"--out {path}: ") and why in str(err.value)
    with pytest.raises(BertforgeError, match="^--out /proc/v.npy: cannot write: the file system at /proc"):
        prepare_output_file("/proc/v.npy")
    assert ensure_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b" and (tmp_path / "a" / "b").is_dir()


def test_remove_stale_temps_only_touches_dead_writers(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / "checkpoints").mkdir()
    stale = tmp_path / "checkpoints" / f".latest.{dead.pid}.k2j4h5g6.tmp"
    live = tmp_path / f".model.safetensors.{os.getpid()}.abcdefgh.tmp"
    legacy_old = tmp_path / ".latest.abcd1234.tmp"
    legacy_new = tmp_path / ".latest.wxyz9876.tmp"
    user = tmp_path / "notes.tmp"
    for p in (stale, live, legacy_old, legacy_new, user):
        p.write_text("x")
    os.utime(legacy_old, (time.time() - 7200, time.time() - 7200))
    assert sorted(remove_stale_temps(tmp_path)) == sorted([stale, legacy_old])
    assert live.exists() and legacy_new.exists() and user.exists()


# ---- run directories ---------------------------------------------------------------------------------------------
HOLDER = textwrap.dedent("""
    import sys
    from bertforge.io.rundir import claim_output_dir
    run = claim_output_dir(sys.argv[1], resume=False, overwrite=False, options={"seq_len": 128}, what="--out")
    open(sys.argv[1] + "/model.safetensors", "wb").write(b"partial")
    print("ready", flush=True)
    sys.stdin.read()  # hold the directory until the test closes stdin or kills us
""")


def start_holder(directory: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_second_process_is_refused_while_the_first_holds_the_folder(tmp_path):
    out = tmp_path / "run"
    holder = start_holder(out)
    try:
        assert is_locked(out)
        (tmp_path / "m").mkdir()  # a model name is resolved (a folder, or a Hub id) before the verb claims --out
        proc = cli("embed-train", "--model", str(tmp_path / "m"), "--train", str(tmp_path / "t.tsv"), "--out", str(out))
        one_line(proc, f"{out} is in use by another bertforge run (pid {holder.pid})")
        with pytest.raises(BertforgeError, match=f"pid {holder.pid}"):
            claim_output_dir(out, resume=True, overwrite=False)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert not is_locked(out) and (out / "model.safetensors").read_bytes() == b"partial"


def test_a_killed_run_does_not_block_the_next_claim(tmp_path):
    out = tmp_path / "run"
    holder = start_holder(out)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    assert (out / LOCK_FILE).exists() and not is_locked(out)  # the file stays, the lock died with its process
    with pytest.raises(BertforgeError, match=r"already holds an earlier run \(model.safetensors\); pass --resume"):
        claim_output_dir(out, resume=False, overwrite=False, options={"seq_len": 128})
    with claim_output_dir(out, resume=True, overwrite=False, options={"seq_len": 128}) as run:
        assert (out / LOCK_FILE).read_text().strip() == str(os.getpid()) and run.path == out
    assert not (out / LOCK_FILE).exists()


def test_resume_refuses_a_changed_option_or_data_naming_it(tmp_path):
    out = tmp_path / "run"
    opts = {"seq_len": 128, "corpus": [str(tmp_path / "a.txt")], "max_steps": 100}
    fp = {"corpus": [["a.txt", 1000, 1.5]]}
    with claim_output_dir(out, resume=False, overwrite=False, options=opts, fingerprint=fp,
                          may_change=("max_steps",)):
        (out / "config.json").write_text("{}")
    with pytest.raises(BertforgeError) as err:
        claim_output_dir(out, resume=True, overwrite=False, options={**opts, "seq_len": 64}, fingerprint=fp,
                         may_change=("max_steps",))
    assert str(err.value) == ("--seq-len was 128 in the run being resumed, now 64; start a new --out or drop "
                              "--resume")
    with pytest.raises(BertforgeError, match=r"^--corpus: the data changed since the run being resumed"):
        claim_output_dir(out, resume=True, overwrite=False, options=opts, fingerprint={"corpus": [["a.txt", 999, 2]]},
                         may_change=("max_steps",))
    # allowed changes pass, and the record follows the latest invocation
    with claim_output_dir(out, resume=True, overwrite=False, options={**opts, "max_steps": 500}, fingerprint=fp,
                          may_change=("max_steps",)):
        pass
    assert json.loads((out / OPTIONS_FILE).read_text())["options"]["max_steps"] == 500
    with pytest.raises(BertforgeError, match="--max-steps was 500"):  # not in may_change this time
        claim_output_dir(out, resume=True, overwrite=False, options={**opts, "max_steps": 7})


def test_existing_run_is_refused_unless_overwrite_which_clears_only_bertforge_runs(tmp_path):
    out = tmp_path / "run"
    with claim_output_dir(out, resume=False, overwrite=False, options={"lr": 1e-4}):
        atomic_write(out / "best" / "model.safetensors", lambda tmp: Path(tmp).write_bytes(b"good model"))
    with pytest.raises(BertforgeError) as err:
        claim_output_dir(out, resume=False, overwrite=False, options={"lr": 1e-4})
    assert str(err.value) == (f"--out {out} already holds an earlier run (best/); pass --resume "
                              "to continue it or --overwrite to replace it, or choose another --out")
    assert (out / "best" / "model.safetensors").read_bytes() == b"good model"
    with pytest.raises(BertforgeError, match="give one of them"):
        claim_output_dir(out, resume=True, overwrite=True)
    with claim_output_dir(out, resume=False, overwrite=True, options={"lr": 2e-4}):
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE, OPTIONS_FILE]
    mine = tmp_path / "my-files"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    with pytest.raises(BertforgeError, match="holds files bertforge did not write"):
        claim_output_dir(mine, resume=False, overwrite=True)
    assert (mine / "thesis.tex").read_text() == "years of work" and not (mine / LOCK_FILE).exists()


def test_a_failed_run_leaves_no_empty_folder(tmp_path):
    out = tmp_path / "new" / "run"
    with pytest.raises(RuntimeError):
        with claim_output_dir(out, resume=False, overwrite=False, options={"a": 1}):
            raise RuntimeError("boom")
    assert not out.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    with pytest.raises(RuntimeError):
        with claim_output_dir(kept, resume=False, overwrite=False, options={"a": 1}):
            raise RuntimeError("boom")
    assert kept.is_dir() and list(kept.iterdir()) == []  # the user's folder stays, without our files
    with pytest.raises(RuntimeError):
        with claim_output_dir(out, resume=False, overwrite=False, options={"a": 1}):
            (out / "checkpoints").mkdir()
            raise RuntimeError("boom")
    assert (out / "checkpoints").is_dir()  # partial work is kept for --resume


def test_lock_dir_excludes_a_second_writer_in_another_process(tmp_path):
    lock = lock_dir(tmp_path)
    try:
        script = ("import sys; from bertforge.io.rundir import lock_dir; from bertforge.errors import BertforgeError\n"
                  "try: lock_dir(sys.argv[1], what='--index')\nexcept BertforgeError as e: print(e)")
        out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60)
        assert out.stdout.strip().startswith(f"{tmp_path} is in use by another bertforge run (pid {os.getpid()})")
    finally:
        lock.release()
    lock_dir(tmp_path).release()


# ---- the command line ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory) -> Path:
    from bertforge.model.checkpoint import save_pretrained
    from bertforge.config import ModelConfig
    from bertforge.model import Encoder
    from bertforge.tokenization import Tokenizer

    root = tmp_path_factory.mktemp("enc")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(f"the cat sat on the mat number {i} and the dog ran" for i in range(100)))
    tok = Tokenizer.train(corpus.read_text().splitlines(), kind="wordpiece", vocab_size=100, min_frequency=1)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)
    save_pretrained(Encoder(cfg), root / "model", cfg, tokenizer=tok)
    return root / "model"


def test_embed_out_problems_are_one_line_and_writes_go_through(tiny_encoder, tmp_path):
    texts = tmp_path / "in.txt"
    texts.write_text("the cat\nthe dog\n")
    base = ["embed", "--model", str(tiny_encoder), "--input", str(texts), "--no-progress", "--out"]
    (tmp_path / "file").write_text("x")
    one_line(cli(*base, "/proc/bertforge-test/v.npy"), "--out /proc/bertforge-test", "does not allow new entries")
    one_line(cli(*base, str(tmp_path / "file" / "v.npy")), f"{tmp_path / 'file'} is not a directory")
    dev = full_device(tmp_path, "full.npy")
    one_line(cli(*base, str(dev)), f"{dev}: cannot write: No space left on device")
    assert stat.S_ISCHR(os.stat(dev).st_mode)
    # through a symlink, under a umask: the target gets the rows, the link stays, the mode follows the umask
    (tmp_path / "real.jsonl").write_text("")
    os.chmod(tmp_path / "real.jsonl", 0o640)
    (tmp_path / "link.jsonl").symlink_to("real.jsonl")
    proc = cli(*base, str(tmp_path / "link.jsonl"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "link.jsonl").is_symlink() and len((tmp_path / "real.jsonl").read_text().splitlines()) == 2
    assert stat.S_IMODE(os.stat(tmp_path / "real.jsonl").st_mode) == 0o640
    proc = cli(*base, str(tmp_path / "v.npy"), preexec_fn=lambda: os.umask(0o027))
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(os.stat(tmp_path / "v.npy").st_mode) == 0o640 and temps(tmp_path) == []


def test_warnings_print_once_on_one_line(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"caf\xe9 latin one\n" + b"the cat sat on the mat\n" * 20)
    proc = cli("tokenizer", "train", "--corpus", str(bad), "--out", str(tmp_path / "tok"), "--vocab-size", "60")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "invalid UTF-8" in line]
    assert lines == [f"bertforge tokenizer: warning: {bad}:1: invalid UTF-8 (byte 0xe9) replaced with U+FFFD"]
    assert "UserWarning" not in proc.stderr and "corpus.py" not in proc.stderr


def test_cli_safety_net_for_os_errors(monkeypatch, capsys):
    import errno

    from bertforge import cli as cli_module

    def fail(exc):
        def build_parser():
            import argparse
            parser = argparse.ArgumentParser(prog="bertforge")
            sub = parser.add_subparsers(dest="command")

            def run(args):
                raise exc
            sub.add_parser("boom").set_defaults(func=run)
            return parser
        monkeypatch.setattr(cli_module, "build_parser", build_parser)
        return cli_module.main(["boom"])

    assert fail(OSError(errno.EIO, "Input/output error", "runs/x/model.safetensors")) == 2
    assert capsys.readouterr().err == "bertforge boom: error: runs/x/model.safetensors: Input/output error\n"
    assert fail(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")) == 2
    assert capsys.readouterr().err.startswith("bertforge boom: error: cannot write a file: write failed (torch: ")
    with pytest.raises(RuntimeError, match="a bug"):  # anything else is a bug and keeps its traceback
        fail(RuntimeError("a bug"))
