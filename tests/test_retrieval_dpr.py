"""Dense retrievers: DPR checkpoints read and written (parity with transformers' DPRQuestionEncoder /
DPRContextEncoder), the towers in sentence-transformers, DPR's loss by hand, training, BM25 hard negatives, the
Inverse Cloze Task (ORQA) and `pretrain --recipe ict`."""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch

from bertforge.config import ModelConfig
from bertforge.embedding import SentenceEncoder
from bertforge.model import Encoder
from bertforge.model.checkpoint import read_tensors, save_pretrained
from bertforge.model.folder import ModelFolder
from bertforge.retrieval.dpr import RetrievalExample, bm25_top, dpr_loss, mine_hard_negatives, read_training
from bertforge.retrieval.ict import ICTDataset, ict_example, make_blocks
from bertforge.retrieval.passages import read_passages
from bertforge.retrieval.towers import (BiEncoder, export_dpr_towers, load_retriever, load_towers,
                                        save_retriever)
from bertforge.tokenization import Tokenizer

transformers = pytest.importorskip("transformers")

WORDS = ["apple", "river", "castle", "engine", "forest", "guitar", "harbor", "island", "jungle", "kettle", "lemon",
         "mirror", "needle", "ocean", "pepper", "rocket"]
QUESTIONS = [f"tell me about the {w}" for w in WORDS]
PASSAGES = [f"{w} {w} is a thing" for w in WORDS]
TEXTS = ["the cat sat on the mat", "paris is the capital of france", "who wrote the play hamlet?"]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.train(QUESTIONS + PASSAGES + TEXTS, kind="wordpiece", vocab_size=100)


def tiny(tok: Tokenizer, **overrides) -> dict:
    return dict(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=64, max_position_embeddings=64, **overrides)


@pytest.fixture(scope="module")
def encoder_dir(tok, tmp_path_factory):
    """A tiny random BERT without dropout (so a few steps move its vectors), saved as an HF folder."""
    torch.manual_seed(0)
    cfg = ModelConfig(**tiny(tok, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    path = tmp_path_factory.mktemp("bert")
    save_pretrained(Encoder(cfg), path, cfg, tokenizer=tok)
    return path


def dpr_folder(tok, path, cls, projection_dim: int):
    torch.manual_seed(1)
    model = cls(transformers.DPRConfig(**tiny(tok), projection_dim=projection_dim)).eval()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model


def pooler_output(model, tok, texts) -> np.ndarray:
    features = tok(texts, padding="longest", return_tensors="pt")
    with torch.no_grad():
        return model(input_ids=features["input_ids"], attention_mask=features["attention_mask"],
                     token_type_ids=features["token_type_ids"]).pooler_output.numpy()


# ---- DPR checkpoints, both ways ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind, projection_dim", [("DPRQuestionEncoder", 0), ("DPRContextEncoder", 0),
                                                  ("DPRQuestionEncoder", 16), ("DPRContextEncoder", 8)])
def test_dpr_folder_read_by_bertforge(tok, tmp_path, kind, projection_dim):
    model = dpr_folder(tok, tmp_path, getattr(transformers, kind), projection_dim)
    ref = pooler_output(model, tok, TEXTS)
    encoder = SentenceEncoder.from_pretrained(tmp_path)  # what `embed --model` opens
    ours = encoder.encode(TEXTS, progress=False)
    assert ours.shape == ref.shape == (3, projection_dim or 32)
    np.testing.assert_allclose(ours, ref, atol=1e-5)
    # every verb that opens an encoder folder reads the network: the same last layer as transformers' BertModel
    folder = ModelFolder.open(tmp_path)
    assert folder.holds == "encoder" and folder.model_config.extra.get("projection_dim") == projection_dim
    features = tok(TEXTS, padding="longest", return_tensors="pt")
    with torch.no_grad():
        body = getattr(model, "question_encoder", None) or model.ctx_encoder
        want = body.bert_model(**features).last_hidden_state
        got = Encoder.from_pretrained(folder).eval()(**features).last_hidden_state
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_embed_command_writes_pooler_output(tok, tmp_path):
    from bertforge.cli import main

    model = dpr_folder(tok, tmp_path / "ctx", transformers.DPRContextEncoder, 16)
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    assert main(["embed", "--model", str(tmp_path / "ctx"), "--input", str(inp), "--out",
                 str(tmp_path / "v.npy"), "--no-progress"]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "v.npy"), pooler_output(model, tok, TEXTS), atol=1e-5)


