"""The index folder on disk, for every retrieval method: numbered generations of files committed by one pointer.

  meta.json            the method, count, generation G, the sha256 of each of G's files, and each part's settings
  docs.G.jsonl         {"id", "title", "text"} per row, in row order (every method)
  index.G.faiss        the dense vectors (dense, hybrid): embedding.index's FAISS index
  bm25.G.npz           the BM25 score matrix (bm25, hybrid): plain numeric arrays, read without pickle
  bm25-vocab.G.json    its vocabulary (bm25, hybrid)

A save writes generation G+1's files beside G's under their own names, then renames a meta.json naming G+1 into
place (the commit), then removes every other generation's files; a load follows meta.json and checks each file's
sha256 before parsing it. So any number of kills at any moment leaves the last committed index, and a bit flip is
an error, never wrong answers (embedding/index.py keeps the same rules for the dense structure alone; a folder it wrote,
of the older one-generation layout too, is a dense index here).
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io import generations
from bertforge.io.manifest import sha256_file
from bertforge.io.read import read_json
from bertforge.io.rundir import is_locked

METHODS = ("dense", "bm25", "hybrid")
# role -> (stem, extension): a generation's file is STEM.G.EXT
ROLES = {"index.faiss": ("index", "faiss"), "docs.jsonl": ("docs", "jsonl"), "bm25.npz": ("bm25", "npz"),
         "bm25-vocab.json": ("bm25-vocab", "json")}
METHOD_ROLES = {"dense": ("index.faiss", "docs.jsonl"), "bm25": ("docs.jsonl", "bm25.npz", "bm25-vocab.json"),
                "hybrid": ("index.faiss", "docs.jsonl", "bm25.npz", "bm25-vocab.json")}
# every name a generation, the older dense layout or an interrupted save leaves (temporaries aside)
_INDEX_FILE = re.compile(r"^(?:(?:index\.\d+\.faiss|docs\.\d+\.jsonl|bm25\.\d+\.npz|bm25-vocab\.\d+\.json)"
                         r"|index\.faiss(?:\.next)?|docs\.jsonl(?:\.next)?)$")


def check_method(method: Any) -> str:
    if method not in METHODS:
        raise BertforgeError(f"unknown retrieval method {method!r} (expected {', '.join(METHODS)})")
    return method


def method_of(meta: dict[str, Any]) -> str:
    """The method a meta.json records (an index from before methods: dense)."""
    return meta.get("method", "dense")


def names(method: str, generation: int) -> dict[str, str]:
    return {role: f"{ROLES[role][0]}.{generation}.{ROLES[role][1]}" for role in METHOD_ROLES[method]}


def generation_of(meta: dict[str, Any]) -> int:
    return meta.get("generation", 0)


def read_meta(meta_path: Path) -> dict[str, Any]:
    meta = read_json(meta_path)
    method = meta.get("method", "dense")
    if method not in METHODS:
        raise BertforgeError(f"{meta_path}: unknown method {method!r} (expected {', '.join(METHODS)})")
    required = ("count", *(("kind", "fingerprint") if method != "bm25" else ()), *(("bm25",) if method != "dense"
                                                                                   else ()))
    missing = [k for k in required if k not in meta]
    if missing:
        raise BertforgeError(f"{meta_path}: missing field {missing[0]!r}")
    generation = meta.get("generation", 0)
    if type(generation) is not int or generation < 0:
        raise BertforgeError(f"{meta_path}: generation must be a whole number >= 0 (got {generation!r})")
    if generation == 0 and method != "dense":
        raise BertforgeError(f"{meta_path}: a {method} index names its generation (missing field 'generation')")
    if not isinstance(meta.get("checksums") or {}, dict):
        raise BertforgeError(f"{meta_path}: checksums must be an object")
    return meta


def committed_files(path: Path, meta: dict[str, Any]) -> dict[str, Path]:
    """{role: file} of the generation meta.json commits, each checked against its recorded sha256 (before any
    parser sees it)."""
    sums = meta.get("checksums") or {}
    generation = generation_of(meta)
    files = {}
    for role, name in names(method_of(meta), generation).items():
        files[role] = path / name
        if not files[role].is_file():
            raise BertforgeError(f"{files[role]}: missing (meta.json commits generation {generation}); "
                                 "rebuild with bertforge index build")
        if sha256_file(files[role]) != sums.get(name):
            raise damaged(path, files[role])
    return files


def damaged(path: Path, file: Path) -> BertforgeError:
    if is_locked(path):
        return BertforgeError(f"{path}: another bertforge run is writing this index (index add); "
                              "try again when it has finished")
    return BertforgeError(f"{file}: checksum mismatch, the file is damaged; rebuild with bertforge index build")


def load(path: Path, read: Callable[[dict[str, Path], dict[str, Any]], Any]) -> Any:
    """`read(files, meta)` of the committed generation; retried when another process commits meanwhile (and
    removes the generation being read)."""
    meta_path = path / "meta.json"
    if not meta_path.is_file():
        raise BertforgeError(f"{path}: not an index directory (no meta.json)")
    for attempt in range(5):
        meta = read_meta(meta_path)
        try:
            return read(committed_files(path, meta), meta)
        except (BertforgeError, FileNotFoundError):
            if attempt == 4 or read_meta(meta_path) == meta:
                raise
    raise AssertionError("unreachable")


def docs_bytes(ids: list[str], titles: list[str], texts: list[str]) -> bytes:
    return "".join(json.dumps({"id": i, "title": h, "text": t}, ensure_ascii=False) + "\n"
                   for i, h, t in zip(ids, titles, texts)).encode("utf-8")


def commit(path: Path, meta: dict[str, Any], writers: dict[str, bytes | Callable[[str], None]]) -> dict[str, Any]:
    """Write the next generation (`writers`: role -> its bytes, or a function writing the file it is given), commit
    it by replacing meta.json, remove the other generations' files (io.generations.commit); returns the committed
    meta."""
    method = method_of(meta)
    generation = generation_of(meta) + 1
    new = names(method, generation)
    if set(writers) != set(new):
        raise AssertionError(f"a {method} index writes {sorted(new)}, got {sorted(writers)}")
    return generations.commit(path, {**meta, "generation": generation},
                              {new[role]: write for role, write in writers.items()}, _INDEX_FILE)
