"""A corpus-scale index from embedding shards: N shards built apart and merged equal the one-process build; a kill
at every step of a sharded build, then a rerun, gives the uninterrupted build's files; a wrong shard set is one line
naming the shard; IVF-PQ's recall against flat; Ray's local cluster builds the same shards."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from crash_points import count_steps, killed_at

faiss = pytest.importorskip("faiss")

from bertforge.errors import BertforgeError  # noqa: E402

WORDS = "the cat sat on a mat dog ran to tree bird flew over house river stone green red blue old new".split()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from bertforge.config import ModelConfig
    from bertforge.model import Encoder
    from bertforge.model.checkpoint import save_pretrained
    from bertforge.tokenization import Tokenizer

    tok = Tokenizer.train([" ".join(WORDS)] * 5 + [f"number {i}" for i in range(100)], kind="wordpiece",
                          vocab_size=120, min_frequency=1)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)
    root = tmp_path_factory.mktemp("enc") / "model"
    save_pretrained(Encoder(cfg), root, cfg, tokenizer=tok)
    return root


@pytest.fixture(scope="module")
def encoder(model_dir):
    from bertforge.embedding import SentenceEncoder

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield SentenceEncoder.from_pretrained(model_dir)
    torch.set_num_threads(threads)


def _corpus(path: Path, n: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            words = rng.choice(WORDS, size=int(rng.integers(3, 12)))
            fh.write(json.dumps({"id": f"p{i}", "text": f"{' '.join(words)} number {i}"}) + "\n")
            if i % 7 == 3:
                fh.write(json.dumps({"id": f"empty{i}", "text": "  "}) + "\n")  # skipped: positions count kept ones
    return path


@pytest.fixture
def fast_tmp(tmp_path):
    """A folder in memory where there is one (/dev/shm): the kill loops commit hundreds of files, and what they
    check is the order of renames, not the disk's fsync."""
    import tempfile

    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        yield tmp_path
        return
    root = Path(tempfile.mkdtemp(prefix="bertforge-shards-", dir="/dev/shm"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


QUERIES = ["the cat sat on the mat", "a bird flew over the river", "old stone house number 4", "green tree"]


def _search(index, encoder, k=10):
    q = encoder.encode(QUERIES, normalize=True, progress=False)
    scores, rows = index.index.search(q, k)
    return [[index.ids[r] for r in row] for row in rows], scores


def test_shards_built_apart_then_merged_equal_the_one_process_build(tmp_path, encoder):
    from bertforge.embedding.index import VectorIndex
    from bertforge.retrieval.merge import merge_shards
    from bertforge.retrieval.passages import read_passages
    from bertforge.retrieval.shards import build_shard

    corpus = _corpus(tmp_path / "c.jsonl", 53)
    ps = read_passages(corpus)
    plain = VectorIndex.build(tmp_path / "plain", encoder, ps.ids, ps.texts, progress=False)
    out = tmp_path / "sharded"
    for i in (2, 0, 1):  # any order, as a job array runs them
        built = build_shard(out, encoder, corpus, i, 3, chunk_size=5, progress=False)
        assert built.count == len(range(i, 53, 3)) and built.embedded == built.count
    meta = merge_shards(out, "flat", progress=False)
    merged = VectorIndex.load(out)
    assert merged.ids == plain.ids and merged.texts == plain.texts  # corpus order restored
    assert meta["count"] == 53 and meta["fingerprint"] == encoder.fingerprint()
    ids_a, scores_a = _search(plain, encoder)
    ids_b, scores_b = _search(merged, encoder)
    assert ids_a == ids_b
    np.testing.assert_allclose(scores_a, scores_b, atol=1e-6)
    # and the public API: every shard in turn, then the merge; float16 shards keep the ranking close
    from bertforge.api import Index

    index = Index.build(encoder, str(corpus), tmp_path / "api", num_shards=4, chunk_size=8)
    assert index.ids == plain.ids
    np.testing.assert_allclose(index._index.vectors.index.reconstruct_n(0, 53), plain.index.reconstruct_n(0, 53),
                               atol=1e-6)
    half = Index.build(encoder, str(corpus), tmp_path / "half", num_shards=2, shard_dtype="float16")
    np.testing.assert_allclose(half._index.vectors.index.reconstruct_n(0, 53), plain.index.reconstruct_n(0, 53),
                               atol=2e-3)


def test_the_command_line_builds_shards_from_the_environment_then_merges(tmp_path, model_dir, encoder, monkeypatch,
                                                                         capsys):
    from bertforge.cli import main
    from bertforge.embedding.index import VectorIndex
    from bertforge.retrieval.shards import shard_plan

    assert shard_plan(env={}) == (None, None)
    assert shard_plan(env={"WORLD_SIZE": "4", "RANK": "2"}) == (4, 2)
    assert shard_plan(env={"SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_ID": "3",
                           "SLURM_ARRAY_TASK_MIN": "1"}) == (3, 2)
    assert shard_plan(5, None, env={"WORLD_SIZE": "4", "RANK": "2"}) == (5, None)
    with pytest.raises(BertforgeError, match="shard_id must be in 0..1"):
        shard_plan(2, 2, env={})
    corpus = _corpus(tmp_path / "c.jsonl", 20)
    out = tmp_path / "idx"
    args = ["index", "build", "--model", str(model_dir), "--corpus", str(corpus), "--out", str(out),
            "--no-progress"]
    for task in ("1", "2"):  # a Slurm job array of two tasks, numbered from 1
        monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "2")
        monkeypatch.setenv("SLURM_ARRAY_TASK_ID", task)
        monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "1")
        assert main(args) == 0
    assert not (out / "meta.json").exists()
    assert main(args + ["--merge", "--kind", "hnsw"]) == 0
    index = VectorIndex.load(out)
    assert index.meta["kind"] == "hnsw" and len(index) == 20 and index.ids == [f"p{i}" for i in range(20)]
    assert main(args + ["--merge"]) == 2
    assert "an index already exists there" in capsys.readouterr().err


