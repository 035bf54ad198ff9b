"""Safe output files: atomic replacement, writing through links and devices, and one-line write errors.

`atomic_write(path, write)` is how bertforge writes every output file:
  - a regular file (or a new one) is written to a temporary file beside it, fsynced and renamed over it, so a crash
    leaves the previous file or the new one, never half of one; the temporary file never outlives the call;
  - a symlink is followed: its target is replaced atomically and the link stays a link;
  - a device or FIFO (/dev/null, /dev/full, a named pipe) is written in place, never renamed over;
  - a new file gets mode 0o666 & ~umask (an existing file keeps its mode), like any shell redirection;
  - OSError (ENOSPC, EIO, EROFS, ...) and torch's "unexpected pos" / "PytorchStreamWriter failed" become a
    BertforgeError naming the path: "runs/x/model.safetensors: cannot write: No space left on device";
  - every file it writes is reported to `note_written`, so the claim of the run folder (io.rundir) records what
    bertforge wrote there; writers that fill a folder or stream into a file call `note_written` themselves.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any
from pathlib import Path

from bertforge.errors import BertforgeError

# Temporary files are named .NAME.PID.RANDOM.tmp, so a leftover can be tied to its (dead) writer.
_TEMP = re.compile(r"^\..+\.(\d+)\.[A-Za-z0-9_]+\.tmp$")
_LEGACY_TEMP = re.compile(r"^\..+\.[A-Za-z0-9_]{8}\.tmp$")  # .NAME.RANDOM.tmp, written before the pid was added
_TORCH_WRITE_FAILURE = ("unexpected pos", "PytorchStreamWriter failed", "file write failed")
_OS_ERROR_CODE = re.compile(r"\(os error (\d+)\)")  # Rust io::Error text (safetensors, tokenizers)
# faiss' IOWriter: "... write error in PATH: 19955 != 128000 (No space left on device)"
_FAISS_WRITE_ERROR = re.compile(r"write error in .*\(([^()]+)\)\s*$")


# ---- error translation ---------------------------------------------------------------------------------------------
def is_write_failure(err: BaseException) -> bool:
    """True for torch's writer errors, which carry no errno (typically a full disk)."""
    return isinstance(err, RuntimeError) and any(s in str(err) for s in _TORCH_WRITE_FAILURE)


def write_failure_reason(err: BaseException, path: str | Path | None = None) -> str | None:
    """Why a write failed, in words ("No space left on device"), or None if `err` is not a write failure."""
    if isinstance(err, OSError):
        if isinstance(err, IsADirectoryError):
            return "is a directory"
        return err.strerror or str(err)
    code = _OS_ERROR_CODE.search(str(err))
    if code and not isinstance(err, BertforgeError):
        return os.strerror(int(code.group(1)))
    faiss = _FAISS_WRITE_ERROR.search(str(err)) if isinstance(err, RuntimeError) else None
    if faiss:
        return faiss.group(1)
    if is_write_failure(err):
        # torch does not say why; a full file system is by far the usual cause, so check for it
        if path is not None and _free_bytes(Path(path)) == 0:
            return os.strerror(errno.ENOSPC)
        detail = re.sub(r"^\[enforce fail at [^\]]*\]\s*\.?\s*", "", str(err).strip().splitlines()[-1])
        return f"write failed (torch: {detail[:100]}; is the disk full?)"
    return None


def _free_bytes(path: Path) -> int | None:
    for p in (path, *path.parents):
        try:
            st = os.statvfs(p)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize
    return None


@contextlib.contextmanager
def write_errors(path: str | Path, action: str = "cannot write") -> Iterator[None]:
    """Turn a failed write inside the block into BertforgeError("PATH: cannot write: REASON")."""
    try:
        yield
    except BertforgeError:
        raise
    except Exception as err:  # noqa: BLE001 -- only write failures are translated; the rest is re-raised as is
        reason = write_failure_reason(err, path)
        if reason is None:
            raise
        other = getattr(err, "filename", None)
        if isinstance(err, FileNotFoundError) and other and Path(other).parent.is_dir():
            reason = f"the file system at {Path(other).parent} does not allow new files"  # /proc, /sys
        if other and not _TEMP.match(Path(other).name) and Path(other).resolve() != Path(path).resolve():
            raise BertforgeError(f"{other}: {reason}") from None  # another file failed (e.g. an input)
        raise BertforgeError(f"{path}: {action}: {reason}") from None


# ---- directories ---------------------------------------------------------------------------------------------------
def ensure_dir(path: str | Path, what: str = "--out", *, for_file: str | Path | None = None) -> Path:
    """Create directory `path` (and its parents) or raise one line saying why it cannot be ("--out D: ...").
    `for_file`: the output file the directory is for, named in the message instead of the directory."""
    path = Path(path)
    shown = for_file if for_file is not None else path
    label = f"{what} {shown}" if what else str(shown)
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise BertforgeError(f"{label}: directory {path} is not writable")
        return path
    for parent in (path, *path.parents):  # name the file that is in the way, not just "Not a directory"
        if parent.exists() or parent.is_symlink():
            if parent == path and for_file is None and not path.is_dir():
                raise BertforgeError(f"{label}: exists and is not a directory")
            if not parent.is_dir():
                raise BertforgeError(f"{label}: cannot create directory: {parent} is not a directory")
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        reason = err.strerror or str(err)
        failed = Path(err.filename) if err.filename else path
        if err.errno == errno.ENOENT and failed.parent.is_dir():
            reason = f"the file system at {failed.parent} does not allow new entries"
        raise BertforgeError(f"{label}: cannot create directory: {reason}") from None
    return path


