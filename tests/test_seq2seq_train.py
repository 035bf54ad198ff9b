"""The training side of the encoder-decoders: T5's tokenizer, the t5 / bart pretraining recipes through the one
pretraining run, and `finetune --task seq2seq` (data, metrics, copy baseline, predictions, bad rows)."""
import json
import random

import numpy as np
import pytest
import torch

from bertforge.data import ShardedCorpus, prepare_corpus
from bertforge.data.noising import fill_sentinels, t5_lengths
from bertforge.data.seq2seq import Seq2SeqPretrainingDataset
from bertforge.errors import BertforgeError
from bertforge.model import Seq2SeqLM
from bertforge.pretraining.recipes import resolve
from bertforge.pretraining import seq2seq as s2s
from bertforge.tokenization import Tokenizer

transformers = pytest.importorskip("transformers")

WORDS = ("the cat dog sat ran on mat hat red blue small big and a with from over under tree house river "
         "Ann Bob saw found took gave book ball").split()


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: on a shared 2-core machine two threads wait on each other (40x slower steps)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(4, 9))]
    return " ".join(words).capitalize() + "."


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    rng = random.Random(0)
    docs = [" ".join(_sentence(rng) for _ in range(rng.randint(3, 7))) for _ in range(120)]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def t5_tok(corpus_file):
    return Tokenizer.train([corpus_file.read_text()], kind="t5", vocab_size=200)


@pytest.fixture(scope="module")
def bpe_tok(corpus_file):
    return Tokenizer.train([corpus_file.read_text()], kind="bpe", vocab_size=300, min_frequency=1)


# ---- tokenizers ------------------------------------------------------------------------------------------------
def test_t5_tokenizer_layout_and_transformers_parity(t5_tok, tmp_path):
    tok = t5_tok
    assert tok.kind == "t5" and not tok.do_lower_case
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<pad>", "</s>", "<unk>"]
    assert (tok.pad_token_id, tok.sep_token_id, tok.unk_token_id, tok.mask_token_id) == (0, 1, 2, None)
    n = tok.vocab_size
    assert tok.sentinel_ids == list(range(n - 1, n - 101, -1))  # <extra_id_0> is the last id, as in T5
    assert tok.convert_ids_to_tokens([n - 1, n - 100]) == ["<extra_id_0>", "<extra_id_99>"]
    assert set(tok.sentinel_ids) <= tok.special_ids
    tok.save_pretrained(tmp_path)
    again = Tokenizer.from_pretrained(tmp_path)
    assert again.kind == "t5" and again.sentinel_ids == tok.sentinel_ids
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    plain = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    assert type(hf).__name__ == "T5Tokenizer" and len(hf) == n
    texts = ["Ann saw  the red ball.", "Zebra café <extra_id_0> over the mat", "", "Bob"]
    ours = tok(texts, padding="longest", return_tensors=None)
    theirs = hf(texts, padding="longest")
    assert ours["input_ids"] == theirs["input_ids"] and ours["attention_mask"] == theirs["attention_mask"]
    assert tok(texts, padding=False, return_tensors=None)["input_ids"] == plain(texts)["input_ids"]
    assert ours["input_ids"][1][-1] == 1 and tok.sentinel_ids[0] in ours["input_ids"][1]  # text </s>
    pair = tok(["a cat"], ["a dog"], return_tensors=None)["input_ids"][0]
    assert pair == hf("a cat", "a dog")["input_ids"] and pair.count(1) == 2  # A </s> B </s>
    assert tok.build_inputs([5, 6])[0] == [5, 6, 1]
    assert hf.decode(ours["input_ids"][0], skip_special_tokens=True) == tok.decode(ours["input_ids"][0])
    assert Tokenizer.train([texts[0] * 5], kind="t5", vocab_size=150).kind == "t5"
    with pytest.raises(BertforgeError, match="too small"):
        Tokenizer.train(["some text"], kind="t5", vocab_size=100)  # the 100 sentinels alone


def test_t5_tokenizer_training_is_deterministic(corpus_file, t5_tok):
    again = Tokenizer.train([corpus_file.read_text()], kind="t5", vocab_size=200)
    assert again.backend.to_str() == t5_tok.backend.to_str()


