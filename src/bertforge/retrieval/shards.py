"""Embedding shards: one corpus embedded by N independent processes (a scheduler's job array, torchrun's ranks, a Ray
cluster's actors), each writing its own shard, later merged into one index (`retrieval.merge`).

Which passages a shard holds: shard I of N embeds the passages whose position in the corpus (counting from 0, empty
passages skipped, as `retrieval.passages.iter_passages` yields them) is I modulo N. Every shard streams the whole
corpus and keeps its share, so no process needs the corpus's length first, lengths spread evenly over the shards,
and the merge restores corpus order by taking one row of each shard in turn.

Layout, under the index folder:
  shards/shard-IIIII-of-NNNNN/
    plan.json            what the shard is made with (model fingerprint, pooling, precision, dtype, chunk size, N, I);
                         a rerun with other settings is refused instead of mixing them
    chunk-CCCCCC.npy     the vectors of the shard's rows [C*K, (C+1)*K) (float32 or float16, L2-normalised)
    chunk-CCCCCC.jsonl   {"id", "text"} per row, in the same order
    chunk-CCCCCC.json    the chunk's commit: row count, the sha256 of its passages and of the two files above
    shard.json           the shard's commit, written last: plan.json's fields, the corpus identity (source, its size
                         for a file, the sha256 of all its passages and their count), the shard's row count, its chunks
Each file is written atomically (temp + rename). A chunk counts as done only once its .json commits it and the files
match the recorded hashes; a rerun after a kill re-reads the corpus, skips every done chunk whose passages are the
same (hash), embeds the rest: since a chunk's vectors depend only on its own texts, the result is bit-identical to an
uninterrupted run.

Default N and I (`shard_plan`): given ones; else torchrun's WORLD_SIZE / RANK when WORLD_SIZE > 1; else a Slurm job
array's SLURM_ARRAY_TASK_COUNT and SLURM_ARRAY_TASK_ID (less SLURM_ARRAY_TASK_MIN, so arrays that start at 1 work);
else None: one process builds the whole index as before.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.errors import BertforgeError
from bertforge.io.manifest import sha256_file
from bertforge.io.read import read_json
from bertforge.io.write import atomic_write, atomic_write_text, ensure_dir, remove_stale_temps
from bertforge.retrieval.passages import iter_passages, with_title

SHARDS = "shards"
CHUNK_SIZE = 4096  # passages per chunk: the most a kill can cost
SHARD_DTYPES = ("float32", "float16")
_SHARD_DIR = re.compile(r"^shard-(\d{5})-of-(\d{5})$")


@dataclass
class ShardBuild:
    """What building one shard did."""
    shard_id: int
    num_shards: int
    count: int          # passages in the shard
    embedded: int       # of them embedded by this run (the others were in chunks a killed run had committed)
    path: Path

    def to_dict(self) -> dict[str, Any]:
        return {"shard_id": self.shard_id, "num_shards": self.num_shards, "count": self.count,
                "embedded": self.embedded, "path": str(self.path)}


def _env_int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise BertforgeError(f"environment variable {name}={env[name]!r}: expected a whole number") from None


def shard_plan(num_shards: int | None = None, shard_id: int | None = None,
               env: Mapping[str, str] | None = None) -> tuple[int | None, int | None]:
    """(N, I) for this process (see the module docstring); (None, None): no sharding. I stays None when N is given
    and nothing names this process's shard (then one process builds every shard in turn)."""
    env = os.environ if env is None else env
    if shard_id is not None and num_shards is None:
        raise BertforgeError("shard_id: give num_shards too")
    if num_shards is None and "WORLD_SIZE" in env and _env_int(env, "WORLD_SIZE") > 1:
        num_shards = _env_int(env, "WORLD_SIZE")
        shard_id = _env_int(env, "RANK") if shard_id is None and "RANK" in env else shard_id
    elif num_shards is None and "SLURM_ARRAY_TASK_COUNT" in env:
        num_shards = _env_int(env, "SLURM_ARRAY_TASK_COUNT")
        if shard_id is None and "SLURM_ARRAY_TASK_ID" in env:
            first = _env_int(env, "SLURM_ARRAY_TASK_MIN") if "SLURM_ARRAY_TASK_MIN" in env else 0
            shard_id = _env_int(env, "SLURM_ARRAY_TASK_ID") - first
    if num_shards is None:
        return None, None
    if num_shards < 1:
        raise BertforgeError(f"num_shards must be at least 1 (got {num_shards})")
    if shard_id is not None and not 0 <= shard_id < num_shards:
        raise BertforgeError(f"shard_id must be in 0..{num_shards - 1} for num_shards {num_shards} (got {shard_id})")
    return num_shards, shard_id


