"""The question encoder trained with the reader over a frozen index (`finetune --task open-qa --train-retriever`,
ORQA / REALM's open-QA fine-tuning): the marginal loss against hand-worked numbers, the question tower's gradient,
a falling loss, the index untouched, `ask` / `evaluate_open_qa` searching with the saved question encoder, exact
resume after a kill, a REALM run as the retriever, and the refusals. Tiny models built here (a 1-layer BERT)."""
from __future__ import annotations

import hashlib
import json
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

import bertforge
from bertforge import Encoder, preset
from bertforge.errors import BertforgeError
from bertforge.tokenization import Tokenizer

pytest.importorskip("faiss")

WORDS = ["apple", "river", "castle", "engine", "forest", "guitar", "harbor", "island", "jungle", "kettle", "lemon",
         "mirror", "needle", "ocean", "pepper", "rocket"]
PLACES = ["north", "south", "east", "west"]
PASSAGES = [{"id": f"p{i}", "title": w.capitalize(), "text": f"the {w} is kept in the {PLACES[i % 4]} room"}
            for i, w in enumerate(WORDS)]
QUESTIONS = [{"question": f"where is the {w} kept?", "answer": [PLACES[i % 4]]} for i, w in enumerate(WORDS)]
TEXTS = [p["title"] + " " + p["text"] for p in PASSAGES] + [q["question"] for q in QUESTIONS] + PLACES


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _encoder(path, seed, hidden=None):
    tok = Tokenizer.train(TEXTS, kind="wordpiece", vocab_size=120)
    overrides = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_hidden_layers=1)
    if hidden:
        overrides.update(hidden_size=hidden, intermediate_size=2 * hidden)
    torch.manual_seed(seed)
    Encoder(preset("bert-tiny", vocab_size=tok.vocab_size, **overrides)).save_pretrained(path, tokenizer=tok)
    return path