def test_bart_tokenizer_is_robertas_byte_level_bpe(bpe_tok, tmp_path):
    tok = bpe_tok
    assert tok.convert_ids_to_tokens(range(5)) == ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # BART's ids
    tok.save_pretrained(tmp_path)
    hf = transformers.BartTokenizer.from_pretrained(str(tmp_path))
    texts = ["Ann saw the red ball.", "a <mask> b", "über"]
    assert tok(texts, padding="longest", return_tensors=None)["input_ids"] == hf(texts, padding="longest")["input_ids"]


# ---- pretraining data ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shards(corpus_file, t5_tok, bpe_tok, tmp_path_factory):
    out = {}
    for name, tok in (("t5", t5_tok), ("bart", bpe_tok)):
        d = tmp_path_factory.mktemp(f"shards-{name}")
        prepare_corpus([corpus_file], tok, d, heldout_fraction=0.0)
        out[name] = ShardedCorpus(d, tokenizer=tok)
    return out


def test_t5_examples_fit_and_reconstruct(shards, t5_tok):
    corpus = shards["t5"]
    ds, collate = s2s.data(corpus, resolve("t5"), t5_tok, seq_len=32, seed=0)
    raw, target_len = t5_lengths(32)
    assert (ds.raw_length, ds.target_length) == (raw, target_len)
    items = [ds[i] for i in range(len(ds) - 1)]  # (the last example may be shorter)
    assert all(len(it["ids"]) == raw for it in items)
    assert sum(t5_tok.sep_token_id in it["ids"] for it in items) > 0  # documents joined by </s>
    batch = collate(items[:8])
    assert batch["input_ids"].shape[1] <= 32 and batch["labels"].shape[1] <= target_len
    for row, it in zip(range(8), items):
        src = batch["input_ids"][row][batch["attention_mask"][row].bool()].tolist()
        tgt = [t for t in batch["labels"][row].tolist() if t != -100]
        assert fill_sentinels(src, tgt, t5_tok.sentinel_ids, t5_tok.sep_token_id) == list(it["ids"])
    collate.set_epoch(1)
    assert not torch.equal(collate(items[:8])["labels"], batch["labels"])  # new noise every epoch
    collate.set_epoch(0)
    assert torch.equal(collate(items[:8])["labels"], batch["labels"])  # and the same noise on a resume


def test_bart_examples_target_the_text_and_permute_sentences(shards, bpe_tok):
    corpus = shards["bart"]
    ds, collate = s2s.data(corpus, resolve("bart"), bpe_tok, seq_len=48, seed=0)
    it = next(ds[i] for i in range(len(ds)) if len(ds[i]["sentence_starts"]) > 2)
    assert it["sentence_starts"][0] == 0 and len(it["ids"]) <= 46
    text = bpe_tok.decode(it["ids"])
    pieces = [bpe_tok.decode(it["ids"][a:b]) for a, b in
              zip(it["sentence_starts"], it["sentence_starts"][1:] + [len(it["ids"])])]
    assert all(p.endswith(".") for p in pieces) and "".join(pieces) == text  # whole sentences
    lengths = [len(ds[i]["ids"]) for i in range(len(ds))]
    assert max(lengths) <= 46 and np.mean(lengths) > 30  # packed, within the budget
    batch = collate([it])
    labels = batch["labels"][0].tolist()
    assert labels == [bpe_tok.cls_token_id, *it["ids"].tolist(), bpe_tok.sep_token_id]
    src = batch["input_ids"][0].tolist()
    assert src[0] == bpe_tok.cls_token_id and src[-1] == bpe_tok.sep_token_id and bpe_tok.mask_token_id in src
    with pytest.raises(BertforgeError, match="too short"):
        Seq2SeqPretrainingDataset(corpus, "infilling", seq_len=8)