def test_a_wrong_shard_set_is_one_line_naming_the_shard(tmp_path, encoder, model_dir):
    from bertforge.config import ModelConfig
    from bertforge.embedding import SentenceEncoder
    from bertforge.model import Encoder
    from bertforge.model.checkpoint import save_pretrained
    from bertforge.retrieval.merge import merge_shards
    from bertforge.retrieval.shards import build_shard
    from bertforge.tokenization import Tokenizer

    corpus = _corpus(tmp_path / "c.jsonl", 12)
    out = tmp_path / "idx"
    build_shard(out, encoder, corpus, 0, 3, progress=False)
    build_shard(out, encoder, corpus, 2, 3, progress=False)
    with pytest.raises(BertforgeError, match=r"shard-00001-of-00003: shard 1 of 3 is missing"):
        merge_shards(out, progress=False)
    other_n = tmp_path / "other-n"
    shutil.copytree(out, other_n)
    build_shard(other_n, encoder, corpus, 1, 2, progress=False)
    with pytest.raises(BertforgeError, match=r"shards of several shard counts \(2, 3\)"):
        merge_shards(other_n, progress=False)
    with pytest.raises(BertforgeError, match=r"shard-00001-of-00002: a shard of another shard count than 3"):
        merge_shards(other_n, num_shards=3, progress=False)
    # shard 1 from another model (same width, other weights)
    tok = Tokenizer.from_pretrained(model_dir)
    torch.manual_seed(1)
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)
    save_pretrained(Encoder(cfg), tmp_path / "other", cfg, tokenizer=tok)
    other = SentenceEncoder.from_pretrained(tmp_path / "other")
    build_shard(out, other, corpus, 1, 3, progress=False)
    with pytest.raises(BertforgeError, match=r"shard-00001-of-00003: built with another model than shard 0"):
        merge_shards(out, progress=False)
    with pytest.raises(BertforgeError, match=r"this shard was begun with another fingerprint"):
        build_shard(out, encoder, corpus, 1, 3, progress=False)  # no silent mix of two models in one shard
    build_shard(out, encoder, corpus, 1, 3, progress=False, overwrite=True)
    with pytest.raises(BertforgeError, match=r"shard-00000-of-00003: built with model fingerprint .* not the given"):
        merge_shards(out, fingerprint=other.fingerprint(), progress=False)
    # another corpus under shard 2
    _corpus(tmp_path / "c2.jsonl", 12, seed=1)
    shutil.copy(tmp_path / "c2.jsonl", corpus)
    build_shard(out, encoder, corpus, 2, 3, progress=False)
    with pytest.raises(BertforgeError, match=r"shard-00002-of-00003: built with another corpus than shard 0"):
        merge_shards(out, progress=False)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_kill_at_every_step_of_a_sharded_build_then_a_rerun_gives_the_same_index(fast_tmp, encoder):
    from bertforge.retrieval.merge import merge_shards
    from bertforge.retrieval.shards import build_shard

    tmp_path = fast_tmp
    corpus = _corpus(tmp_path / "c.jsonl", 10)

    def build(out: Path) -> None:
        for i in range(2):
            build_shard(out, encoder, corpus, i, 2, chunk_size=3, progress=False)
        merge_shards(out, "flat", progress=False)

    clean = tmp_path / "clean"
    clean.mkdir()
    build(clean)
    want = _tree(clean)
    probe = tmp_path / "probe"
    probe.mkdir()
    steps = count_steps(probe, lambda: build(probe))
    assert steps >= 30, steps  # 2 shards x (plan + 2 chunks x 3 files + shard.json) + the merge's commit
    kills = 0
    for step in range(steps):
        work = tmp_path / "work"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        kills += killed_at(work, step, lambda: build(work))
        pid = f".{os.getpid()}."
        build(work)  # the rerun: resumes the shards, merges
        got = {k: v for k, v in _tree(work).items() if pid not in k}  # a kill's temporaries carry this pid
        assert got == want, (step, sorted(set(got) ^ set(want)))
    assert kills == steps


