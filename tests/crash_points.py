"""Kills at every step boundary of a multi-file commit, simulated in process (fast enough to loop over all of them,
twice in a row).

`Crash(root, at=k)` watches the calls that change what is on disk under `root`: creating, opening for writing,
renaming, linking and removing files and directories. The k-th such call "kills the process": it raises `Killed`
(a BaseException, so no `except Exception` swallows it), and so does every later one, so nothing after the kill
point reaches the disk (clean-up in `finally` blocks included), as with SIGKILL. When the block ends the "dead
process" lets go of what the kernel would take from a killed one: the files it opened under `root` are closed (so
its flock locks go) and its write listeners (bertforge.io.write) are gone. `Crash(root)` only counts the steps.
"""
from __future__ import annotations

import builtins
import io
import os
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from unittest import mock

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class Killed(BaseException):
    pass


class Crash:
    def __init__(self, root: str | Path, at: int | None = None):
        self.root = os.path.realpath(root)
        self.at, self.steps, self.dead = at, 0, False
        self.fds: list[int] = []

    def _inside(self, path: Any, dir_fd: Any = None) -> bool:
        if dir_fd is not None:  # relative to an open directory (shutil.rmtree): ours while we watch
            return True
        if not isinstance(path, (str, bytes, os.PathLike)):
            return False
        real = os.path.realpath(os.path.dirname(os.fsdecode(path)) or ".")
        return real == self.root or real.startswith(self.root + os.sep)

    def step(self, *paths: Any, dir_fd: Any = None) -> None:
        if not any(self._inside(p, dir_fd) for p in paths):
            return
        if self.dead:
            raise Killed("already killed")
        if self.at is not None and self.steps == self.at:
            self.dead = True
            raise Killed(f"killed at step {self.at}")
        self.steps += 1

    def __enter__(self) -> "Crash":
        self._stack = ExitStack()
        originals = {name: getattr(os, name) for name in
                     ("replace", "rename", "unlink", "remove", "rmdir", "mkdir", "link", "symlink", "open")}
        opener = io.open

        def two(name: str) -> Callable:
            def call(src, dst, *a, **kw):
                self.step(src, dst, dir_fd=kw.get("src_dir_fd") or kw.get("dst_dir_fd"))
                return originals[name](src, dst, *a, **kw)
            return call

        def one(name: str) -> Callable:
            def call(path, *a, **kw):
                self.step(path, dir_fd=kw.get("dir_fd"))
                return originals[name](path, *a, **kw)
            return call

        def os_open(path, flags, *a, **kw):
            if flags & _WRITE_FLAGS:
                self.step(path, dir_fd=kw.get("dir_fd"))
            fd = originals["open"](path, flags, *a, **kw)
            if self._inside(path, kw.get("dir_fd")):
                self.fds.append(fd)
            return fd

        def io_open(file, mode="r", *a, **kw):
            if any(c in mode for c in "wax+"):
                self.step(file)
            return opener(file, mode, *a, **kw)

        for name in ("replace", "rename", "link", "symlink"):
            self._stack.enter_context(mock.patch.object(os, name, two(name)))
        for name in ("unlink", "remove", "rmdir", "mkdir"):
            self._stack.enter_context(mock.patch.object(os, name, one(name)))
        self._stack.enter_context(mock.patch.object(os, "open", os_open))
        self._stack.enter_context(mock.patch.object(io, "open", io_open))
        self._stack.enter_context(mock.patch.object(builtins, "open", io_open))
        from bertforge.io import write

        self._listeners = list(write._LISTENERS)
        return self

    def __exit__(self, *exc) -> bool:
        self._stack.close()
        if self.dead:  # what the kernel takes from a killed process: its open files (and locks), its memory
            from bertforge.io import write

            for fd in self.fds:
                try:
                    os.fstat(fd)
                    os.close(fd)
                except OSError:
                    pass
            write._LISTENERS[:] = self._listeners
        return exc[0] is Killed  # the "process" died: the caller looks at what it left on disk


def count_steps(root: str | Path, action: Callable[[], Any]) -> int:
    """How many step boundaries `action` passes under `root` when nothing kills it."""
    with Crash(root) as crash:
        action()
    return crash.steps


def killed_at(root: str | Path, step: int, action: Callable[[], Any]) -> bool:
    """Run `action`, killed at `step`; True if the kill happened (False: it finished first)."""
    with Crash(root, at=step) as crash:
        action()
    return crash.dead
