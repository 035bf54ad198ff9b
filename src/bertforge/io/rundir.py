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
    is in it (no empty output folders after a failed run);
  - the directory is never one of the verb's inputs, inside one or holding one (`protect_inputs`, set by the CLI);
  - D/.bertforge-written.json (io.manifest) lists each file bertforge's writers wrote there, with its size and
    sha256, as they write it; `overwrite` deletes only those that still match, never a file the user put there
    (a folder without that record, from an older version: its RUN_MARKERS); a failed run that left no
    checkpoints/ is not in the way of the next run (its files are removed by the next claim);
  - the claim's own files (.lock, run_options.json, the manifest) are never written through a link.
One process per run claims the directory (rank 0 of a distributed job); flock locks are per open file.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io.manifest import MANIFEST_FILE, WrittenFiles, unlink_if_link
from bertforge.io.write import (add_write_listener, atomic_write_text, ensure_dir, new_file_mode, remove_stale_temps,
                                remove_write_listener, write_errors)

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
OPTIONS_FILE = "run_options.json"
_CLAIM_FILES = {LOCK_FILE, OPTIONS_FILE, MANIFEST_FILE}
# Names bertforge writes at the top of an output directory: what `overwrite` clears in a folder that has no
# manifest (written by a version that kept none).
RUN_MARKERS = {OPTIONS_FILE, "config.json", "model.safetensors", "checkpoints", "best", "metrics.jsonl",
               "eval_results.json", "results.json", "tokenizer.json", "modules.json", "meta.json", "index.faiss",
               "manifest.json", "trainer_state.pt"}
# Entries that make a failed run worth resuming; a failed run without any of them is cleared by the next claim.
RESUMABLE_MARKERS = {"checkpoints", "trainer_state.pt", "best"}


# ---- outputs never overlap inputs ------------------------------------------------------------------------------
# The inputs of the verb now running, as (flag, path); the CLI sets them (`protect_inputs`) from the verb's parser,
# so every claim refuses an --out that is, holds or sits inside an input, whatever the verb and its defaults.
_PROTECTED: list[tuple[str, str]] = []


def input_overlap(out: str | Path, inputs: Iterable[tuple[str, str | Path]], what: str = "--out") -> str | None:
    """Why `out` may not be written (it is an input, inside one, or holds one; through symlinks), or None."""
    o = Path(os.path.realpath(out))
    for flag, given in inputs:
        i = Path(os.path.realpath(given))
        kind = "folder" if i.is_dir() else "file"
        if o == i or (o.exists() and i.exists() and os.path.samefile(o, i)):
            return f"{what} {out} is the {flag} {kind} {given}"
        if o.is_relative_to(i):
            return f"{what} {out} is inside the {flag} {kind} {given}"
        if i.is_relative_to(o):
            return f"{what} {out} holds the {flag} {kind} {given}"
    return None


def check_not_an_input(out: str | Path, inputs: Iterable[tuple[str, str | Path]], what: str = "--out") -> None:
    """One line, before any work, if writing `out` could clear or change an input of the same command."""
    why = input_overlap(out, inputs, what)
    if why:
        raise BertforgeError(f"{why}; bertforge never writes where it reads: choose another {what}")


@contextlib.contextmanager
def protect_inputs(inputs: Iterable[tuple[str, str | Path]]) -> Iterator[None]:
    """For the duration of the block every claim_output_dir also checks its directory against `inputs`."""
    saved = list(_PROTECTED)
    _PROTECTED[:] = [(flag, str(p)) for flag, p in inputs]
    try:
        yield
    finally:
        _PROTECTED[:] = saved


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
                unlink_if_link(path)  # the pid is written into the lock file: never into a link's target
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, new_file_mode())
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


