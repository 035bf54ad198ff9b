"""Output directories of runs: one writer at a time, no silent overwrite, no resume of a changed run.

    with claim_output_dir(args.out, resume=args.resume, overwrite=args.overwrite,
                          options={"seq_len": 128, "corpus": [...]}, fingerprint={"corpus": corpus_fp},
                          may_change=("max_steps", "time_budget", "threads")) as run:
        ...  # write into run.path

What a claim guarantees (docs/reliability.md lists the test for each):
  - the directory exists (or one line says why it cannot be made);
  - an exclusive lock (flock on D/.lock) is held until release() or the process ends; a second claimant gets
    "D is in use by another bertforge run (pid N)"; a SIGKILLed holder's lock vanishes with it (no stale locks);
  - a directory that already holds files is refused unless resume or overwrite; overwrite first deletes what is
    there, but only in a directory that bertforge recognisably wrote (never a folder of the user's own files);
  - `options` and `fingerprint` are recorded in D/run_options.json; a resume that changes one of them (other than
    the names in `may_change`) is refused, naming the option;
  - if the block fails, a directory the claim created is removed again when nothing but the claim's own files
    is in it (no empty output folders after a failed run).
One process per run claims the directory (rank 0 of a distributed job); flock locks are per open file.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io.write import atomic_write_text, ensure_dir, new_file_mode, remove_stale_temps, write_errors

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
OPTIONS_FILE = "run_options.json"
_CLAIM_FILES = {LOCK_FILE, OPTIONS_FILE}
# Names bertforge writes at the top of an output directory; one of them marks a folder `overwrite` may clear.
RUN_MARKERS = {OPTIONS_FILE, "config.json", "model.safetensors", "checkpoints", "best", "metrics.jsonl",
               "eval_results.json", "results.json", "tokenizer.json", "modules.json", "meta.json", "index.faiss",
               "manifest.json", "trainer_state.pt"}


class DirLock:
    """An exclusive, non-blocking flock on DIR/.lock, released by release() or by the process ending."""

    def __init__(self, directory: Path, fd: int):
        self.directory, self.fd = directory, fd

    @classmethod
    def acquire(cls, directory: str | Path, what: str = "--out") -> "DirLock":
        directory = Path(directory)
        path = directory / LOCK_FILE
        for _attempt in range(5):
            with write_errors(path, "cannot create the lock file"):
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, new_file_mode())
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
                os.close(fd)
                who = "this process" if pid == str(os.getpid()) else f"pid {pid}"
                raise BertforgeError(f"{directory} is in use by another bertforge run ({who}); wait for it to "
                                     f"finish or choose another {what}") from None
            except OSError as err:  # e.g. ENOLCK on a file system without flock: go on, unprotected
                log.warning("%s: cannot lock (%s); nothing stops two runs writing it at once", path, err.strerror)
                return cls(directory, fd)
            try:  # a holder releasing just now deletes the file: our lock must be on the file that is there
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
                return cls(directory, fd)
            os.close(fd)
        raise BertforgeError(f"{directory}: cannot lock (the lock file keeps changing)")

    def release(self, remove: bool = True) -> None:
        """Unlock; by default also delete the lock file (safe: a new claimant checks it locked the current one)."""
        if self.fd < 0:
            return
        if remove:
            try:
                if os.stat(self.directory / LOCK_FILE).st_ino == os.fstat(self.fd).st_ino:
                    os.unlink(self.directory / LOCK_FILE)
            except FileNotFoundError:
                pass
        os.close(self.fd)
        self.fd = -1


def lock_dir(path: str | Path, what: str = "--out") -> DirLock:
    """Lock an existing directory for writing (e.g. `index add`); one line if another run holds it."""
    return DirLock.acquire(Path(path), what)


def is_locked(path: str | Path) -> bool:
    """Whether a run holds `path` right now (a probe: takes nothing, creates nothing)."""
    try:
        fd = os.open(Path(path) / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


class RunDir:
    """A claimed output directory; use as a context manager or call release() (failed=True after an error)."""

    def __init__(self, path: Path, lock: DirLock, created: bool):
        self.path, self.lock, self.created = path, lock, created

    def release(self, failed: bool = False) -> None:
        if self.lock.fd < 0:
            return
        leftovers = _entries(self.path) if failed and self.path.is_dir() else None
        if leftovers is not None and not leftovers:  # the failed run wrote nothing: undo the claim
            (self.path / OPTIONS_FILE).unlink(missing_ok=True)
        self.lock.release()
        if leftovers is not None and not leftovers and self.created:
            try:
                self.path.rmdir()
            except OSError:  # something appeared meanwhile: keep it
                pass

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.release(failed=exc_type is not None)


def claim_output_dir(path: str | Path, *, resume: bool, overwrite: bool, options: dict[str, Any] | None = None,
                     fingerprint: dict[str, Any] | None = None, may_change: Iterable[str] = (),
                     what: str = "--out", resume_flag: str | None = "--resume",
                     overwrite_flag: str | None = "--overwrite") -> RunDir:
    """Create, lock and check a run's output directory (see the module docstring).

    options: what the run depends on, by option name ("seq_len" is reported as --seq-len); JSON-able values.
    fingerprint: data identities by option name (e.g. {"corpus": [[file, size, mtime], ...]}).
    may_change: option names a resume may change (max_steps, time_budget, threads, log/eval intervals, ...).
    resume_flag / overwrite_flag: the verb's flags, named in refusals (None: the verb has no such flag).
    """
    if resume and overwrite:
        raise BertforgeError(f"{resume_flag} continues the run in {path} and {overwrite_flag} replaces it: "
                             "give one of them")
    path = Path(path)
    created = not path.exists()
    ensure_dir(path, what)
    try:
        lock = DirLock.acquire(path, what)
    except BaseException:
        if created:
            _remove_if_empty(path)
        raise
    run = RunDir(path, lock, created)
    try:
        remove_stale_temps(path)  # we hold the lock: any writer that left these is gone
        entries = _entries(path)
        label = f"{what} {path}" if what else str(path)
        if entries and not resume and not overwrite:
            raise BertforgeError(f"{label} already holds {_describe(entries)}; "
                                 f"{_choices(what, resume_flag, overwrite_flag)}")
        record = _read_record(path)
        if entries and overwrite:
            if not (RUN_MARKERS & {e.name for e in entries}):
                raise BertforgeError(f"{label} holds files bertforge did not write ({_describe(entries)}); "
                                     f"{overwrite_flag} only replaces an earlier bertforge run: choose another {what}")
            _clear(entries, label)
            record = None
        if resume and record is not None:
            _check_resume(record, _plain(options or {}), _plain(fingerprint or {}), set(may_change), what,
                          resume_flag)
        if options is not None or fingerprint is not None:
            payload = {"options": _plain(options or {}), "fingerprint": _plain(fingerprint or {}),
                       "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            atomic_write_text(path / OPTIONS_FILE, json.dumps(payload, indent=2, sort_keys=True) + "\n")
    except BaseException:
        run.release(failed=True)
        raise
    return run


# ---- helpers -------------------------------------------------------------------------------------------------------
def _entries(path: Path) -> list[Path]:
    """What is in the directory besides the claim's own files."""
    return sorted(p for p in path.iterdir() if p.name not in _CLAIM_FILES)


