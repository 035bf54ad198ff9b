"""Kills and tampering at every step boundary: the vector index's commit and the run folder's manifest.

Each test counts the step boundaries of an uninterrupted operation (every call that creates, opens for writing,
renames or removes something under the folder: tests/crash_points.py), then kills it at each one, twice in a row
for the index, and checks what is left: the last committed index loads, answers queries and takes the next add;
the manifest never lets `--overwrite` delete a file bertforge did not write.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from crash_points import count_steps, killed_at

faiss = pytest.importorskip("faiss")


def snapshot(root: Path) -> dict[str, str]:
    found = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            found[rel] = "link:" + os.readlink(p)
        elif p.is_file():
            found[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return found


@pytest.fixture
def fast_tmp(tmp_path):
    """A folder in memory where there is one (/dev/shm): the loops commit hundreds of times, and what they check is
    the order of renames and removals, not the disk's fsync (about 12 ms a file on this machine's disk)."""
    import tempfile

    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        yield tmp_path
        return
    root = Path(tempfile.mkdtemp(prefix="bertforge-kills-", dir="/dev/shm"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---- the vector index ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    from bertforge.config import ModelConfig
    from bertforge.embed import SentenceEncoder
    from bertforge.model import Encoder
    from bertforge.model.checkpoint import save_pretrained
    from bertforge.tokenization import Tokenizer

    lines = [f"the cat sat on the mat number {i} and the dog ran to the tree" for i in range(50)]
    tok = Tokenizer.train(lines, kind="wordpiece", vocab_size=100, min_frequency=1)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)
    root = tmp_path_factory.mktemp("enc") / "model"
    save_pretrained(Encoder(cfg), root, cfg, tokenizer=tok)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 32-wide model: more threads only wait for each other on a busy machine
    yield SentenceEncoder.from_pretrained(root)
    torch.set_num_threads(threads)


BATCHES = {name: ([f"{name}{i}" for i in range(n)], [f"the {word} number {i}" for i in range(n)])
           for name, n, word in (("base", 4, "cat"), ("a", 3, "dog"), ("b", 2, "tree"), ("c", 2, "mat"))}


def _add(path: Path, model, batch: str) -> None:
    from bertforge.embed.index import VectorIndex

    VectorIndex.load(path).add(model, *BATCHES[batch], progress=False)


def _state(path: Path) -> tuple[list[str], np.ndarray]:
    from bertforge.embed.index import VectorIndex

    index = VectorIndex.load(path)
    return index.ids, index.index.reconstruct_n(0, index.index.ntotal)


def test_the_index_survives_two_kills_in_a_row_at_every_step_boundary(encoder, fast_tmp):
    """Add A killed at step i, then add B killed at step j, for every (i, j): the last committed index loads (with
    exactly the vectors and documents of base, base+A, base+B or base+A+B), answers a query, and a third add
    succeeds and leaves only meta.json and one generation's two files."""
    from bertforge.embed.index import VectorIndex

    clean = fast_tmp / "clean"
    VectorIndex.build(clean, encoder, *BATCHES["base"], progress=False)
    expected = {}  # ids -> vectors of each state an uninterrupted sequence of adds reaches
    for sequence in ((), ("a",), ("b",), ("a", "b")):
        d = fast_tmp / ("ref-" + "".join(sequence))
        shutil.copytree(clean, d)
        for batch in sequence:
            _add(d, encoder, batch)
        ids, vectors = _state(d)
        expected[tuple(ids)] = vectors

    probe = fast_tmp / "probe"
    shutil.copytree(clean, probe)
    steps = count_steps(probe, lambda: _add(probe, encoder, "a"))
    assert steps >= 8, steps  # two files and meta.json written and renamed, the old generation removed
    work = fast_tmp / "work"
    kills = 0
    for i in range(steps + 1):
        for j in range(steps + 1):
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(clean, work)
            kills += killed_at(work, i, lambda: _add(work, encoder, "a"))
            kills += killed_at(work, j, lambda: _add(work, encoder, "b"))
            ids, vectors = _state(work)  # loads: never "damaged"
            assert tuple(ids) in expected, (i, j, ids)
            np.testing.assert_array_equal(vectors, expected[tuple(ids)])
            index = VectorIndex.load(work)
            hits = index.search(encoder, ["the dog number 1"], k=2)
            assert len(hits[0]) == 2
            _add(work, encoder, "c")  # the next add works and tidies up what the kills left
            assert VectorIndex.load(work).ids == ids + BATCHES["c"][0], (i, j)
            # a kill's temporaries carry its pid (here: this live process); the next save sweeps a dead one's
            names = sorted(p.name for p in work.iterdir() if f".{os.getpid()}." not in p.name)
            gen = json.loads((work / "meta.json").read_text())["generation"]
            assert names == [f"docs.{gen}.jsonl", f"index.{gen}.faiss", "meta.json"], (i, j, names)
    assert kills >= 2 * steps * steps  # the loop really killed (the last step of each is the finished add)