def test_recipes_and_their_refusals(t5_tok, bpe_tok):
    t5, bart = resolve("t5"), resolve("bart")
    assert (t5.objective, t5.tokenizer_kind, t5.model_type, t5.mask_prob, t5.span_mean) == \
        ("span-corruption", "t5", "t5", 0.15, 3.0)
    assert (bart.objective, bart.tokenizer_kind, bart.model_type, bart.mask_prob) == ("denoising", "bpe", "bart", 0.3)
    with pytest.raises(BertforgeError, match="encoder-decoders"):
        resolve("t5", objective="mlm")
    with pytest.raises(BertforgeError, match="encoder-decoders"):
        resolve("roberta", objective="denoising")
    with pytest.raises(BertforgeError, match="trains span-corruption"):
        resolve("t5", objective="denoising")
    with pytest.raises(BertforgeError, match="no sentinel tokens"):
        s2s.build_seq2seq(t5, "bert-tiny", bpe_tok, 64)
    cfg = s2s.model_config(bart, "bert-mini", bpe_tok, 64)
    assert (cfg.model_type, cfg.d_model, cfg.encoder_layers, cfg.decoder_layers, cfg.vocab_size) == \
        ("bart", 256, 4, 4, bpe_tok.vocab_size)
    assert (cfg.pad_token_id, cfg.eos_token_id, cfg.decoder_start_token_id, cfg.bos_token_id) == (1, 2, 2, 0)
    cfg = s2s.model_config(t5, "bert-tiny", t5_tok, 64)
    assert (cfg.pad_token_id, cfg.eos_token_id, cfg.decoder_start_token_id) == (0, 1, 0)


# ---- pretraining runs ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe,hf_class", [("t5", "T5ForConditionalGeneration"),
                                             ("bart", "BartForConditionalGeneration")])
def test_pretraining_loss_falls_and_the_model_loads_in_transformers(recipe, hf_class, corpus_file, tmp_path):
    from bertforge.pretraining.options import PretrainOptions
    from bertforge.pretraining.run import pretrain

    opts = PretrainOptions(recipe=resolve(recipe), out=tmp_path / "run", corpus=[str(corpus_file)], vocab_size=300,
                           size="bert-tiny", seq_len=32, batch_size=8, max_steps=40, lr=3e-3, precision="fp32",
                           threads=1, progress=False, eval_batches=2, log_every=10, heldout_fraction=0.1,
                           fill_mask_examples=1)
    result = pretrain(opts)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r["loss"] for r in records if r.get("split") == "train" and "loss" in r]
    assert train[-1] < 0.8 * train[0], train  # the loss falls
    held = result["heldout"]
    assert held["lm_ppl"] < held["unigram_ppl"]  # better than a unigram model of the text on the same targets
    assert len(result["denoising"]) == 1 and {"input", "target", "output"} <= set(result["denoising"][0])
    out = tmp_path / "run"
    hf = getattr(transformers, hf_class).from_pretrained(str(out)).eval()
    ours = Seq2SeqLM.from_pretrained(out).eval()
    tok = Tokenizer.from_pretrained(out)
    enc = tok(["Ann saw the red ball.", "Bob"], padding="longest")
    labels = tok(["the ball", "a hat on the mat"], padding="longest")["input_ids"]
    with torch.no_grad():
        a = hf(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], labels=labels).logits
        b = ours(enc["input_ids"], enc["attention_mask"], labels=labels)["logits"]
    assert (a - b).abs().max() < 1e-4
    assert transformers.AutoTokenizer.from_pretrained(str(out))("Ann saw")["input_ids"] == \
        tok(["Ann saw"], return_tensors=None)["input_ids"][0]


# ---- fine-tuning -----------------------------------------------------------------------------------------------
def test_text_metrics_and_copy_baseline():
    pytest.importorskip("sacrebleu")
    pytest.importorskip("rouge_score")
    from bertforge.tasks.seq2seq import text_metrics

    refs = ["what did the cat sit on ?", "who found the red ball ?"]
    perfect = text_metrics(refs, refs)
    assert all(perfect[k] == pytest.approx(100.0) for k in ("bleu", "rouge1", "rouge2", "rougeL"))
    half = text_metrics(["what did the dog eat ?", "who found the red ball ?"], refs)
    assert 0 < half["bleu"] < 100 and 50 < half["rouge1"] < 100
    assert text_metrics(["zzz", "qqq"], refs)["rougeL"] == 0.0


def _qa_like_rows(rng: random.Random, n: int) -> list[dict]:
    rows = []
    for _ in range(n):
        words = [rng.choice(WORDS[:12]) for _ in range(6)]
        rows.append({"src": "answer: " + words[0] + " context: " + " ".join(words), "tgt": f"what about {words[0]} ?"})
    return rows