def _describe(entries: list[Path]) -> str:
    names = [p.name + ("/" if p.is_dir() else "") for p in entries[:3]]
    more = f" and {len(entries) - 3} more" if len(entries) > 3 else ""
    what = "an earlier run" if RUN_MARKERS & {p.name for p in entries} else "files"
    return f"{what} ({', '.join(names)}{more})"


def _choices(what: str, resume_flag: str | None, overwrite_flag: str | None) -> str:
    flags = [f"{resume_flag} to continue it" if resume_flag else "", f"{overwrite_flag} to replace it"
             if overwrite_flag else ""]
    flags = [f for f in flags if f]
    return f"pass {' or '.join(flags)}, or choose another {what}" if flags else f"choose another {what}"


def _remove_if_empty(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass


def _clear(entries: list[Path], label: str) -> None:
    """Delete an earlier run's files (links themselves, never what they point at)."""
    for p in entries:
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        except OSError as err:
            raise BertforgeError(f"{label}: cannot remove {p.name} of the earlier run: {err.strerror}") from None


def _plain(obj: Any) -> Any:
    """JSON-normal form (paths -> str, tuples -> lists), so a recorded value compares equal to a fresh one."""
    return json.loads(json.dumps(obj, default=str, sort_keys=True))


def _read_record(path: Path) -> dict[str, Any] | None:
    p = path / OPTIONS_FILE
    if not p.is_file():
        return None  # a run written before options were recorded: nothing to compare
    try:
        record = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BertforgeError(f"{p}: unreadable ({err}); cannot check what the run depends on") from None
    if not isinstance(record, dict):
        raise BertforgeError(f"{p}: expected a JSON object")
    return record


def _flag(name: str) -> str:
    return name if name.startswith("-") else "--" + name.replace("_", "-")


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_resume(record: dict[str, Any], options: dict[str, Any], fingerprint: dict[str, Any], may_change: set[str],
                  what: str, resume_flag: str | None) -> None:
    """Refuse a resume whose options or data differ from the recorded run (names missing on either side pass:
    options added or retired between versions)."""
    advice = (f"start a new {what} or drop {resume_flag}" if resume_flag else
              f"rerun with the same options to continue it, or start a new {what} (or give --overwrite)")
    for name, old in sorted((record.get("options") or {}).items()):
        if name in options and name not in may_change and options[name] != old:
            raise BertforgeError(f"{_flag(name)} was {_show(old)} in the run being resumed, now "
                                 f"{_show(options[name])}; {advice}")
    for name, old in sorted((record.get("fingerprint") or {}).items()):
        if name in fingerprint and fingerprint[name] != old:
            raise BertforgeError(f"{_flag(name)}: the data changed since the run being resumed started (its "
                                 f"fingerprint differs); {advice}")


