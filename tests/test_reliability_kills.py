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
from test_reliability_inputs import snapshot

faiss = pytest.importorskip("faiss")


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
    from bertforge.embedding import SentenceEncoder
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
    from bertforge.embedding.index import VectorIndex

    VectorIndex.load(path).add(model, *BATCHES[batch], progress=False)


def _state(path: Path) -> tuple[list[str], np.ndarray]:
    from bertforge.embedding.index import VectorIndex

    index = VectorIndex.load(path)
    return index.ids, index.index.reconstruct_n(0, index.index.ntotal)


def test_the_index_survives_two_kills_in_a_row_at_every_step_boundary(encoder, fast_tmp):
    """Add A killed at step i, then add B killed at step j, for every (i, j): the last committed index loads (with
    exactly the vectors and documents of base, base+A, base+B or base+A+B), answers a query, and a third add
    succeeds and leaves only meta.json and one generation's two files."""
    from bertforge.embedding.index import VectorIndex

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


# ---- the run folder's manifest ---------------------------------------------------------------------------------------
_user_open = open  # the user's own writes: another program, which no simulated kill of bertforge stops


def user_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with _user_open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


RUN_FILES = ["checkpoints/step-1/state.pt", "config.json", "metrics.jsonl", "model.safetensors"]


def bertforge_run(out: Path, *, overwrite: bool = False, resume: bool = False, vocab: bool = False,
                  during: Path | None = None, tag: str = "") -> None:
    """A run through bertforge's own writers (the claim, atomic_write, a checkpoint folder, an appended log);
    `during`: the user saves a file into the folder while it runs."""
    from bertforge.io.rundir import claim_output_dir
    from bertforge.io.write import atomic_write, atomic_write_text
    from bertforge.training.state import MetricsLog, atomic_write_dir

    with claim_output_dir(out, resume=resume, overwrite=overwrite, options={"lr": 1e-4}):
        atomic_write_text(out / "config.json", json.dumps({"run": tag}))
        if vocab:
            atomic_write_text(out / "vocab.txt", "[PAD]\nthe\n")
        log = MetricsLog(out / "metrics.jsonl", None)
        log.write({"step": 1, "loss": 2.5, "run": tag})
        if during is not None:
            user_write(during, "saved into the folder while the run went on\n")
        atomic_write_dir(out / "checkpoints" / "step-1", lambda d: (d / "state.pt").write_bytes(tag.encode() * 64))
        log.write({"step": 2, "loss": 2.25})
        log.close()
        atomic_write(out / "model.safetensors", lambda tmp: Path(tmp).write_bytes(b"weights " + tag.encode()))


def _manifest(out: Path) -> dict:
    from bertforge.io.manifest import MANIFEST_FILE

    return json.loads((out / MANIFEST_FILE).read_text())["files"]


def _exactly_recorded(out: Path, names: list[str]) -> None:
    files = _manifest(out)
    assert sorted(files) == sorted(names), sorted(files)
    for rel, rec in files.items():
        data = (out / rel).read_bytes()
        assert rec == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}, rel


def test_the_manifest_records_only_what_bertforge_wrote(fast_tmp):
    out = fast_tmp / "run"
    bertforge_run(out, vocab=True, during=out / "notes.txt", tag="1")
    _exactly_recorded(out, RUN_FILES + ["vocab.txt"])  # not notes.txt, which appeared during the run
    user_write(out / "vocab.txt", "my own edit\n")  # the user edits a file bertforge wrote
    user_write(out / "data" / "mine.txt", "my data\n")
    mine = {k: v for k, v in snapshot(out).items() if k in ("notes.txt", "vocab.txt", "data/mine.txt")}
    bertforge_run(out, overwrite=True, tag="2")
    assert {k: snapshot(out)[k] for k in mine} == mine  # kept: never written by bertforge, or changed since
    _exactly_recorded(out, RUN_FILES)
    bertforge_run(out, resume=True, tag="3")  # a resume carries the record on, rewritten files re-hashed
    _exactly_recorded(out, RUN_FILES)
    assert {k: snapshot(out)[k] for k in mine} == mine


def test_a_run_killed_twice_at_every_step_never_costs_a_user_file(fast_tmp):
    """Run 1 killed at step i (the user saves notes.txt into the folder meanwhile), the user adds data/mine.txt and
    edits vocab.txt, run 2 with --overwrite killed at step j, then run 3 with --overwrite: for every (i, j), every
    file of the user is intact, and run 3's manifest records exactly its own files."""
    from bertforge.errors import BertforgeError

    def run1(out):
        bertforge_run(out, vocab=True, during=out / "notes.txt", tag="1")

    probe = fast_tmp / "probe"
    first = count_steps(fast_tmp, lambda: run1(probe))
    user_write(probe / "data" / "mine.txt", "my data\n")
    second = count_steps(fast_tmp, lambda: bertforge_run(probe, overwrite=True, tag="2"))
    assert first >= 20 and second >= 20, (first, second)
    out = fast_tmp / "run"
    refused = done = 0
    for i in range(first + 1):
        for j in range(0, second + 1, 3 if i % 4 else 1):  # every j for a quarter of the i, every third otherwise
            shutil.rmtree(out, ignore_errors=True)
            killed_at(fast_tmp, i, lambda: run1(out))
            user_write(out / "data" / "mine.txt", "my data\n")
            if (out / "vocab.txt").is_file():
                user_write(out / "vocab.txt", "my own edit\n")
            mine = {k: v for k, v in snapshot(out).items() if k in ("notes.txt", "vocab.txt", "data/mine.txt")}
            try:
                killed_at(fast_tmp, j, lambda: bertforge_run(out, overwrite=True, tag="2"))
                bertforge_run(out, overwrite=True, tag="3")
            except BertforgeError as err:  # nothing of bertforge's left to replace: refused, untouched
                assert "holds files bertforge did not write" in str(err), (i, j, err)
                refused += 1
            else:
                _exactly_recorded(out, RUN_FILES)
                assert json.loads((out / "config.json").read_text()) == {"run": "3"}
                done += 1
            after = snapshot(out)
            assert {k: after.get(k) for k in mine} == mine, (i, j)
    print(f"{first} x {second} steps: run 3 finished {done} times, refused {refused} times")
    assert done > refused  # a refusal: the kills left only the user's files (then --overwrite has nothing to do)


