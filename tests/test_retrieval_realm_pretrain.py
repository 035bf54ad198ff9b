"""REALM pre-training (`pretrain --recipe realm`): the step's candidates (never the source passage, always the null
document), the document tower's gradient, the index refresh, the loss falling on a corpus whose knowledge holds the
masked entities, exact resume across a kill and a refresh, and the refused refresh interval."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from bertforge.config import ModelConfig
from bertforge.errors import BertforgeError
from bertforge.pretraining.objectives import build_objective
from bertforge.retrieval.passages import Passages, Passage
from bertforge.retrieval.realm_data import RealmCollator, RealmSentences
from bertforge.retrieval.realm_knowledge import KnowledgeIndex
from bertforge.retrieval.realm_model import RealmModel, projected_tower
from bertforge.tokenization import Tokenizer

pytest.importorskip("faiss")

# each country's capital and river: the knowledge passages hold the entities the training sentences mask
FACTS = [("Quenland", "Zorblat", "Vimmer"), ("Pardonia", "Kestrel", "Ulwater"), ("Morvania", "Tashkel", "Brenn"),
         ("Eldoria", "Fennick", "Solent"), ("Gravia", "Hollin", "Marrow"), ("Ostrava", "Dunmere", "Keld"),
         ("Lutheria", "Carrow", "Isel"), ("Brastia", "Welling", "Tarn")]
PASSAGES = [f"{c} is a small country. Its capital city is {cap}. The river {r} flows through {c}."
            for c, cap, r in FACTS]
SENTENCES = [f"The capital city of {c} is {cap}, near the river {r}." for c, cap, r in FACTS]


def write_corpus(tmp_path):
    knowledge, corpus = tmp_path / "knowledge.jsonl", tmp_path / "corpus.txt"
    if knowledge.is_file():  # a resumed run must find its data unchanged
        return knowledge, corpus
    knowledge.write_text("\n".join(json.dumps({"id": f"p{i}", "title": c, "text": t})
                                   for i, ((c, _, _), t) in enumerate(zip(FACTS, PASSAGES))) + "\n")
    corpus.write_text("\n\n".join(SENTENCES * 4) + "\n")
    return knowledge, corpus


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models: one thread is fastest, and far faster than two on a loaded machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.train(PASSAGES + SENTENCES, kind="wordpiece", vocab_size=200)


def passages() -> Passages:
    out = Passages()
    for i, ((c, _, _), t) in enumerate(zip(FACTS, PASSAGES)):
        out.append(Passage(f"p{i}", c, t))
    return out


def tiny_model(tok, k=3, refresh_every=2) -> tuple[RealmModel, RealmSentences, RealmCollator]:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=128)
    reader = build_objective("mlm", cfg)
    query = projected_tower(copy.deepcopy(reader.bert), tok, 16, 64)
    document = projected_tower(copy.deepcopy(reader.bert), tok, 16, 64)
    knowledge = KnowledgeIndex(passages())
    # the training sentences are the knowledge passages' own: each has a source passage to exclude
    sentences = RealmSentences(PASSAGES, knowledge.sources_of)
    model = RealmModel(reader, query, document, knowledge, tok, k=k, refresh_every=refresh_every, seq_len=96)
    return model, sentences, RealmCollator(tok, tok.mask_token, 32)


def test_candidates_exclude_the_source_and_include_the_null_document(tok):
    model, sentences, collate = tiny_model(tok)
    model.refresh()
    batch = collate([sentences[i] for i in range(len(sentences))])
    assert all(len(e) == 1 for e in batch["exclude"])  # every sentence comes from one passage
    q = model._embed(model.query, batch["query_texts"])
    rows = model.candidates(q, batch["exclude"])
    for row, exclude in zip(rows, batch["exclude"]):
        assert row[0] == -1 and row.count(-1) == 1            # the null document, always, once
        assert len(row) == 1 + model.k and len(set(row)) == len(row)
        assert not set(row) & set(exclude)                    # never the sentence's own passage
    # and the source would have been found otherwise: the excluded passage ranks among the top for some sentence
    unfiltered = model.knowledge.search(q.detach().numpy(), len(model.knowledge), [set()] * len(rows))
    assert any(exclude[0] in hits[:model.k + 1] for hits, exclude in zip(unfiltered, batch["exclude"]))


def test_masked_span_is_a_salient_entity_and_the_query_hides_it(tok):
    _, sentences, collate = tiny_model(tok)
    batch = collate([sentences[0]])
    masked = batch["mlm_labels"][0].ne(-100)
    assert masked.any() and (batch["input_ids"][0][masked] == tok.mask_token_id).all()
    hidden = tok.decode(batch["mlm_labels"][0][masked].tolist()).replace(" ", "").lower()
    assert hidden in PASSAGES[0].replace(" ", "").lower()
    assert tok.mask_token in batch["query_texts"][0]


def test_a_step_gives_the_document_tower_and_the_query_tower_a_gradient(tok):
    model, sentences, collate = tiny_model(tok)
    model.train()
    out = model(**collate([sentences[i] for i in range(4)]))
    assert torch.isfinite(out["loss"]) and 0.0 <= float(out["accuracy"]) <= 1.0
    assert set(out) >= {"loss", "accuracy", "retrieval_utility", "top_beats_null"}
    out["loss"].backward()
    for tower in (model.document, model.query, model.reader):
        grads = [p.grad for p in tower.parameters() if p.grad is not None]
        assert grads and any(float(g.abs().sum()) > 0 for g in grads)


def test_refresh_re_embeds_the_corpus_with_the_current_tower(tok):
    model, sentences, collate = tiny_model(tok, refresh_every=2)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = collate([sentences[i] for i in range(4)])
    for _ in range(2):
        opt.zero_grad()
        model(**batch)["loss"].backward()
        opt.step()
    before = model.knowledge.vectors.copy()
    assert model.knowledge.built_at == 0 and model.refreshes == 1
    model(**batch)  # the third step starts with the refresh (2 steps done)
    assert model.knowledge.built_at == 2 and model.refreshes == 2
    assert not (model.knowledge.vectors == before).all()
    with torch.no_grad():  # the refreshed vectors are the current document tower's
        model.document.eval()
        now = model._embed(model.document, model.knowledge.texts).numpy()
    torch.testing.assert_close(torch.from_numpy(model.knowledge.vectors), torch.from_numpy(now), atol=1e-5, rtol=0)


def test_refresh_interval_of_zero_is_refused(tok, tmp_path):
    import bertforge

    with pytest.raises(BertforgeError, match="refresh"):
        tiny_model(tok, refresh_every=0)
    knowledge, corpus = write_corpus(tmp_path)
    with pytest.raises(BertforgeError, match="--refresh-every") as err:
        bertforge.pretrain([str(corpus)], recipe="realm", knowledge=knowledge, refresh_every=0, max_steps=1,
                           out=tmp_path / "o", progress=False)
    assert "\n" not in str(err.value)


def test_cli_refuses_refresh_every_zero(tmp_path, capsys):
    from bertforge.cli import main

    rc = main(["pretrain", "--recipe", "realm", "--knowledge", "k.jsonl", "--refresh-every", "0", "--max-steps", "1",
               "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc != 0 and "--refresh-every must be at least 1" in err and len(err.strip().splitlines()) == 1


def run_realm(tmp_path, out, **kw):
    import bertforge

    tmp_path.mkdir(parents=True, exist_ok=True)
    knowledge, corpus = write_corpus(tmp_path)
    opts = dict(recipe="realm", knowledge=knowledge, size="bert-tiny", seq_len=64, batch_size=4, vocab_size=200,
                lr=3e-3, progress=False, log_every=1, threads=1, refresh_every=3, realm_k=2, projection_dim=16, seed=0)
    opts.update(kw)
    return bertforge.pretrain([str(corpus)], out=tmp_path / out, **opts)


def test_loss_falls_when_the_knowledge_holds_the_masked_entities(tok):
    model, sentences, collate = tiny_model(tok, k=2, refresh_every=4)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batch = collate([sentences[i] for i in range(0, len(sentences), max(1, len(sentences) // 8))][:8])
    losses = []
    for _ in range(10):
        opt.zero_grad()
        loss = model(**batch)["loss"]
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3
    assert model.knowledge.built_at == 8  # refreshed before steps 5 and 9 (with the towers as trained so far)


def test_pretrain_realm_loss_falls_and_writes_reader_retriever_and_index(tmp_path):
    result = run_realm(tmp_path, "run", max_steps=16)
    train = [h for h in result.history if h.get("split") == "train"]
    first, last = sum(h["loss"] for h in train[:3]) / 3, sum(h["loss"] for h in train[-3:]) / 3
    assert last < first
    out = tmp_path / "run"
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert (out / "retriever" / "retriever.json").is_file()
    meta = json.loads((out / "knowledge" / "knowledge.json").read_text())
    assert meta["passages"] == len(PASSAGES) and meta["dim"] == 16 and meta["step"] == 15  # refreshed at 3, 6, ... 15
    assert result.record["index_step"] == 15


def test_resume_across_a_kill_and_a_refresh_gives_the_same_metrics(tmp_path, monkeypatch):
    """Refresh every 3 steps, checkpoints at 4 and 8. The run dies in step 7, after the refresh at step 6 (which
    the step-4 checkpoint does not hold, and OUT/knowledge/ already does); resumed, it redoes steps 5-8 and that
    refresh, and writes the uninterrupted run's metrics.jsonl."""
    from bertforge.retrieval.realm_model import RealmModel

    whole = run_realm(tmp_path / "a", "out", max_steps=8, save_every=4)
    forward = RealmModel.forward

    def dies_in_step_7(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        if self.steps_done == 7:
            raise RuntimeError("killed")
        return out

    monkeypatch.setattr(RealmModel, "forward", dies_in_step_7)
    with pytest.raises(RuntimeError, match="killed"):
        run_realm(tmp_path / "b", "out", max_steps=8, save_every=4)
    b = tmp_path / "b" / "out"
    assert json.loads((b / "knowledge" / "knowledge.json").read_text())["step"] == 6
    assert (b / "checkpoints" / "latest").read_text().strip() == "step-4"
    monkeypatch.setattr(RealmModel, "forward", forward)
    resumed = run_realm(tmp_path / "b", "out", max_steps=8, save_every=4, resume=True)
    assert resumed.record["steps"] == whole.record["steps"] == 8
    assert resumed.record["index_step"] == whole.record["index_step"] == 6
    assert (b / "metrics.jsonl").read_text() == (tmp_path / "a" / "out" / "metrics.jsonl").read_text()
    vectors = [np.load(d / "knowledge" / "vectors.npy") for d in (tmp_path / "a" / "out", b)]
    np.testing.assert_array_equal(vectors[0], vectors[1])


def test_retriever_initialises_both_towers_with_a_projection(tok, tmp_path):
    """--retriever (an ICT run's folder, the paper's initialisation): each tower starts from the folder's weights,
    two towers of their own, projected to projection_dim."""
    from bertforge.embedding.modules import SentenceEncoder
    from bertforge.model import Encoder
    from bertforge.pretraining.options import PretrainOptions
    from bertforge.pretraining.realm import build_realm
    from bertforge.pretraining.recipes import RECIPES
    from bertforge.retrieval.towers import BiEncoder, save_retriever

    torch.manual_seed(3)
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=128)
    tower = SentenceEncoder.from_encoder(Encoder(cfg), tok, pooling="cls", max_seq_length=64)
    save_retriever(BiEncoder(tower), tmp_path / "ict", dpr=False)
    tok.save_pretrained(tmp_path / "tok")
    knowledge, corpus = write_corpus(tmp_path)
    opts = PretrainOptions(recipe=RECIPES["realm"], out=tmp_path / "out", corpus=[str(corpus)],
                           tokenizer=tmp_path / "tok", size="bert-tiny", seq_len=64, knowledge=knowledge,
                           retriever=tmp_path / "ict", projection_dim=16, realm_k=2, refresh_every=5)
    model, sentences, _ = build_realm(opts, [str(corpus)])
    assert model.query is not model.document and model.query.dim == model.document.dim == 16
    want = tower.transformer.bert.embeddings.word_embeddings.weight
    for t in (model.query, model.document):
        torch.testing.assert_close(t.transformer.bert.embeddings.word_embeddings.weight, want)
    assert len(sentences) == len(SENTENCES) * 4 and all(not s for s in sentences.sources)  # --corpus: no source