def test_a_rerun_embeds_only_the_chunks_a_kill_lost(fast_tmp, encoder):
    from bertforge.retrieval.shards import build_shard

    corpus = _corpus(fast_tmp / "c.jsonl", 20)

    def build(out: Path):
        return build_shard(out, encoder, corpus, 0, 1, chunk_size=5, progress=False)

    probe = fast_tmp / "probe"
    probe.mkdir()
    embedded = []
    for step in range(count_steps(probe, lambda: build(probe))):
        work = fast_tmp / "work"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        killed_at(work, step, lambda: build(work))
        again = build(work)
        assert again.count == 20
        embedded.append(again.embedded)
    assert embedded == sorted(embedded, reverse=True) and set(embedded) == {20, 15, 10, 5, 0}, embedded


def test_ivf_pq_recall_at_10_against_flat(tmp_path):
    """2,000 unit vectors in 32 dims drawn around 40 centres (embeddings cluster by topic), 100 queries near
    them: IVF-PQ (51 lists, 12 probed, 8 sub-quantisers of 8 bits) finds most of flat's top 10 (measured: 0.80)."""
    from bertforge.embedding.index import make_index

    rng = np.random.default_rng(0)
    centres = rng.standard_normal((40, 32))
    x = (centres[rng.integers(0, 40, 2000)] + 0.6 * rng.standard_normal((2000, 32))).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = (centres[rng.integers(0, 40, 100)] + 0.6 * rng.standard_normal((100, 32))).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    flat = make_index("flat", 32)
    flat.add(x)
    pq = make_index("ivf-pq", 32, train=x)
    pq.add(x)
    assert (pq.pq.M, pq.pq.nbits, pq.nlist) == (8, 8, 51)
    _, truth = flat.search(q, 10)
    _, found = pq.search(q, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(truth, found)])
    assert recall > 0.5, recall
    with pytest.raises(BertforgeError, match="needs at least 256 passages"):
        make_index("ivf-pq", 32, train=x[:100])


