"""A folder of numbered generations committed by one pointer file: how an index folder is saved.

A save writes generation G+1's files beside G's under their own names (never over a file a reader may hold), then
replaces meta.json, which names G+1 and the sha256 of each of its files (the commit), then removes every other
generation's files. Any number of kills at any moment leaves the last committed generation; a reader follows
meta.json and checks each file's sum before parsing it. The dense index (embedding.index) and the passage index of
every retrieval method (retrieval.store) both save through `commit`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bertforge.io.manifest import sha256_file
from bertforge.io.write import atomic_write, atomic_write_text, fsync_dir, remove_stale_temps, write_errors

# a writer gets the temporary file to write; it may return the sha256 of what it wrote (when it streamed and hashed
# the bytes itself, so a large file is not read twice), or None to have it computed from the file
Writer = Callable[[str], "str | None"]


def commit(path: Path, meta: dict[str, Any], files: dict[str, bytes | Writer], pattern: re.Pattern,
           check: Callable[[], None] | None = None) -> dict[str, Any]:
    """Write `files` (their generation's names -> bytes or a writer), run `check` (which may refuse, before the
    commit), replace meta.json with `meta` plus their checksums (the commit), then remove every other file named
    like `pattern`. Returns the committed meta."""
    checksums: dict[str, str] = {}
    for name, write in files.items():
        if isinstance(write, bytes):
            atomic_write(path / name, lambda tmp, data=write: Path(tmp).write_bytes(data))
            checksums[name] = hashlib.sha256(write).hexdigest()
        else:
            def write_and_sum(tmp: str, write=write, name=name) -> None:
                checksums[name] = write(tmp) or sha256_file(tmp)  # of the bytes that are renamed into place
            atomic_write(path / name, write_and_sum)
    if check is not None:
        check()
    meta = {**meta, "checksums": checksums}
    atomic_write_text(path / "meta.json", json.dumps(meta, indent=2) + "\n")  # the commit
    remove_other_generations(path, set(files), pattern)
    return meta


def remove_other_generations(path: Path, keep: set[str], pattern: re.Pattern) -> None:
    """After the commit: the files (named like `pattern`) of earlier generations, an older layout's and any an
    interrupted save left (its temporaries too, once their writer is gone)."""
    for name in sorted(os.listdir(path)):
        if name not in keep and pattern.match(name):
            with write_errors(path / name, "cannot remove"):
                try:
                    os.unlink(path / name)
                except FileNotFoundError:
                    pass
    remove_stale_temps(path)
    fsync_dir(path)
