"""`Index` over a two-tower retriever folder: passages embedded by the passage tower, queries by the question tower,
ranked by raw dot product (as DPR trains and scores them); saved, reloaded, checked against other models."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertforge.config import ModelConfig
from bertforge.errors import BertforgeError
from bertforge.model import Encoder
from bertforge.model.checkpoint import save_pretrained
from bertforge.retrieval.towers import BiEncoder, load_towers, save_retriever
from bertforge.tokenization import Tokenizer

pytest.importorskip("faiss")

WORDS = ["apple", "river", "castle", "engine", "forest", "guitar", "harbor", "island"]
QUESTIONS = [f"tell me about the {w}" for w in WORDS]
PASSAGES = [f"{w} {w} is a thing" for w in WORDS]
IDS = [f"p{i}" for i in range(len(PASSAGES))]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny encoder folder and a retriever folder with two different towers made from it."""
    root = tmp_path_factory.mktemp("towers")
    tok = Tokenizer.train(QUESTIONS + PASSAGES, kind="wordpiece", vocab_size=80)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)
    save_pretrained(Encoder(cfg), root / "bert", cfg, tokenizer=tok)
    towers = load_towers(root / "bert", separate=True)
    with torch.no_grad():  # the passage tower differs from the question tower
        for p in towers.passage.parameters():
            p.add_(0.05 * torch.randn_like(p))
    save_retriever(BiEncoder(towers.question, towers.passage).eval(), root / "r", dpr=False)
    return root


def by_hand(root, k):
    """Top k (id, dot product) per question from the towers as saved."""
    from bertforge.embedding import SentenceEncoder

    q = SentenceEncoder.from_pretrained(root / "r" / "question").encode(QUESTIONS, progress=False)
    p = SentenceEncoder.from_pretrained(root / "r" / "passage").encode(PASSAGES, progress=False)
    scores = q @ p.T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return [[(IDS[j], float(scores[i, j])) for j in row] for i, row in enumerate(order)]


def as_pairs(hits):
    return [[(h.id, h.score) for h in row] for row in hits]


def check(found, expected):
    for got_row, want_row in zip(found, expected):
        assert [i for i, _ in got_row] == [i for i, _ in want_row]
        np.testing.assert_allclose([s for _, s in got_row], [s for _, s in want_row], rtol=1e-5, atol=1e-5)


def test_two_tower_index_ranks_by_question_passage_dot_product(folders, tmp_path):
    import bertforge

    expected = by_hand(folders, 3)
    index = bertforge.Index.build(folders / "r", PASSAGES, tmp_path / "ix", ids=IDS, device="cpu")
    check(as_pairs(index.search(QUESTIONS, k=3)), expected)
    meta = json.loads((tmp_path / "ix" / "meta.json").read_text())
    assert meta["normalized"] is False and meta["retriever"]["similarity"] == "dot"
    # reopened: with the towers it records, and with the folder given
    check(as_pairs(bertforge.Index.load(tmp_path / "ix", device="cpu").search(QUESTIONS, k=3)), expected)
    check(as_pairs(bertforge.Index.load(tmp_path / "ix", folders / "r", device="cpu").search(QUESTIONS, k=3)),
          expected)
    # the towers really differ: searching with the passage tower for questions would rank otherwise
    assert json.loads((folders / "r" / "retriever.json").read_text())["shared"] is False
    with pytest.raises(BertforgeError, match="retriever folder"):
        bertforge.Index.load(tmp_path / "ix", folders / "bert")


def test_two_tower_index_refuses_another_question_tower(folders, tmp_path):
    import shutil

    import bertforge

    bertforge.Index.build(folders / "r", PASSAGES, tmp_path / "ix", ids=IDS, device="cpu")
    other = tmp_path / "other"
    shutil.copytree(folders / "r", other)
    shutil.rmtree(other / "question")
    shutil.copytree(folders / "r" / "passage", other / "question")  # same passage tower, another question tower
    with pytest.raises(BertforgeError, match="question tower fingerprint"):
        bertforge.Index.load(tmp_path / "ix", other, device="cpu").search(QUESTIONS[:1], k=2)


def test_single_model_index_still_cosine(folders):
    import bertforge
    from bertforge.embedding import SentenceEncoder

    index = bertforge.Index.build(folders / "r" / "passage", PASSAGES, None, ids=IDS, device="cpu")
    enc = SentenceEncoder.from_pretrained(folders / "r" / "passage")
    q = enc.encode(QUESTIONS[:2], normalize=True, progress=False)
    p = enc.encode(PASSAGES, normalize=True, progress=False)
    hits = index.search(QUESTIONS[:2], k=1)
    for i, row in enumerate(hits):
        j = int(np.argmax(q[i] @ p.T))
        assert row[0].id == IDS[j] and row[0].score == pytest.approx(float(q[i] @ p[j]), abs=1e-5)


def test_two_tower_index_is_not_sharded(folders, tmp_path):
    import bertforge

    with pytest.raises(BertforgeError, match="not in shards"):
        bertforge.Index.build(folders / "r", PASSAGES, tmp_path / "ix", ids=IDS, num_shards=2, device="cpu")