@pytest.fixture(scope="module")
def tiny_t5(t5_tok, tmp_path_factory):
    from bertforge.config.seq2seq import compose_seq2seq

    d = tmp_path_factory.mktemp("t5-random")
    cfg = compose_seq2seq("t5", "tiny", vocab_size=t5_tok.vocab_size, dropout=0.0, attention_dropout=0.0,
                          activation_dropout=0.0)
    torch.manual_seed(0)
    Seq2SeqLM(cfg).save_pretrained(d, tokenizer=t5_tok)
    return d


def test_finetune_seq2seq_learns_writes_predictions_and_reports_the_copy_baseline(tiny_t5, tmp_path):
    pytest.importorskip("sacrebleu")
    from bertforge.tasks.finetune import FinetuneConfig, evaluate_model, finetune
    from bertforge.tasks.predict import predict

    rng = random.Random(1)
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _qa_like_rows(rng, 256)))
    dev = _qa_like_rows(rng, 24)
    (data / "dev.tsv").write_text("src\ttgt\n" + "".join(f"{r['src']}\t{r['tgt']}\n" for r in dev))
    cfg = FinetuneConfig(task="seq2seq", model=tiny_t5, out=tmp_path / "out", data=data, source_col="src",
                         target_col="tgt", max_seq_len=32, max_target_len=12, epochs=4, lr=3e-3, batch_size=16,
                         warmup_ratio=0.0, progress=False, eval_batch_size=32)
    result = finetune(cfg)
    best = result.runs[0]["best"]
    assert result.main_metric == "rougeL" and {"bleu", "rouge1", "rouge2", "copy_bleu", "copy_rougeL"} <= set(best)
    # the tiny model learns the question template (and some answers): far above copying the source
    assert 0 < best["copy_rougeL"] < 30 and best["rougeL"] > 2 * best["copy_rougeL"]
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    train = [r["loss"] for r in records if r.get("split") == "train" and "loss" in r]
    assert train[-1] < 0.5 * train[0]
    preds = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 24 and preds[0]["target"] == dev[0]["tgt"] and preds[0]["source"] == dev[0]["src"]
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["bertforge_task"]["kind"] == "seq2seq" and saved["bertforge_task"]["source_col"] == "src"
    assert transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path / "out")) is not None
    # evaluate and predict rebuild the task from config.json (columns, lengths)
    scores = evaluate_model(tmp_path / "out", FinetuneConfig(task="seq2seq", model=tmp_path / "out", out=".",
                                                             data=data, progress=False))
    assert scores["rougeL"] == pytest.approx(best["rougeL"])
    (tmp_path / "in.jsonl").write_text(json.dumps({"src": dev[0]["src"]}) + "\n")
    out = predict(tmp_path / "out", tmp_path / "in.jsonl", progress=False)
    assert out == [{"id": "in-0", "prediction": preds[0]["prediction"]}]
    beams = evaluate_model(tmp_path / "out", FinetuneConfig(task="seq2seq", model=tmp_path / "out", out=".",
                                                            data=data, progress=False, num_beams=3))
    assert beams["rougeL"] > 2 * beams["copy_rougeL"]