def test_a_tampered_manifest_deletes_nothing_of_the_user(fast_tmp):
    """Entries that leave the folder, pass a link, or name the user's files with other sizes or hashes; a manifest
    of an older format (names only) or of nonsense; a manifest planted in a folder of user files."""
    from bertforge.errors import BertforgeError
    from bertforge.io.manifest import MANIFEST_FILE

    outside = fast_tmp / "outside"
    user_write(outside / "keep.txt", "outside the run\n")
    out = fast_tmp / "run"
    bertforge_run(out, tag="1")
    user_write(out / "thesis.txt", "years of work\n")
    (out / "linked").symlink_to(outside)
    files = _manifest(out)
    digest = hashlib.sha256(b"outside the run\n").hexdigest()
    files.update({
        "../outside/keep.txt": {"size": 16, "sha256": digest},          # leaves the folder
        "/" + str(outside / "keep.txt").lstrip("/"): {"size": 16, "sha256": digest},
        "linked/keep.txt": {"size": 16, "sha256": digest},              # through a link
        "thesis.txt": {"size": 14, "sha256": "0" * 64},                 # the user's file, another hash
    })
    (out / MANIFEST_FILE).write_text(json.dumps({"version": 2, "files": files}))
    before_outside, thesis = snapshot(outside), (out / "thesis.txt").read_bytes()
    bertforge_run(out, overwrite=True, tag="2")
    assert snapshot(outside) == before_outside and (out / "thesis.txt").read_bytes() == thesis
    assert (out / "linked").is_symlink()
    _exactly_recorded(out, RUN_FILES)

    # a manifest planted in a folder of the user's files, naming all of them (sizes right, hashes not)
    mine = fast_tmp / "mine"
    for name in ("config.json", "notes.txt", "src/a.py"):
        user_write(mine / name, f"the user's {name}\n")
    planted = {n: {"size": (mine / n).stat().st_size, "sha256": "f" * 64} for n in ("config.json", "notes.txt",
                                                                                   "src/a.py")}
    (mine / MANIFEST_FILE).write_text(json.dumps({"version": 2, "files": planted}))
    before = snapshot(mine)
    with pytest.raises(BertforgeError, match="holds files bertforge did not write"):
        bertforge_run(mine, overwrite=True)
    assert snapshot(mine) == before
    # the older format (names only) and nonsense are not trusted: a folder without RUN_MARKERS stays refused
    for planted_text in (json.dumps({"written": ["notes.txt", "src"]}), "{not json", json.dumps([1, 2])):
        (mine / "config.json").unlink(missing_ok=True)
        (mine / MANIFEST_FILE).write_text(planted_text)
        kept = snapshot(mine)
        with pytest.raises(BertforgeError, match="holds files bertforge did not write"):
            bertforge_run(mine, overwrite=True)
        assert snapshot(mine) == kept


@pytest.mark.parametrize("name", [".bertforge-written.json", "run_options.json", ".lock"])
def test_the_claims_own_files_are_never_written_through_a_link(fast_tmp, name):
    """A link in place of the manifest, run_options.json or the lock file: the file outside is never written; the
    link is replaced by the run's own file, except run_options.json on --resume, which is refused in one line."""
    from bertforge.errors import BertforgeError

    outside = fast_tmp / "outside.json"
    user_write(outside, '{"the user": "outside the run"}\n')
    out = fast_tmp / "run"
    bertforge_run(out, tag="1")
    (out / name).unlink(missing_ok=True)
    (out / name).symlink_to(outside)
    if name == "run_options.json":
        with pytest.raises(BertforgeError, match=r"run_options.json is a link to .*outside.json; a run's record "
                                                 r"lives in its folder, never behind a link: remove the link"):
            bertforge_run(out, resume=True, tag="2")
        assert (out / name).is_symlink()
        bertforge_run(out, overwrite=True, tag="2")
    else:
        bertforge_run(out, resume=True, tag="2")
    assert outside.read_text() == '{"the user": "outside the run"}\n'
    assert not (out / name).is_symlink()
    if name != ".lock":  # released: the lock file goes
        assert (out / name).is_file()