def test_bertforge_towers_read_by_transformers(tok, encoder_dir, tmp_path):
    """Separate towers, the passage one with a projection, saved by bertforge: DPRQuestionEncoder /
    DPRContextEncoder load them with no missing or unexpected tensors and give the same vectors."""
    from bertforge.embedding import Dense

    model = load_towers(encoder_dir, separate=True)
    torch.manual_seed(2)
    passage = SentenceEncoder(*model.passage, Dense(32, 12, activation="Identity"))
    model = BiEncoder(model.question, passage).eval()
    save_retriever(model, tmp_path / "r")
    for name, cls, tower in (("question_encoder", transformers.DPRQuestionEncoder, model.question),
                             ("ctx_encoder", transformers.DPRContextEncoder, model.passage)):
        hf, info = cls.from_pretrained(tmp_path / "r" / "transformers" / name, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"], info
        np.testing.assert_allclose(tower.encode(TEXTS, progress=False), pooler_output(hf.eval(), tok, TEXTS),
                                   atol=1e-5)
        assert json.loads((tmp_path / "r" / "transformers" / name / "config.json").read_text())["architectures"] \
            == [cls.__name__]
    # `retriever export-dpr` writes the same folders from the retriever folder
    from bertforge.cli import main
    assert main(["retriever", "export-dpr", "--model", str(tmp_path / "r"), "--out", str(tmp_path / "x")]) == 0
    for name in ("question_encoder", "ctx_encoder"):
        a, b = (read_tensors(root / name / "model.safetensors") for root in (tmp_path / "r" / "transformers",
                                                                             tmp_path / "x"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # and back: the exported folders read by bertforge give the towers' vectors again
    again = SentenceEncoder.from_pretrained(tmp_path / "r" / "transformers" / "ctx_encoder")
    np.testing.assert_allclose(again.encode(TEXTS, progress=False), model.passage.encode(TEXTS, progress=False),
                               atol=1e-5)


def test_towers_load_in_sentence_transformers(tok, encoder_dir, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    model = load_towers(encoder_dir).eval()
    save_retriever(model, tmp_path / "r")
    info = json.loads((tmp_path / "r" / "retriever.json").read_text())
    assert info["shared"] is True and info["pooling"] == "cls"
    modules = json.loads((tmp_path / "r" / "question" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling"]
    pooling = json.loads((tmp_path / "r" / "question" / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_cls_token"] and not pooling["pooling_mode_mean_tokens"]
    for side in ("question", "passage"):
        ref = st.SentenceTransformer(str(tmp_path / "r" / side), device="cpu")
        np.testing.assert_allclose(ref.encode(TEXTS, convert_to_numpy=True),
                                   model.question.encode(TEXTS, progress=False), atol=1e-5)
        assert ref.similarity_fn_name == "dot"


# ---- the loss, by hand ---------------------------------------------------------------------------------------------
def test_loss_hand_worked():
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    p = torch.tensor([[1.0, 0.0], [0.0, 2.0]])  # scores [[1, 0], [0, 2]]
    loss, acc = dpr_loss(q, p, torch.tensor([0, 1]))
    want = (math.log(1 + math.exp(-1)) + math.log(1 + math.exp(-2))) / 2  # -log e^1/(e^1+e^0), -log e^2/(e^0+e^2)
    assert loss.item() == pytest.approx(want, abs=1e-6) and acc.item() == 1.0
    # a hard negative (third passage) joins every question's softmax
    p3 = torch.cat([p, torch.tensor([[3.0, 0.0]])])  # scores [[1, 0, 3], [0, 2, 0]]
    loss, acc = dpr_loss(q, p3, torch.tensor([0, 1]))
    want = (-math.log(math.e / (math.e + 1 + math.exp(3))) - math.log(math.exp(2) / (1 + math.exp(2) + 1))) / 2
    assert loss.item() == pytest.approx(want, abs=1e-6) and acc.item() == 0.5
    # another copy of question 0's positive is no negative for it
    same = torch.tensor([[False, True], [False, False]])
    loss, _ = dpr_loss(q, p, torch.tensor([0, 1]), same)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-2)) / 2, abs=1e-6)


# ---- hard negatives ------------------------------------------------------------------------------------------------
def test_hard_negatives_are_bm25s_top_non_positive_passages():
    corpus = ["the eiffel tower is in paris france", "paris is the capital of france",
              "france borders spain and italy", "the louvre museum in paris holds art",
              "berlin is the capital of germany", "tokyo is a large city"]
    ex = RetrievalExample("what is the capital of france", corpus[1], answers=["Paris"])
    mine_hard_negatives([ex], 2, corpus)
    ranking = bm25_top(corpus, [ex.question], len(corpus))[0]
    assert ranking[0] == 1  # the positive is BM25's best, and is skipped
    want = [corpus[i] for i in ranking if i != 1 and "paris" not in corpus[i]][:2]
    assert ex.negatives == want and corpus[4] in want  # passages naming the answer are no negatives
    import bm25s  # the ranking is bm25s' own
    index = bm25s.BM25()
    index.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)
    found, _ = index.retrieve(bm25s.tokenize([ex.question], stopwords="en", show_progress=False), k=len(corpus),
                              show_progress=False)
    assert ranking == found[0].tolist()


def test_training_layouts(tmp_path):
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in (
        {"id": "a", "title": "Hamlet", "text": "a play by Shakespeare"}, {"id": "b", "title": "", "text": "x y"})))
    passages = read_passages(tmp_path / "p.jsonl")
    (tmp_path / "t.jsonl").write_text(json.dumps({"question": "who wrote hamlet", "positive": "a",
                                                  "negatives": ["b", "some text"], "answers": ["Shakespeare"]}))
    [ex] = read_training(tmp_path / "t.jsonl", passages)
    assert (ex.positive, ex.negatives, ex.answers) == ("Hamlet. a play by Shakespeare", ["x y", "some text"],
                                                       ["Shakespeare"])
    (tmp_path / "dpr.json").write_text(json.dumps([
        {"question": "q1", "answers": ["A"], "positive_ctxs": [{"title": "T", "text": "pos"}],
         "negative_ctxs": [{"title": "", "text": "neg"}], "hard_negative_ctxs": [{"title": "H", "text": "hard"}]},
        {"question": "q2", "answers": [], "positive_ctxs": [], "negative_ctxs": []}]))
    [ex] = read_training(tmp_path / "dpr.json")  # a question with no positive is skipped, as DPR does
    assert (ex.question, ex.positive, ex.negatives) == ("q1", "T. pos", ["H. hard", "neg"])
    (tmp_path / "squad.json").write_text(json.dumps({"data": [{"title": "Art", "paragraphs": [
        {"context": "Paint is old.", "qas": [{"question": "Is paint old?", "answers": [{"text": "old"}]},
                                             {"question": "What?", "answers": []}]}]}]}))
    examples = read_training(tmp_path / "squad.json")
    assert [(e.question, e.positive, e.answers) for e in examples] == [
        ("Is paint old?", "Art. Paint is old.", ["old"]), ("What?", "Art. Paint is old.", [])]


# ---- training ------------------------------------------------------------------------------------------------------
def top1(question: SentenceEncoder, passage: SentenceEncoder) -> float:
    q = question.encode(QUESTIONS, progress=False)
    p = passage.encode(PASSAGES, progress=False)
    return float(((q @ p.T).argmax(1) == np.arange(len(QUESTIONS))).mean())


def test_training_lowers_the_loss_and_raises_top1(encoder_dir, tmp_path):
    import bertforge

    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps({"question": q, "positive": p}) for q, p in zip(QUESTIONS, PASSAGES)))
    # mean pooling: a random tiny encoder's [CLS] says almost nothing about its input until trained for long
    before = top1(*load_retriever_like(encoder_dir))
    result = bertforge.train_retriever(encoder_dir, data, out=tmp_path / "r", pooling="mean", hard_negatives=1,
                                       epochs=12, batch_size=8, lr=1e-3, progress=False)
    losses = [h["loss"] for h in result.history if "loss" in h]
    assert result.record["last_loss"] < result.record["first_loss"] and losses[-1] < 0.5 * losses[0]
    assert result.record["with_hard_negatives"] == len(QUESTIONS)  # mined for every question
    after = top1(*load_retriever(tmp_path / "r"))
    assert after > before and after >= 0.9, (before, after)