def lock_and_record(path: str | Path, what: str = "--out") -> "RunDir":
    """Lock an existing output folder for an update (e.g. `index add`) and record what bertforge writes there in
    its manifest, beside what it recorded before. release() it when done; an update never marks the folder failed."""
    path = Path(path)
    run = RunDir(path, DirLock.acquire(path, what), created=False)
    earlier = WrittenFiles.read(path)
    run.start_recording(WrittenFiles(path, earlier.files if earlier else {}, skip=frozenset(_CLAIM_FILES)))
    return run


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
        self.record: WrittenFiles | None = None  # what this run writes here; None until the claim is granted

    def start_recording(self, record: WrittenFiles) -> None:
        """From now on every file bertforge's writers write under the folder goes into its manifest."""
        self.record = record
        add_write_listener(record.note)

    def release(self, failed: bool = False) -> None:
        if self.lock.fd < 0:
            return
        leftovers = _entries(self.path) if self.path.is_dir() else None
        if self.record is not None:
            remove_write_listener(self.record.note)
            if leftovers:
                self.record.failed = failed
                self.record.resumable = not failed or _resumable(leftovers)
                self.record.flush()
        if failed and leftovers is not None and not leftovers:  # the failed run wrote nothing: undo the claim
            for name in (OPTIONS_FILE, MANIFEST_FILE):
                (self.path / name).unlink(missing_ok=True)
        self.lock.release()
        if failed and leftovers is not None and not leftovers and self.created:
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
    check_not_an_input(path, _PROTECTED, what)
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
        label = f"{what} {path}" if what else str(path)
        if (path / OPTIONS_FILE).is_symlink():
            if resume:
                raise BertforgeError(f"{path / OPTIONS_FILE} is a link to {os.readlink(path / OPTIONS_FILE)}; a "
                                     "run's record lives in its folder, never behind a link: remove the link")
            (path / OPTIONS_FILE).unlink()
        entries = _entries(path)
        manifest = WrittenFiles.read(path)  # None: no manifest we trust (none, a link, an older format)
        if entries and not resume and manifest is not None and manifest.failed and not manifest.resumable:
            # a failed run that left nothing to resume from (e.g. only data/): not in the corrected rerun's way,
            # unless something else is in the folder too
            matching = manifest.matching()
            if all(manifest.owns(e, matching) for e in entries):
                manifest.clear(matching)
                entries = _entries(path)
        if entries and not resume and not overwrite:
            raise BertforgeError(f"{label} already holds {_describe(entries)}; "
                                 f"{_choices(what, resume_flag, overwrite_flag)}")
        record = _read_record(path)
        carried: dict[str, Any] = {}
        if entries and overwrite:
            _clear_earlier_run(path, entries, manifest, label, what, overwrite_flag)
            (path / MANIFEST_FILE).unlink(missing_ok=True)
            kept = _entries(path)
            if kept:  # never delete what bertforge did not write: say it stays
                log.warning("%s: kept %s (not written by bertforge, or changed since)", label, _names(kept))
            record = None
        elif resume and manifest is not None:
            carried = manifest.files
        run.start_recording(WrittenFiles(path, carried, skip=frozenset(_CLAIM_FILES)))
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


def _clear_earlier_run(path: Path, entries: list[Path], manifest: WrittenFiles | None, label: str, what: str,
                       overwrite_flag: str | None) -> None:
    """`overwrite`: delete the earlier run's files: those its manifest records and that still match it, or, in a
    folder without a manifest, its RUN_MARKERS; refuse a folder where nothing is bertforge's."""
    if manifest is not None:
        matching = manifest.matching()
        ours: list[Path] = [e for e in entries if any(rel.split("/")[0] == e.name for rel in matching)]
    else:
        ours = [e for e in entries if e.name in RUN_MARKERS]
    if not ours:
        raise BertforgeError(f"{label} holds files bertforge did not write ({_describe(entries)}); "
                             f"{overwrite_flag} only replaces an earlier bertforge run: choose another {what}")
    if manifest is not None:
        manifest.clear(matching)
    else:
        _clear(ours, label)


# ---- helpers -------------------------------------------------------------------------------------------------------
def _entries(path: Path) -> list[Path]:
    """What is in the directory besides the claim's own files."""
    return sorted(p for p in path.iterdir() if p.name not in _CLAIM_FILES)


def _resumable(entries: list[Path]) -> bool:
    """Whether a failed run left something to resume from (also one level down: finetune --runs N's run-K/)."""
    return any(p.name in RESUMABLE_MARKERS or (p.is_dir() and not p.is_symlink() and
                                               any((p / m).exists() for m in RESUMABLE_MARKERS)) for p in entries)


def _names(entries: list[Path]) -> str:
    names = [p.name + ("/" if p.is_dir() else "") for p in entries[:3]]
    return ", ".join(names) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")


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


def _show_change(old: Any, new: Any, context: int = 20, width: int = 60) -> tuple[str, str]:
    """The two values as a message shows them: whole when short, else around where they differ (with `context`
    characters each side), so that two long paths that share their first 57 characters do not look the same."""
    a, b = json.dumps(old), json.dumps(new)
    if len(a) <= width and len(b) <= width:
        return a, b
    same = 0
    while same < min(len(a), len(b)) and a[same] == b[same]:
        same += 1
    tail = 0
    while tail < min(len(a), len(b)) - same and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    start = max(0, same - context)

    def cut(text: str) -> str:
        end = min(len(text), max(len(text) - tail + context, start + 1), start + width)
        return ("..." if start else "") + text[start:end] + ("..." if end < len(text) else "")

    return cut(a), cut(b)


def _check_resume(record: dict[str, Any], options: dict[str, Any], fingerprint: dict[str, Any], may_change: set[str],
                  what: str, resume_flag: str | None) -> None:
    """Refuse a resume whose options or data differ from the recorded run (names missing on either side pass:
    options added or retired between versions)."""
    advice = (f"start a new {what} or drop {resume_flag}" if resume_flag else
              f"rerun with the same options to continue it, or start a new {what} (or give --overwrite)")
    for name, old in sorted((record.get("options") or {}).items()):
        if name in options and name not in may_change and options[name] != old:
            was, now = _show_change(old, options[name])
            raise BertforgeError(f"{_flag(name)} was {was} in the run being resumed, now {now}; {advice}")
    for name, old in sorted((record.get("fingerprint") or {}).items()):
        if name in fingerprint and fingerprint[name] != old:
            raise BertforgeError(f"{_flag(name)}: the data changed since the run being resumed started (its "
                                 f"fingerprint differs); {advice}")