def prepare_output_file(path: str | Path, what: str = "--out") -> Path:
    """Check early (before hours of work) that `path` can be written: its directory exists or can be made, and a
    file can be created there. Devices and FIFOs are accepted as they are. Returns `path`."""
    path = Path(path)
    label = f"{what} {path}" if what else str(path)
    target = Path(os.path.realpath(path))
    if target.is_dir():
        raise BertforgeError(f"{label}: is a directory (give a file name)")
    if target.exists() and not target.is_file():
        return path  # a device or FIFO: written in place
    ensure_dir(target.parent, what=what, for_file=path)
    _remove_stale_temps_of(target)  # a killed earlier write of this file left its temporary: gone now
    with write_errors(label, "cannot write"):
        fd, probe = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
        os.unlink(probe)
    return path


def remove_stale_temps(directory: str | Path, legacy_age_s: float = 3600.0) -> list[Path]:
    """Delete temporary files that killed writers left under `directory` (recursively); returns them.

    Only our own pattern is touched: .NAME.PID.RANDOM.tmp whose PID is no longer running, and the older
    .NAME.RANDOM.tmp once it is `legacy_age_s` old. A live writer's file is never removed.
    """
    removed = []
    now = time.time()
    for root, _dirs, files in os.walk(directory):
        for name in files:
            p = Path(root) / name
            m = _TEMP.match(name)
            try:
                stale = (m is not None and not _pid_alive(int(m.group(1)))) or (
                    m is None and _LEGACY_TEMP.match(name) is not None and now - p.stat().st_mtime > legacy_age_s)
                if stale:
                    p.unlink()
                    removed.append(p)
            except FileNotFoundError:
                pass
    return removed


def _remove_stale_temps_of(target: Path) -> None:
    """remove_stale_temps for one file's own temporaries (.NAME.PID.RANDOM.tmp beside it), without walking the
    rest of its directory (an output file may sit in a large folder)."""
    try:
        names = [n for n in os.listdir(target.parent) if n.startswith(f".{target.name}.")]
    except OSError:
        return
    for name in names:
        m = _TEMP.match(name)
        if m and not _pid_alive(int(m.group(1))):
            with contextlib.suppress(OSError):
                os.unlink(target.parent / name)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


# ---- what bertforge wrote ----------------------------------------------------------------------------------------
# The claims of output folders (io.rundir) listen here, so that they record only what bertforge's own writers
# wrote, never a file that merely appeared in the folder while a run held it.
_LISTENERS: list[Callable[[Path], None]] = []


def add_write_listener(listener: Callable[[Path], None]) -> None:
    _LISTENERS.append(listener)


def remove_write_listener(listener: Callable[[Path], None]) -> None:
    with contextlib.suppress(ValueError):
        _LISTENERS.remove(listener)


def note_written(path: str | Path) -> None:
    """Report that bertforge has just written `path`: a file, or a directory it filled (all files under it).
    `atomic_write` calls it; a writer that renames, appends or fills a folder by other means calls it after."""
    if _LISTENERS:
        target = Path(os.path.realpath(path))
        for listener in list(_LISTENERS):
            listener(target)


# ---- files ---------------------------------------------------------------------------------------------------------
def new_file_mode() -> int:
    """0o666 masked by the process umask: the mode `open()` would give a new file."""
    try:  # read it without changing it (Linux >= 4.7)
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write(path: str | Path, write: Callable[[str], None]) -> None:
    """Call write(tmp_path) for a temporary file beside `path` (beside its target, for a symlink), fsync it, then
    rename it over the target. A device or FIFO is written in place instead. See the module docstring."""
    path = Path(path)
    target = Path(os.path.realpath(path))  # through symlinks: replace the target, keep the link
    if target.is_dir():
        raise BertforgeError(f"{path}: cannot write: is a directory")
    if target.exists() and not target.is_file():
        _write_in_place(path, target, write)
        return
    ensure_dir(target.parent, what="")
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = new_file_mode()
    tmp = None
    try:
        with write_errors(path):
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp", dir=target.parent)
            os.close(fd)
            write(tmp)
            os.chmod(tmp, mode)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, target)
            tmp = None
        _fsync_dir(target.parent)
        note_written(target)
    finally:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def _write_in_place(path: Path, target: Path, write: Callable[[str], None]) -> None:
    """Devices and FIFOs: let `write` fill a private temporary file (some writers, e.g. safetensors, replace the
    path they are given), then copy its bytes into the special file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp")
    os.close(fd)
    try:
        with write_errors(tmp):
            write(tmp)
        with write_errors(path), open(tmp, "rb") as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable; some file systems refuse fsync on a directory, which is harmless."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


fsync_dir = _fsync_dir  # public: multi-file commits (embedding.index) make their own renames durable


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` with atomic_write."""
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_json(path: str | Path, obj: Any, sort_keys: bool = False) -> None:
    """`obj` as indented JSON (and a final newline) at `path`, with atomic_write."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=sort_keys) + "\n")