def _hashes(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def _train(world, out, **opts):
    tmp = world
    opts = {"k": 3, "max_steps": 8, "lr": 3e-3, "batch_size": 4, "max_seq_len": 32, **opts}
    return bertforge.finetune(str(opts.pop("model", tmp / "enc")), task="open-qa", train=str(tmp / "train.jsonl"),
                              eval=str(tmp / "train.jsonl"), out=str(out), index=str(opts.pop("index", tmp / "index")),
                              train_retriever=True, progress=False, device="cpu", precision="fp32", **opts)


def _losses(out):
    return [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny encoder (the index's model, the question encoder's and the reader's start), a dense and a bm25 index
    over 16 passages, the questions, and a reader trained with its question encoder (8 steps)."""
    tmp = tmp_path_factory.mktemp("orqa")
    _encoder(tmp / "enc", 0)
    (tmp / "passages.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PASSAGES))
    (tmp / "train.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    bertforge.Index.build(str(tmp / "enc"), str(tmp / "passages.jsonl"), str(tmp / "index"), pooling="cls")
    bertforge.Index.build(None, str(tmp / "passages.jsonl"), str(tmp / "bm25"), method="bm25")
    before = _hashes(tmp / "index")
    _train(tmp, tmp / "reader")
    assert _hashes(tmp / "index") == before  # the index is never rewritten
    return tmp


# ---- the loss -------------------------------------------------------------------------------------------------------
def test_retrieval_marginal_loss_hand_worked():
    """Passage 0: uniform logits over 3 tokens, answer span (0, 0): p(a|z0) = 1/9. Passage 1: P(start) = [1/4, 1/4,
    1/2], P(end) = [3/5, 1/5, 1/5], spans (0, 0) and (2, 2): p(a|z1) = 1/4. Retrieval scores [0, log 3]: p(z|x) =
    [1/4, 3/4]; the loss is -log(1/4 * 1/9 + 3/4 * 1/4), and d loss / d score = p(z|x) - p(z|x, a)."""
    from bertforge.retrieval.orqa import retrieval_marginal_loss
    from bertforge.retrieval.reader import marginal_loss

    start = torch.tensor([[[0.0, 0.0, 0.0], [0.0, 0.0, math.log(2)]]])
    end = torch.tensor([[[0.0, 0.0, 0.0], [math.log(3), 0.0, 0.0]]])
    spans = torch.tensor([[[0, 0, 0], [1, 0, 0], [1, 2, 2], [-1, -1, -1]]])
    scores = torch.tensor([[0.0, math.log(3)]], requires_grad=True)
    loss = retrieval_marginal_loss(start, end, scores, spans)
    joint = [1 / 4 * 1 / 9, 3 / 4 * 1 / 4]
    assert loss.item() == pytest.approx(-math.log(sum(joint)), abs=1e-6)
    loss.backward()
    posterior = [j / sum(joint) for j in joint]
    assert torch.allclose(scores.grad, torch.tensor([[1 / 4 - posterior[0], 3 / 4 - posterior[1]]]), atol=1e-6)
    # uniform retrieval scores: the reader's span loss + log k
    _, span = marginal_loss(start, end, torch.zeros(1, 2), spans)
    flat = retrieval_marginal_loss(start, end, torch.zeros(1, 2), spans)
    assert flat.item() == pytest.approx(span.item() + math.log(2), abs=1e-6)
    # a question without any answer span adds nothing to the mean
    two = retrieval_marginal_loss(start.repeat(2, 1, 1), end.repeat(2, 1, 1), scores.detach().repeat(2, 1),
                                  torch.cat([spans, torch.full_like(spans, -1)]))
    assert two.item() == pytest.approx(loss.item(), abs=1e-6)


def test_the_question_encoder_gets_a_gradient(world):
    """One step of the joint model: the loss reaches the question tower through p(z|x)."""
    from bertforge.api.orqa import open_joint
    from bertforge.model.folder import ModelFolder
    from bertforge.retrieval.orqa_train import OrqaKind
    from bertforge.retrieval.reader_train import OpenQAConfig, read_questions

    questions = read_questions(str(world / "train.jsonl"))
    joint = open_joint(str(world / "index"), None, 3)
    cfg = OpenQAConfig(model=world / "enc", out=world / "unused", train=None, k=3, max_seq_len=32)
    kind = OrqaKind(cfg, joint, ModelFolder.open(world / "enc").tokenizer(), questions)
    model, _ = kind.build(ModelFolder.open(world / "enc"))
    batch = kind.collate(0)([{"qidx": i} for i in range(8)])
    out = model(**batch)
    assert out["answer_recall"] > 0
    out["loss"].backward()
    grads = [p.grad for p in model.question.parameters() if p.grad is not None]
    assert grads and sum(g.abs().sum().item() for g in grads) > 0


# ---- training -------------------------------------------------------------------------------------------------------
def test_training_moves_the_question_encoder_and_the_loss_falls(world):
    from bertforge.model.checkpoint import read_tensors

    reader = world / "reader"
    losses = _losses(reader)
    assert len(losses) == 2 and losses[-1] < 0.5 * losses[0], losses  # logged every 4 steps (one epoch)
    before, after = read_tensors(world / "enc" / "model.safetensors"), \
        read_tensors(reader / "question" / "model.safetensors")
    shared = [k for k in before if k in after]
    assert shared and any(not torch.equal(before[k], after[k]) for k in shared)
    task = json.loads((reader / "config.json").read_text())["bertforge_task"]
    assert task["train_retriever"] is True and task["question"] == "question" and task["k"] == 3
    index_meta = json.loads((world / "index" / "meta.json").read_text())
    assert task["index_fingerprint"] == index_meta["fingerprint"]
    assert not (reader / "best").exists()


def _by_hand(world, questions, k):
    """Top k by the saved question tower's raw vectors against the index's stored vectors."""
    import faiss

    from bertforge.embedding.modules import SentenceEncoder

    tower = SentenceEncoder.from_pretrained(world / "reader" / "question")
    q = tower.encode(questions, normalize=False, progress=False)
    index = faiss.read_index(str(next((world / "index").glob("index*.faiss"))))
    p = index.reconstruct_n(0, index.ntotal)
    scores = q @ p.T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return [[(PASSAGES[i]["id"], float(scores[n, i])) for i in row] for n, row in enumerate(order)]


def test_ask_and_evaluate_search_with_the_saved_question_encoder(world):
    from bertforge.api.reading import Asker

    questions = [q["question"] for q in QUESTIONS[:5]]
    asker = Asker(str(world / "index"), str(world / "reader"), device="cpu")
    got = [[(h.id, h.score) for h in hs] for hs in asker.retrieve(questions, 3)]
    hand = _by_hand(world, questions, 3)
    for g, h in zip(got, hand):
        assert [i for i, _ in g] == [i for i, _ in h]
        assert np.allclose([s for _, s in g], [s for _, s in h], atol=1e-4)
    # the original retriever (the index's model) finds otherwise: its scores are the cosines the index was built for
    frozen = Asker(str(world / "index"), str(world / "reader"), retriever=str(world / "enc"), device="cpu")
    original = [[(h.id, h.score) for h in hs] for hs in frozen.retrieve(questions, 3)]
    assert original != got
    # ask's answers come from the passages the saved encoder retrieved
    answers = bertforge.ask(questions, index=str(world / "index"), reader=str(world / "reader"), k=3, device="cpu")
    for a, h in zip(answers, hand):
        assert {p["id"] for p in a.passages} <= {i for i, _ in h}

    # evaluate_open_qa with the reader: the same search as this searcher by hand
    class ByHand:
        def search(self, qs, k):
            from bertforge.retrieval.index import Hit

            texts = {p["id"]: p for p in PASSAGES}
            return [[Hit(r, s, i, texts[i]["title"], texts[i]["text"]) for r, (i, s) in enumerate(row, 1)]
                    for row in _by_hand(world, qs, k)]

    auto = bertforge.evaluate_open_qa(str(world / "index"), str(world / "train.jsonl"), reader=str(world / "reader"),
                                      top_k=(1, 3), device="cpu")
    manual = bertforge.evaluate_open_qa(ByHand(), str(world / "train.jsonl"), reader=str(world / "reader"),
                                        top_k=(1, 3), device="cpu")
    assert auto.to_dict(per_question=True) == manual.to_dict(per_question=True)


@pytest.mark.slow  # three short training runs (~25 s on a busy machine)
def test_resume_after_a_kill_is_exact(world, tmp_path, monkeypatch):
    """Checkpoints every 4 steps (one epoch of 16 questions); the run dies in step 7 and resumes from step 4."""
    from bertforge.retrieval.orqa import OrqaModel

    _train(world, tmp_path / "a")
    forward, calls = OrqaModel.forward, {"n": 0}

    def dies_in_step_7(self, *args, **kwargs):
        if self.training:
            calls["n"] += 1
            if calls["n"] == 7:
                raise RuntimeError("killed")
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(OrqaModel, "forward", dies_in_step_7)
    with pytest.raises(RuntimeError, match="killed"):
        _train(world, tmp_path / "b")
    monkeypatch.setattr(OrqaModel, "forward", forward)
    _train(world, tmp_path / "b", resume=True)
    assert _losses(tmp_path / "b") == _losses(tmp_path / "a")
    from bertforge.model.checkpoint import read_tensors

    for sub in ("question/model.safetensors", "model.safetensors"):
        a, b = read_tensors(tmp_path / "a" / sub), read_tensors(tmp_path / "b" / sub)
        assert all(torch.equal(a[k], b[k]) for k in a)


# ---- REALM ----------------------------------------------------------------------------------------------------------
def test_a_realm_run_is_the_retriever_and_the_reader(world, tmp_path):
    """A REALM run folder's layout (the reader at the top, retriever/ with projected towers, knowledge/): its query
    tower (with its projection) becomes the question encoder, its encoder starts the reader, the index is built by
    its document tower."""
    from bertforge.embedding.modules import SentenceEncoder
    from bertforge.model.folder import ModelFolder
    from bertforge.retrieval.realm_model import projected_tower
    from bertforge.retrieval.towers import BiEncoder, save_retriever

    run = _encoder(tmp_path / "realm", 1)
    folder = ModelFolder.open(run)
    towers = []
    for seed in (2, 3):
        torch.manual_seed(seed)
        towers.append(projected_tower(Encoder.from_pretrained(run), folder.tokenizer(), 16, 32))
    save_retriever(BiEncoder(*towers), run / "retriever")
    (run / "knowledge").mkdir()
    bertforge.Index.build(str(run / "retriever"), str(world / "passages.jsonl"), str(tmp_path / "index"))
    before = _hashes(tmp_path / "index")
    _train(world, tmp_path / "out", model=run, retriever=str(run), index=tmp_path / "index", max_steps=2)
    assert _hashes(tmp_path / "index") == before
    question = SentenceEncoder.from_pretrained(tmp_path / "out" / "question")
    assert question.dim == 16
    asker = bertforge.api.reading.Asker(str(tmp_path / "index"), str(tmp_path / "out"), device="cpu")
    assert len(asker.retrieve(["where is the apple kept?"], 3)[0]) == 3
    # an index built by another encoder (the plain one, 128 wide) is refused in one line
    with pytest.raises(BertforgeError, match="width|dimensions"):
        _train(world, tmp_path / "x", model=run, retriever=str(run), max_steps=1)


def test_refusals(world, tmp_path):
    with pytest.raises(BertforgeError, match="BM25.*no question encoder"):
        _train(world, tmp_path / "a", index=world / "bm25")
    narrow = _encoder(tmp_path / "narrow", 0, hidden=64)
    with pytest.raises(BertforgeError, match="64|128"):
        _train(world, tmp_path / "b", retriever=str(narrow))
    with pytest.raises(BertforgeError, match="k: 40 passages"):
        _train(world, tmp_path / "c", k=40)


def test_the_command_line_trains_the_retriever_with_k_5(world, tmp_path, capsys):
    from bertforge.cli import main

    base = ["finetune", "--task", "open-qa", "--model", str(world / "enc"), "--train", str(world / "train.jsonl"),
            "--max-steps", "1", "--batch-size", "2", "--max-seq-len", "32", "--device", "cpu", "--precision", "fp32",
            "--no-progress", "--train-retriever"]
    assert main([*base, "--index", str(world / "bm25"), "--out", str(tmp_path / "a")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no question encoder to train" in err[0]
    assert main([*base, "--index", str(world / "index"), "--out", str(tmp_path / "b")]) == 0
    task = json.loads((tmp_path / "b" / "config.json").read_text())["bertforge_task"]
    assert task["k"] == 5 and task["train_retriever"] is True and (tmp_path / "b" / "question").is_dir()


REALM_FACTS = [("Quenland", "Zorblat"), ("Pardonia", "Kestrel"), ("Morvania", "Tashkel"), ("Eldoria", "Fennick"),
               ("Gravia", "Hollin"), ("Ostrava", "Dunmere"), ("Lutheria", "Carrow"), ("Brastia", "Welling")]


@pytest.mark.slow  # a 2-step REALM pretraining, an index, a 2-step fine-tune and an evaluation (~20 s)
def test_realm_pretrain_then_open_qa_on_the_command_line(tmp_path, capsys):
    """The documented commands: pretrain --recipe realm -> index build --model RUN/retriever -> finetune --task
    open-qa --model RUN --retriever RUN --train-retriever -> evaluate --task open-qa --reader OUT."""
    from bertforge.cli import main
    from bertforge.embedding.modules import SentenceEncoder

    knowledge, corpus, questions = tmp_path / "knowledge.jsonl", tmp_path / "corpus.txt", tmp_path / "q.jsonl"
    knowledge.write_text("".join(json.dumps({"id": f"p{i}", "title": c, "text": f"{c} is a small country. Its "
                                             f"capital city is {cap}."}) + "\n" for i, (c, cap) in
                                 enumerate(REALM_FACTS)))
    corpus.write_text("\n\n".join(f"The capital city of {c} is {cap}." for c, cap in REALM_FACTS * 4) + "\n")
    questions.write_text("".join(json.dumps({"question": f"What is the capital city of {c}?", "answer": [cap]})
                                 + "\n" for c, cap in REALM_FACTS))
    run = tmp_path / "realm"
    bertforge.pretrain([str(corpus)], out=run, recipe="realm", knowledge=knowledge, size="bert-tiny", seq_len=64,
                       batch_size=4, vocab_size=200, lr=3e-3, progress=False, threads=1, refresh_every=3,
                       realm_k=2, projection_dim=16, seed=0, max_steps=2)
    assert (run / "retriever" / "retriever.json").is_file() and (run / "knowledge").is_dir()
    assert main(["index", "build", "--model", str(run / "retriever"), "--corpus", str(knowledge),
                 "--out", str(tmp_path / "index"), "--no-progress"]) == 0
    before = _hashes(tmp_path / "index")
    assert main(["finetune", "--task", "open-qa", "--model", str(run), "--retriever", str(run), "--index",
                 str(tmp_path / "index"), "--train-retriever", "-k", "3", "--train", str(questions), "--out",
                 str(tmp_path / "reader"), "--max-steps", "2", "--batch-size", "4", "--max-seq-len", "48",
                 "--device", "cpu", "--precision", "fp32", "--no-progress"]) == 0
    assert _hashes(tmp_path / "index") == before
    assert SentenceEncoder.from_pretrained(tmp_path / "reader" / "question").dim == 16  # the query tower's projection
    capsys.readouterr()
    assert main(["evaluate", "--task", "open-qa", "--index", str(tmp_path / "index"), "--questions", str(questions),
                 "--reader", str(tmp_path / "reader"), "--top-k", "1,3", "--device", "cpu", "--no-progress"]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert "exact_match" in json.dumps(scored)