@pytest.mark.parametrize("content,ext,msg", [
    ('{"source": "a b", "target": "c"}\n{"source": "d e"}\n', "jsonl", r"train.jsonl:2: missing field 'target'"),
    ('{"source": "a b", "target": "c"}\n{"source": "d e", "target": "  "}\n', "jsonl",
     r"train.jsonl:2: empty text 'target'"),
    ("source\tanswer\na b\tc\n", "tsv", r"train.tsv:1: header has no column 'target'"),
    ("source\ttarget\na b\tc\nd e\n", "tsv", r"train.tsv:3: expected 2 columns, found 1"),
])
def test_bad_rows_name_file_line_and_column(content, ext, msg, tiny_t5, tmp_path):
    from bertforge.tasks.finetune import FinetuneConfig, finetune

    (tmp_path / f"train.{ext}").write_text(content)
    cfg = FinetuneConfig(task="seq2seq", model=tiny_t5, out=tmp_path / "out", train=tmp_path / f"train.{ext}",
                         progress=False)
    with pytest.raises(BertforgeError, match=msg):
        finetune(cfg)
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_an_encoder_checkpoint_is_refused_for_seq2seq(tmp_path):
    from bertforge import Encoder, preset
    from bertforge.tasks.finetune import FinetuneConfig, finetune

    tok = Tokenizer.train(["a b c d e f g h"] * 20, kind="wordpiece", vocab_size=60, min_frequency=1)
    Encoder(preset("bert-tiny", vocab_size=tok.vocab_size)).save_pretrained(tmp_path / "bert", tokenizer=tok)
    (tmp_path / "train.jsonl").write_text('{"source": "a b", "target": "c"}\n')
    cfg = FinetuneConfig(task="seq2seq", model=tmp_path / "bert", out=tmp_path / "out",
                         train=tmp_path / "train.jsonl", progress=False)
    with pytest.raises(BertforgeError, match="not an encoder-decoder"):
        finetune(cfg)
    np.testing.assert_equal(len(list((tmp_path).glob("out*"))), 0)


# ---- question generation from SQuAD ----------------------------------------------------------------------------
SQUAD = ("squad", "dev-v1.1.json")  # under the shared data folder (the shared_data fixture)


def test_qg_data_is_split_by_article(tmp_path, shared_data):
    from bertforge.tasks.qg import build_qg

    squad = shared_data(*SQUAD)
    info = build_qg(squad, tmp_path, dev_articles=8)
    train = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    dev = [json.loads(line) for line in (tmp_path / "dev.jsonl").read_text().splitlines()]
    assert (len(train), len(dev)) == (info["train"], info["dev"]) and len(train) + len(dev) == 10570
    assert not {r["article"] for r in train} & {r["article"] for r in dev}  # no dev passage in training
    assert sorted({r["article"] for r in dev}) == info["dev_articles"] and len(info["dev_articles"]) == 8
    r = dev[0]
    answer, context = r["source"].removeprefix("answer: ").split(" context: ", 1)
    assert answer in context and r["target"].endswith("?")
    contexts = {row["source"].split(" context: ", 1)[1] for row in train}
    assert not any(row["source"].split(" context: ", 1)[1] in contexts for row in dev)
    build_qg(squad, tmp_path / "s", dev_articles=8, context="sentence")
    short = [json.loads(line) for line in (tmp_path / "s" / "dev.jsonl").read_text().splitlines()]
    assert len(short) == len(dev) and sum(len(s["source"]) for s in short) < 0.5 * sum(len(d["source"]) for d in dev)
    with pytest.raises(BertforgeError, match="--dev-articles 48"):
        build_qg(squad, tmp_path / "x", dev_articles=48)


@pytest.mark.slow
def test_qg_benchmark_runs_end_to_end_on_a_slice(tmp_path, shared_data):
    """benchmarks/seq2seq_qg.py at a tiny budget: pretrain T5, fine-tune on 300 questions, score 20 dev ones."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "seq2seq_qg.py"
    results = tmp_path / "qg.json"
    cmd = [sys.executable, str(script), "--families", "t5", "--budget", "20s", "--books", "0", "--vocab-size", "1000",
           "--seq-len", "48", "--batch-size", "16", "--context", "sentence", "--max-source-len", "64",
           "--train-limit", "300", "--eval-limit", "20", "--finetune-epochs", "1", "--threads", "1", "--no-lock",
           "--data", str(shared_data(*SQUAD).parents[1]), "--out", str(tmp_path / "run"), "--results", str(results)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "copy source" in done.stdout
    out = json.loads(results.read_text())
    t5 = out["families"]["t5"]
    assert t5["pretrain"]["steps"] > 0 and t5["pretrain"]["heldout"]["lm_ppl"] < t5["pretrain"]["heldout"]["unigram_ppl"]
    best = t5["finetune"]["best"]
    assert {"bleu", "rouge1", "rouge2", "rougeL", "copy_bleu", "copy_rougeL"} <= set(best) and best["copy_rouge1"] > 10
    preds = (tmp_path / "run" / "qg-t5" / "predictions.jsonl").read_text().splitlines()
    assert len(preds) == 20