def load_retriever_like(encoder_dir):
    model = load_towers(encoder_dir, pooling="mean").eval()
    return model.question, model.passage_tower


def test_resume_is_exact(encoder_dir, tmp_path):
    import bertforge

    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps({"question": q, "positive": p}) for q, p in zip(QUESTIONS, PASSAGES)))
    opts = dict(separate_encoders=True, hard_negatives=0, batch_size=8, lr=1e-3, progress=False, save_every=2)
    whole = bertforge.train_retriever(encoder_dir, data, out=tmp_path / "a", max_steps=4, **opts)
    # the same run stopped after its checkpoint at step 2, then resumed
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "step-4")
    (tmp_path / "b" / "checkpoints" / "latest").write_text("step-2\n")
    resumed = bertforge.train_retriever(encoder_dir, data, out=tmp_path / "b", max_steps=4, resume=True, **opts)
    assert resumed.record["steps"] == whole.record["steps"] == 4
    assert (whole.record["segments"], resumed.record["segments"]) == (1, 2)  # it did continue from step 2
    for side in ("question", "passage"):
        a, b = (read_tensors(tmp_path / run / side / "model.safetensors") for run in ("a", "b"))
        assert all(torch.equal(a[k], b[k]) for k in a)


# ---- the Inverse Cloze Task ----------------------------------------------------------------------------------------
def test_ict_examples(tok):
    block = tuple(f"Sentence number {w} is here." for w in WORDS[:5])
    rng = np.random.default_rng(0)
    draws = [ict_example(block, rng) for _ in range(4000)]
    removed = [ex.question not in ex.positive for ex in draws]
    assert all(ex.question in block for ex in draws)
    assert abs(np.mean(removed) - 0.9) < 0.015  # ORQA's 90%, over 4000 draws (sd 0.005)
    for ex, gone in zip(draws[:50], removed[:50]):
        rest = [s for s in block if s != ex.question or not gone]
        assert ex.positive == " ".join(rest)
    # every epoch draws anew, the same (seed, epoch, block) always the same
    data = ICTDataset([block] * 8, seed=3)
    first = [data[k].question for k in range(8)]
    data.set_epoch(1)
    assert [data[k].question for k in range(8)] != first
    data.set_epoch(0)
    assert [data[k].question for k in range(8)] == first
    doc = ["One two three.", "Four five six.", "Seven eight nine."]
    docs = [" ".join(doc), "Alone here."]  # one sentence has no block to be found in
    assert make_blocks(docs, tok, 1000) == [tuple(doc)]
    two = sum(len(ids) - 2 for ids in tok(doc[:2], padding=False, return_tensors=None)["input_ids"])
    assert make_blocks(docs, tok, two) == [tuple(doc[:2])]  # the third sentence alone is no block