def shard_dir(out: str | Path, shard_id: int, num_shards: int) -> Path:
    return Path(out) / SHARDS / f"shard-{shard_id:05d}-of-{num_shards:05d}"


def found_shards(out: str | Path) -> list[tuple[int, int, Path]]:
    """(I, N, folder) of every shard folder under `out`/shards."""
    root = Path(out) / SHARDS
    if not root.is_dir():
        return []
    found = []
    for d in sorted(root.iterdir()):
        m = _SHARD_DIR.match(d.name)
        if m and d.is_dir():
            found.append((int(m.group(1)), int(m.group(2)), d))
    return found


def corpus_source(source: Any) -> dict[str, Any]:
    """How a shard names its corpus: the path (and its size, for a file), or what it is."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.exists():
            info: dict[str, Any] = {"source": str(path.resolve())}
            if path.is_file():
                info["size"] = path.stat().st_size
            return info
        return {"source": str(source)}
    return {"source": f"<{type(source).__name__} in memory>"}


def _passage_hash(h, pid: str, text: str) -> None:
    for part in (pid, text):
        data = part.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)


def _chunk_names(c: int) -> tuple[str, str, str]:
    return f"chunk-{c:06d}.npy", f"chunk-{c:06d}.jsonl", f"chunk-{c:06d}.json"


def _chunk_done(folder: Path, c: int, content: str) -> bool:
    """Chunk c is committed, for exactly these passages, and its files are intact."""
    npy, docs, commit = (folder / n for n in _chunk_names(c))
    if not commit.is_file():
        return False
    try:
        rec = json.loads(commit.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if rec.get("content") != content:
        return False
    return all(f.is_file() and sha256_file(f) == rec.get("sha256", {}).get(f.name) for f in (npy, docs))


def _write_chunk(folder: Path, c: int, vectors: np.ndarray, ids: list[str], texts: list[str], content: str) -> None:
    npy, docs, commit = _chunk_names(c)
    sums: dict[str, str] = {}

    def write_npy(tmp: str) -> None:
        with open(tmp, "wb") as fh:  # a handle, so numpy does not append ".npy" to the temporary name
            np.save(fh, vectors, allow_pickle=False)
        sums[npy] = sha256_file(tmp)

    def write_docs(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            for i, t in zip(ids, texts):
                fh.write((json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n").encode("utf-8"))
        sums[docs] = sha256_file(tmp)

    atomic_write(folder / npy, write_npy)
    atomic_write(folder / docs, write_docs)
    atomic_write_text(folder / commit, json.dumps({"rows": len(ids), "content": content, "sha256": sums}) + "\n")


def _stream(source: Any, passages: dict[str, Any], shard_id: int, num_shards: int, chunk_size: int,
            total: dict[str, Any]) -> Iterator[tuple[list[str], list[str], str]]:
    """(ids, texts, content sha256) of the shard's chunks, in order; `total` ("sha256": a hash, "passages": 0)
    takes in every passage of the corpus."""
    ids: list[str] = []
    texts: list[str] = []
    h = hashlib.sha256()
    for position, p in enumerate(iter_passages(source, **passages)):
        text = with_title(p.title, p.text)
        _passage_hash(total["sha256"], p.id, text)
        total["passages"] += 1
        if position % num_shards != shard_id:
            continue
        ids.append(p.id)
        texts.append(text)
        _passage_hash(h, p.id, text)
        if len(ids) == chunk_size:
            yield ids, texts, h.hexdigest()
            ids, texts, h = [], [], hashlib.sha256()
    if ids:
        yield ids, texts, h.hexdigest()


def build_shard(out: str | Path, model, source: Any, shard_id: int, num_shards: int, *,
                passages: dict[str, Any] | None = None, chunk_size: int = CHUNK_SIZE, dtype: str = "float32",
                batch_size: int = 32, precision: str = "fp32", progress: bool = True,
                overwrite: bool = False) -> ShardBuild:
    """Embed shard `shard_id` of `num_shards` of the corpus `source` with `model` (a SentenceEncoder) into
    `out`/shards/, resuming what an interrupted run committed (see the module docstring). `passages`: the options
    of `iter_passages` (text_col, id_col, title_col, split, config)."""
    from tqdm.auto import tqdm

    if dtype not in SHARD_DTYPES:
        raise BertforgeError(f"shard dtype must be one of {', '.join(SHARD_DTYPES)} (got {dtype!r})")
    if chunk_size < 1:
        raise BertforgeError(f"chunk_size must be positive (got {chunk_size})")
    folder = shard_dir(out, shard_id, num_shards)
    plan = {"format": 1, "shard_id": shard_id, "num_shards": num_shards, "fingerprint": model.fingerprint(),
            "model": str(model.source.resolve()) if model.source else None,
            "pooling": model.pooling.modes if model.pooling else None, "dim": int(model.dim), "precision": precision,
            "dtype": dtype, "chunk_size": chunk_size, "batch_size": batch_size,
            "corpus": corpus_source(source)}
    _start(folder, plan, overwrite)
    total: dict[str, Any] = {"sha256": hashlib.sha256(), "passages": 0}
    count = embedded = chunks = 0
    bar = tqdm(unit="passage", desc=f"shard {shard_id}/{num_shards}", disable=not progress, leave=False)
    for c, (ids, texts, content) in enumerate(_stream(source, passages or {}, shard_id, num_shards, chunk_size,
                                                      total)):
        if not _chunk_done(folder, c, content):
            vectors = model.encode(texts, batch_size=batch_size, precision=precision, normalize=True,
                                   progress=False)
            _write_chunk(folder, c, vectors.astype(dtype), ids, texts, content)
            embedded += len(ids)
        count += len(ids)
        chunks = c + 1
        bar.update(len(ids))
    bar.close()
    corpus = {**plan["corpus"], "sha256": total["sha256"].hexdigest(), "passages": total["passages"]}
    shard = {**plan, "corpus": corpus,
             "count": count, "chunks": chunks}
    atomic_write_text(folder / "shard.json", json.dumps(shard, indent=2) + "\n")  # the shard's commit
    return ShardBuild(shard_id, num_shards, count, embedded, folder)


def _start(folder: Path, plan: dict[str, Any], overwrite: bool) -> None:
    """Claim the shard folder for `plan`: a new one, or one a run with the same plan began (resumed)."""
    if overwrite and folder.is_dir():
        for f in folder.iterdir():
            if f.is_file():
                f.unlink()
    ensure_dir(folder, what="--out")
    remove_stale_temps(folder)
    plan_file = folder / "plan.json"
    if plan_file.is_file():
        before = read_json(plan_file)
        differs = [k for k in plan if k != "corpus" and before.get(k) != plan[k]]
        differs += ["corpus"] if before.get("corpus", {}).get("source") != plan["corpus"]["source"] else []
        if differs:
            raise BertforgeError(f"{plan_file}: this shard was begun with another {differs[0]} "
                                 f"({before.get(differs[0])!r}, now {plan[differs[0]]!r}); pass --overwrite to "
                                 "rebuild it, or another --out")
        if (folder / "shard.json").is_file():
            (folder / "shard.json").unlink()  # re-committed below, for the corpus as it is now
        return
    atomic_write_text(plan_file, json.dumps(plan, indent=2) + "\n")