def test_merge_streams_into_ivf_pq_and_the_index_loads(tmp_path, encoder):
    from bertforge.embedding.index import VectorIndex
    from bertforge.retrieval.merge import merge_shards
    from bertforge.retrieval.shards import build_shard

    corpus = _corpus(tmp_path / "c.jsonl", 300)
    out = tmp_path / "idx"
    for i in range(2):
        build_shard(out, encoder, corpus, i, 2, chunk_size=64, dtype="float16", progress=False)
    meta = merge_shards(out, "ivf-pq", progress=False)
    assert meta["pq"] == {"m": 8, "bits": 8} and meta["nlist"] == meta["nprobe"] == 7  # 300 // 39 lists, all probed
    index = VectorIndex.load(out)
    assert len(index) == 300 and index.index.nprobe == meta["nprobe"]
    hits = index.search(encoder, ["dog number 7"], k=5)[0]
    assert len(hits) == 5 and index.meta["metric"] == "l2"
    # scores are cosines (1 - d / 2 of the unit vectors' L2 distance), as flat's, up to the codes' error
    q = encoder.encode(["dog number 7"], normalize=True, progress=False)[0]
    vectors = encoder.encode(index.texts, normalize=True, progress=False)
    exact = {pid: float(v @ q) for pid, v in zip(index.ids, vectors)}
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert all(abs(h.score - exact[h.id]) < 0.05 for h in hits), [(h.score, exact[h.id]) for h in hits]


@pytest.mark.slow
def test_a_local_ray_cluster_builds_the_same_index(tmp_path, model_dir, encoder):
    pytest.importorskip("ray")
    import ray

    from bertforge.api import Index
    from bertforge.embedding.index import VectorIndex

    corpus = _corpus(tmp_path / "c.jsonl", 30)
    plain = Index.build(str(model_dir), str(corpus), tmp_path / "plain", num_shards=2, chunk_size=4)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        index = Index.build(str(model_dir), str(corpus), tmp_path / "ray", ray=True, num_shards=2, chunk_size=4)
    finally:
        ray.shutdown()
    assert index.ids == plain.ids
    assert _tree(tmp_path / "ray" / "shards") == _tree(tmp_path / "plain" / "shards")
    np.testing.assert_array_equal(VectorIndex.load(tmp_path / "ray").index.reconstruct_n(0, 30),
                                  VectorIndex.load(tmp_path / "plain").index.reconstruct_n(0, 30))


@pytest.mark.slow
def test_torchrun_ranks_build_their_shards_and_rank_zero_merges(tmp_path, model_dir, encoder):
    import subprocess
    import sys

    from bertforge.embedding.index import VectorIndex
    from bertforge.retrieval.passages import read_passages

    corpus = _corpus(tmp_path / "c.jsonl", 25)
    out = tmp_path / "idx"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("WORLD_SIZE", "RANK", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_ID"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-port", "29731", "-m", "bertforge.cli", "index", "build", "--model",
                           str(model_dir), "--corpus", str(corpus), "--out", str(out), "--no-progress"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(d.name for d in (out / "shards").iterdir()) == ["shard-00000-of-00002", "shard-00001-of-00002"]
    ps = read_passages(corpus)
    plain = VectorIndex.build(None, encoder, ps.ids, ps.texts, progress=False)
    merged = VectorIndex.load(out)
    assert merged.ids == plain.ids
    np.testing.assert_allclose(merged.index.reconstruct_n(0, 25), plain.index.reconstruct_n(0, 25), atol=1e-6)