def test_pretrain_ict_then_retriever_train(tok, encoder_dir, tmp_path):
    """`pretrain --recipe ict` from a retriever folder: the loss falls; its output continues with DPR's objective."""
    from bertforge.cli import main

    rng = np.random.default_rng(0)
    docs = [" ".join(f"The {w} is {rng.choice(WORDS)}." if i == 0 else f"A {w} is a thing number {i}."
                     for i in range(4)) for w in WORDS for _ in range(2)]
    (tmp_path / "corpus.txt").write_text("\n\n".join(docs) + "\n")
    start = load_towers(encoder_dir, pooling="mean")
    save_retriever(start, tmp_path / "start", dpr=False)
    assert main(["pretrain", "--recipe", "ict", "--corpus", str(tmp_path / "corpus.txt"), "--init-from",
                 str(tmp_path / "start"), "--out", str(tmp_path / "ict"), "--max-steps", "30", "--batch-size", "8",
                 "--seq-len", "48", "--lr", "1e-3", "--log-every", "5", "--no-progress"]) == 0
    record = json.loads((tmp_path / "ict" / "eval_results.json").read_text())
    assert record["recipe"]["name"] == "ict" and record["steps"] == 30
    assert record["train"]["last_loss"] < 0.8 * record["train"]["first_loss"]
    question, passage = load_retriever(tmp_path / "ict")
    assert question is passage  # one shared tower
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps({"question": q, "positive": p}) for q, p in zip(QUESTIONS, PASSAGES)))
    assert main(["retriever", "train", "--model", str(tmp_path / "ict"), "--train", str(data), "--out",
                 str(tmp_path / "dpr"), "--max-steps", "2", "--batch-size", "8", "--hard-negatives", "0",
                 "--no-progress"]) == 0
    assert (tmp_path / "dpr" / "question" / "modules.json").is_file()


def test_export_dpr_refuses_mean_pooling(encoder_dir, tmp_path):
    from bertforge.errors import BertforgeError

    model = load_towers(encoder_dir, pooling="mean")
    with pytest.raises(BertforgeError, match=r"\[CLS\]"):
        export_dpr_towers(model.question, model.passage_tower, tmp_path / "x")