def test_entity_runs_read_bio_and_iob1_tags():
    from bertforge.retrieval.realm_data import entity_runs

    assert entity_runs(["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-ORG", "I-ORG", "O"]) == [(0, 1), (3, 3), (4, 4),
                                                                                        (5, 6)]
    assert entity_runs(["I-LOC", "I-LOC", "O", "I-PER"]) == [(0, 1), (3, 3)]  # IOB1: I- starts one after O


def test_ner_spans_join_the_models_entities_and_dates(monkeypatch):
    """--ner-model: the tagger's entities (mapped from its words back to characters) and the date pattern's dates."""
    import bertforge.tasks.predict as P
    from bertforge.retrieval.realm_data import ner_spans

    seen = []

    def fake_predict(model, inputs, **_):
        seen.extend(inputs)
        return [{"tags": ["O" if not w[0].isupper() or i == 0 else "B-X" for i, w in enumerate(row["tokens"])]}
                for row in inputs]

    monkeypatch.setattr(P, "predict", fake_predict)
    text = "In 1969, the crew of Apollo landed near Tranquility."
    spans = ner_spans("model-dir")([text, ""])
    assert seen[0]["tokens"][:4] == ["In", "1969", ",", "the"]
    assert [text[s:e] for s, e in spans[0]] == ["1969", "Apollo", "Tranquility"]
    assert spans[1] == []


def test_realm_starts_from_an_ict_run(tmp_path):
    """The paper's path: `pretrain --recipe ict` on the knowledge text, then `--recipe realm --retriever` that run."""
    import bertforge

    knowledge, corpus = write_corpus(tmp_path)
    bertforge.pretrain([str(knowledge)], recipe="ict", out=tmp_path / "ict", size="bert-tiny", seq_len=64,
                       batch_size=4, vocab_size=200, max_steps=2, progress=False, threads=1)
    result = run_realm(tmp_path, "realm", max_steps=2, retriever=tmp_path / "ict")
    assert result.record["steps"] == 2
    from bertforge.retrieval.towers import load_retriever

    question, passage = load_retriever(tmp_path / "realm" / "retriever")
    assert question.dim == passage.dim == 16
