"""RAG and Fusion-in-Decoder trained end to end (`finetune --task rag | fid`) and answering (`ask --generator`, the
API, serve's /answer): a tiny BERT question tower, a dense index over 20 passages, tiny BART / T5 generators built
here. The saved RAG folder is checked against transformers' RagTokenForGeneration on the same inputs."""
from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

import bertforge
from bertforge import Encoder, preset
from bertforge.errors import BertforgeError
from bertforge.model import Seq2SeqLM
from bertforge.model.checkpoint import read_tensors
from bertforge.tokenization import Tokenizer

transformers = pytest.importorskip("transformers")
pytest.importorskip("faiss")
transformers.logging.set_verbosity_error()

WORDS = ["apple", "river", "castle", "engine", "forest", "guitar", "harbor", "island", "jungle", "kettle", "lemon",
         "mirror", "needle", "ocean", "pepper", "rocket", "saddle", "tunnel", "violin", "wagon"]
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


def _encoder(tmp, name, seed, hidden=None):
    tok = Tokenizer.train(TEXTS, kind="wordpiece", vocab_size=120)
    overrides = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_hidden_layers=1)
    if hidden:
        overrides.update(hidden_size=hidden, intermediate_size=2 * hidden)
    torch.manual_seed(seed)
    Encoder(preset("bert-tiny", vocab_size=tok.vocab_size, **overrides)).save_pretrained(tmp / name, tokenizer=tok)
    return tmp / name


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(folder, paths): the question encoder, a dense and a bm25 index, the questions, BART and T5 generators."""
    tmp = tmp_path_factory.mktemp("rag")
    enc = _encoder(tmp, "enc", 0)
    (tmp / "passages.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PASSAGES))
    (tmp / "train.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    bertforge.Index.build(str(enc), str(tmp / "passages.jsonl"), str(tmp / "index"), pooling="cls")
    bertforge.Index.build(None, str(tmp / "passages.jsonl"), str(tmp / "bm25"), method="bm25")
    from bertforge.config.seq2seq import compose_seq2seq

    gens = {}
    for family, kind, size in (("bart", "bpe", 300), ("t5", "t5", 200)):
        tok = Tokenizer.train(TEXTS * 3, kind=kind, vocab_size=size, **({"min_frequency": 1} if kind == "bpe" else {}))
        cfg = compose_seq2seq(family, "tiny", vocab_size=tok.vocab_size, dropout=0.0, attention_dropout=0.0,
                              activation_dropout=0.0, encoder_layers=1, decoder_layers=1)
        torch.manual_seed(1)
        Seq2SeqLM(cfg).save_pretrained(tmp / family, tokenizer=tok)
        gens[family] = tmp / family
    return tmp, enc, gens


def _rag(world, out, **opts):
    tmp, _, gens = world
    opts = {"k": 3, "max_steps": 10, "lr": 3e-3, "batch_size": 4, "marginalise": "token", **opts}
    return bertforge.finetune(str(opts.pop("generator", gens["bart"])), task="rag", train=str(tmp / "train.jsonl"),
                              out=str(out), index=str(tmp / "index"), progress=False, device="cpu", **opts)


def _question_weights(folder):
    return {k: v for k, v in read_tensors(folder / "model.safetensors").items()}


def _losses(out):
    return [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]


@pytest.mark.parametrize("marginalise", ["token", "sequence"])
def test_rag_learns_and_trains_the_question_tower_through_the_scores(world, tmp_path, marginalise):
    tmp, enc, _ = world
    _rag(world, tmp_path / "rag", marginalise=marginalise)
    losses = _losses(tmp_path / "rag")
    assert len(losses) == 10 and sum(losses[-3:]) < 0.8 * sum(losses[:3]), losses
    before, after = _question_weights(enc), _question_weights(tmp_path / "rag" / "question")
    changed = [k for k in before if k in after and not torch.equal(before[k], after[k])]
    assert changed, "the question tower did not move: no gradient through doc_scores"
    rag = json.loads((tmp_path / "rag" / "rag.json").read_text())
    assert rag["marginalise"] == marginalise and rag["k"] == 3


def test_a_frozen_retriever_keeps_its_weights(world, tmp_path):
    _, enc, _ = world
    _rag(world, tmp_path / "rag", freeze_retriever=True, max_steps=3)
    before, after = _question_weights(enc), _question_weights(tmp_path / "rag" / "question")
    shared = [k for k in before if k in after]
    assert shared and all(torch.equal(before[k], after[k]) for k in shared)


def test_the_rag_folder_loads_in_transformers_with_the_same_loss(world, tmp_path):
    from bertforge.retrieval.rag import RetrievalAugmentedGenerator
    from bertforge.retrieval.rag_folder import load_generator, open_rag_folder

    _rag(world, tmp_path / "rag", max_steps=2)
    ref, info = transformers.RagTokenForGeneration.from_pretrained(tmp_path / "rag", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ref.eval()
    ours = RetrievalAugmentedGenerator(load_generator(open_rag_folder(tmp_path / "rag")), n_docs=3)
    cfg = ours.generator.config
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(4, cfg.vocab_size, (6, 10), generator=g)
    mask = torch.ones_like(ctx)
    mask[2, 7:] = 0
    labels = torch.randint(4, cfg.vocab_size, (2, 5), generator=g)
    labels[:, 0] = cfg.decoder_start_token_id
    scores = torch.randn(2, 3, generator=g)
    with torch.no_grad():
        want = ref(context_input_ids=ctx, context_attention_mask=mask, doc_scores=scores, labels=labels).loss
        got = ours(ctx, mask, scores, labels=labels).loss
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # the question encoder inside is the tower as trained: transformers' DPR pooler output = bertforge's vector
    from bertforge.embedding.modules import SentenceEncoder

    tower = SentenceEncoder.from_pretrained(tmp_path / "rag" / "question")
    feats = tower.tokenize(["where is the apple kept?"])
    with torch.no_grad():
        mine = tower.embed_features(feats)
        theirs = ref.question_encoder(input_ids=feats["input_ids"], attention_mask=feats["attention_mask"],
                                      token_type_ids=feats.get("token_type_ids")).pooler_output
    torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)


def test_fid_learns_on_t5(world, tmp_path):
    tmp, _, gens = world
    bertforge.finetune(str(gens["t5"]), task="fid", train=str(tmp / "train.jsonl"), out=str(tmp_path / "fid"),
                       index=str(tmp / "bm25"), retriever="bm25", k=3, max_steps=12, lr=3e-3, batch_size=4,
                       progress=False, device="cpu")
    losses = _losses(tmp_path / "fid")
    assert sum(losses[-3:]) < 0.8 * sum(losses[:3]), losses
    assert json.loads((tmp_path / "fid" / "fid.json").read_text())["k"] == 3
    Seq2SeqLM.from_pretrained(tmp_path / "fid")  # a normal generator folder


@pytest.fixture(scope="module")
def trained(world, tmp_path_factory):
    tmp, _, gens = world
    out = tmp_path_factory.mktemp("trained")
    _rag(world, out / "rag", max_steps=2)
    bertforge.finetune(str(gens["t5"]), task="fid", train=str(tmp / "train.jsonl"), out=str(out / "fid"),
                       index=str(tmp / "index"), k=2, max_steps=2, lr=3e-3, batch_size=4, progress=False,
                       device="cpu")
    return out


@pytest.mark.parametrize("kind, opts", [("rag", ["--num-beams", "2"]), ("fid", ["--num-beams", "1"])])
def test_ask_generator_cli_api_and_answer_route_agree(world, trained, kind, opts, capsys):
    from bertforge.cli import main

    tmp = world[0]
    questions = ["where is the apple kept?", "where is the wagon kept?"]
    assert main(["ask", "--index", str(tmp / "index"), "--generator", str(trained / kind), "--device", "cpu",
                 "--no-progress", *opts, *questions]) == 0
    cli = json.loads(capsys.readouterr().out)
    api = [r.to_dict() for r in bertforge.ask(questions, index=str(tmp / "index"), generator=str(trained / kind),
                                               device="cpu", num_beams=int(opts[1]))]
    assert cli == api
    assert len(api[0]["passages"]) == (3 if kind == "rag" else 2) and 0 <= api[0]["score"] <= 1
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    app = bertforge.create_app(None, index=str(tmp / "index"), generator=str(trained / kind), device="cpu",
                               num_beams=int(opts[1]))
    with TestClient(app) as client:
        got = client.post("/answer", json={"question": questions}).json()
    assert got == api


def test_rag_sequence_fast_decoding_answers(world, trained):
    tmp = world[0]
    fast = bertforge.ask("where is the apple kept?", index=str(tmp / "index"), generator=str(trained / "rag"),
                         decoding="fast", num_beams=2, device="cpu")
    assert isinstance(fast.answer, str) and len(fast.passages) == 3


# ---- bad input, one line each ----------------------------------------------------------------------------------
def test_bad_input_is_one_line(world, trained, tmp_path):
    tmp, enc, gens = world
    with pytest.raises(BertforgeError, match="bm25 index; RAG needs the passages' vectors"):
        bertforge.finetune(str(gens["bart"]), task="rag", train=str(tmp / "train.jsonl"), out=str(tmp_path / "a"),
                           index=str(tmp / "bm25"), progress=False)
    with pytest.raises(BertforgeError, match="k: 50 passages a question, but .* holds 20"):
        _rag(world, tmp_path / "b", k=50)
    other = _encoder(tmp_path, "other", seed=7)
    with pytest.raises(BertforgeError, match="fingerprint"):
        _rag(world, tmp_path / "c", retriever=str(other))
    narrow = _encoder(tmp_path, "narrow", seed=7, hidden=64)
    with pytest.raises(BertforgeError, match="width"):
        _rag(world, tmp_path / "d", retriever=str(narrow))
    with pytest.raises(BertforgeError, match="k: 30 passages a question"):
        bertforge.ask("where?", index=str(tmp / "index"), generator=str(trained / "rag"), k=30, device="cpu")
    with pytest.raises(BertforgeError, match="reader, generator: give one"):
        bertforge.ask("where?", index=str(tmp / "index"))
    # a DPR question encoder with another vocabulary than the index's passage model: refused (the generator's may
    # differ: each side reads with its own)
    tok = Tokenizer.train(["completely other words here"] * 5 + TEXTS[:3], kind="wordpiece", vocab_size=60)
    dpr = transformers.DPRQuestionEncoder(transformers.DPRConfig(vocab_size=tok.vocab_size, hidden_size=128,
                                                                 num_hidden_layers=1, num_attention_heads=2,
                                                                 intermediate_size=64))
    dpr.save_pretrained(tmp_path / "dpr")
    tok.save_pretrained(tmp_path / "dpr")
    with pytest.raises(BertforgeError, match="vocabulary"):
        _rag(world, tmp_path / "e", retriever=str(tmp_path / "dpr"))
    # a RAG folder without its generator's weights
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(trained / "rag", tmp_path / "broken")
    state = load_file(tmp_path / "broken" / "model.safetensors")
    save_file({k: v for k, v in state.items() if not k.startswith("rag.generator.")},
              tmp_path / "broken" / "model.safetensors")
    with pytest.raises(BertforgeError, match="no generator weights"):
        bertforge.ask("where?", index=str(tmp / "index"), generator=str(tmp_path / "broken"), device="cpu")


def test_finetune_task_rag_on_the_command_line(world, tmp_path, capsys):
    from bertforge.cli import main

    tmp, _, gens = world
    assert main(["finetune", "--task", "rag", "--generator", str(gens["t5"]), "--index", str(tmp / "index"),
                 "--train", str(tmp / "train.jsonl"), "--out", str(tmp_path / "rag"), "-k", "2",
                 "--marginalise", "sequence", "--max-steps", "2", "--batch-size", "4", "--lr", "1e-3",
                 "--device", "cpu", "--no-progress"]) == 0
    assert "rag: trained 2 steps" in capsys.readouterr().out
    rag = json.loads((tmp_path / "rag" / "rag.json").read_text())
    assert (rag["k"], rag["marginalise"]) == (2, "sequence")
    loaded, info = transformers.RagSequenceForGeneration.from_pretrained(tmp_path / "rag", output_loading_info=True)
    assert not info["missing_keys"] and loaded.config.n_docs == 2
    assert main(["evaluate", "--task", "rag", "--model", str(gens["t5"])]) == 2  # --task rag is finetune's alone
    assert "invalid choice: 'rag'" in capsys.readouterr().err


def test_a_retriever_folder_and_a_dpr_question_encoder_are_question_towers(world, tmp_path):
    from bertforge.retrieval.towers import load_towers, save_retriever

    tmp, enc, _ = world
    save_retriever(load_towers(str(enc), separate=True), tmp_path / "retriever")  # its passage tower built the index
    _rag(world, tmp_path / "a", retriever=str(tmp_path / "retriever"), max_steps=1)
    tok = Tokenizer.from_pretrained(enc)  # the index's vocabulary: accepted (the weights are DPR's own)
    dpr = transformers.DPRQuestionEncoder(transformers.DPRConfig(vocab_size=tok.vocab_size, hidden_size=128,
                                                                 num_hidden_layers=1, num_attention_heads=2,
                                                                 intermediate_size=64))
    dpr.save_pretrained(tmp_path / "dpr")
    tok.save_pretrained(tmp_path / "dpr")
    _rag(world, tmp_path / "b", retriever=str(tmp_path / "dpr"), max_steps=1)
    assert json.loads((tmp_path / "b" / "rag.json").read_text())["retriever"] == str(tmp_path / "dpr")
