"""Corpus reading (formats, Gutenberg stripping, sentence splitting, bad input) and sharding (round trip,
workers, splits, ranks)."""
import gzip
import json
import os
import re
import time
import warnings

import numpy as np
import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import models, normalizers, pre_tokenizers, trainers

from bertforge.data import ShardedCorpus, iter_documents, prepare_corpus, split_sentences
from bertforge.data.corpus import find_files
from bertforge.errors import BertforgeError
from bertforge.tokenization import Tokenizer

WORDS = ("time people year way day thing man world life hand part child eye woman place work week case point "
         "government company number group problem fact extraordinary unbelievable remarkable considering "
         "nevertheless whatsoever understanding circumstances approximately").split()


def synthetic_docs(n_docs, seed=0, min_sent=2, max_sent=12):
    """Documents as lists of sentences ("Word word word.") from a small vocabulary, some long words."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n_docs):
        sents = []
        for _ in range(int(rng.integers(min_sent, max_sent + 1))):
            words = [WORDS[i] for i in rng.integers(0, len(WORDS), int(rng.integers(4, 14)))]
            sents.append(" ".join(words).capitalize() + rng.choice([".", "!", "?"]))
        docs.append(sents)
    return docs


def write_txt(path, docs):
    path.write_text("\n\n".join(" ".join(s) for s in docs) + "\n", encoding="utf-8")
    return path


def make_tokenizer(files, vocab_size=100):
    """A small WordPiece tokenizer trained here, behind the bertforge Tokenizer interface."""
    backend = Backend(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.train([str(f) for f in files], trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    return Tokenizer(backend)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    docs = synthetic_docs(120)
    f = write_txt(d / "a.txt", docs[:60])
    with gzip.open(d / "b.txt.gz", "wt", encoding="utf-8") as fh:
        fh.write("\n\n".join(" ".join(s) for s in docs[60:90]))
    with open(d / "sub_c.jsonl", "w", encoding="utf-8") as fh:
        for s in docs[90:]:
            fh.write(json.dumps({"text": " ".join(s), "id": 1}) + "\n")
    return d, docs, make_tokenizer([f])


# ---------------------------------------------------------------------------------------------- reading

def test_formats_folders_and_globs(small):
    d, docs, _ = small
    got = list(iter_documents(d))  # folder: a.txt, b.txt.gz, sub_c.jsonl (sorted)
    assert [doc.text for doc in got] == [" ".join(s) for s in docs]
    assert got[1].line == 3 and got[60].source.endswith("b.txt.gz") and got[90].line == 1
    assert [p.name for p in find_files([str(d / "*.txt*")])] == ["a.txt", "b.txt.gz"]
    with pytest.raises(BertforgeError, match="no such file"):
        find_files([d / "missing.txt"])


def test_doc_boundary_file_keeps_paragraphs(tmp_path):
    f = tmp_path / "book.txt"
    f.write_text("Title line\n\nFirst para line one\nline two. Next one.\n\nSecond para.\n", encoding="utf-8")
    (doc,) = iter_documents(f, doc_boundary="file")
    assert doc.text == "Title line\n\nFirst para line one line two. Next one.\n\nSecond para."
    # A paragraph break always ends a sentence, even without punctuation.
    assert split_sentences(doc.text) == ["Title line", "First para line one line two.", "Next one.", "Second para."]


def test_gutenberg_header_and_footer_stripped(tmp_path):
    f = tmp_path / "pg.txt"
    f.write_bytes("\ufeffThe Project Gutenberg EBook of X\r\n\r\nLicence blah.\r\n"
                  "*** START OF THIS PROJECT GUTENBERG EBOOK X ***\r\n\r\nChapter one text.\r\n\r\n"
                  "More text here.\r\n\r\n*** END OF THIS PROJECT GUTENBERG EBOOK X ***\r\n\r\nFull licence.\r\n"
                  .encode("utf-8"))
    assert [d.text for d in iter_documents(f)] == ["Chapter one text.", "More text here."]
    g = tmp_path / "old.txt"  # older footer form, "***START" without a space
    g.write_text("Header\n***START OF THE PROJECT GUTENBERG EBOOK Y***\nBody.\n\nEnd of the Project Gutenberg "
                 "EBook of Y\nlicence\n", encoding="utf-8")
    assert [d.text for d in iter_documents(g)] == ["Body."]
    h = tmp_path / "plain.txt"  # no markers: nothing is dropped
    h.write_text("Just text.\n", encoding="utf-8")
    assert [d.text for d in iter_documents(h)] == ["Just text."]


def fake_book(title, paragraphs):
    """A small Project Gutenberg file: header, START marker, the paragraphs, END marker, licence footer."""
    return (f"The Project Gutenberg eBook of {title}\n\nThis eBook is for the use of anyone anywhere.\n\n"
            f"*** START OF THE PROJECT GUTENBERG EBOOK {title.upper()} ***\n\n" + "\n\n".join(paragraphs)
            + f"\n\n*** END OF THE PROJECT GUTENBERG EBOOK {title.upper()} ***\n\n"
            + "\n".join(f"Licence line {i} of the Project Gutenberg License." for i in range(12)) + "\n")


def test_several_gutenberg_books_in_one_file(tmp_path):
    books = {t: [f"{t} paragraph {i}, line one\nand line two." for i in range(30)] for t in ("Alpha", "Beta", "Gamma")}
    f = tmp_path / "three.txt"
    f.write_text("".join(fake_book(t, ps) for t, ps in books.items()), encoding="utf-8")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        docs = list(iter_documents(f))
    assert [d.text for d in docs] == [p.replace("\n", " ") for ps in books.values() for p in ps]
    assert not caught  # under half of the lines dropped: no warning
    # A file that is mostly boiler-plate is reported, with its name and the share dropped.
    g = tmp_path / "short.txt"
    g.write_text(fake_book("Tiny", ["One short paragraph."]) * 2, encoding="utf-8")
    with pytest.warns(UserWarning, match=r"short\.txt: 38 of 44 lines \(86%\) dropped as Project Gutenberg"):
        assert [d.text for d in iter_documents(g)] == ["One short paragraph."] * 2


@pytest.mark.parametrize("doc_boundary", ["blank", "file"])
def test_truncated_gzip_keeps_what_was_read(tmp_path, doc_boundary):
    lines = [f"Sentence number {i} tells of {WORDS[i % len(WORDS)]} and {WORDS[(i * 7) % len(WORDS)]}."
             for i in range(20_000)]
    text = "".join(line + ("\n\n" if i % 10 == 9 else "\n") for i, line in enumerate(lines))
    packed = gzip.compress(text.encode("utf-8"))
    f = tmp_path / "cut.txt.gz"
    f.write_bytes(packed[:int(0.3 * len(packed))])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        docs = list(iter_documents(f, doc_boundary=doc_boundary))
    got = re.split(r"\.\s+", " ".join(d.text for d in docs))
    kept = len(got)
    assert 0.25 * len(lines) < kept <= 0.31 * len(lines)  # most of the first 30% comes back ...
    assert [g.rstrip(".") for g in got[:-1]] == [x.rstrip(".") for x in lines[:kept - 1]]  # ... in order
    msgs = [str(w.message) for w in caught]
    assert len(msgs) == 1 and msgs[0].startswith(f"{f}:") and "cut short" in msgs[0]
    assert f"of {len(packed[:int(0.3 * len(packed))]):,}" in msgs[0] and "lines" in msgs[0]


def test_damaged_gzip_in_strict_readers_and_tiny_cut(tmp_path):
    from bertforge.io.read import text_lines
    f = tmp_path / "rows.txt.gz"
    f.write_bytes(gzip.compress(b"".join(b"row %d\n" % i for i in range(50_000)))[:4000])
    with pytest.raises(BertforgeError, match=r"rows\.txt\.gz:\d+: cannot read further"):
        list(text_lines(f))
    g = tmp_path / "tiny.txt.gz"  # cut inside the first few kilobytes of text: still read, not skipped
    g.write_bytes(gzip.compress(b"Alpha beta gamma.\n" * 2000)[:60])
    with pytest.warns(UserWarning, match="tiny.txt.gz"):
        docs = list(iter_documents(g))
    assert docs and docs[0].text.startswith("Alpha beta gamma.")


def test_patterns_and_folders_that_match_nothing_are_named(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(BertforgeError, match=r"nothing-\*\.txt: no corpus files match this pattern"):
        find_files([str(tmp_path / "nothing-*.txt")])
    with pytest.raises(BertforgeError, match=r"empty: no \.txt, .* files in this folder"):
        find_files([tmp_path / "empty"])


@pytest.mark.parametrize("text,expected", [
    ("Mr. Smith went to Washington. He arrived at 5 p.m. on Monday! Did he? Yes.",
     ["Mr. Smith went to Washington.", "He arrived at 5 p.m. on Monday!", "Did he?", "Yes."]),
    ("J. R. R. Tolkien wrote it, e.g. The Hobbit. Then more.", ["J. R. R. Tolkien wrote it, e.g. The Hobbit.", "Then more."]),
    ('He said "Stop." "Why?" she asked. it was late... And dark.',
     ['He said "Stop."', '"Why?" she asked. it was late...', "And dark."]),
    ("Dr. No was here.  Prof. X too.\nA new line.", ["Dr. No was here.", "Prof. X too.", "A new line."]),
    ("Version 3.2 is out. ‘Quoted’ sentence.", ["Version 3.2 is out.", "‘Quoted’ sentence."]),
])
def test_sentence_splitter(text, expected):
    assert split_sentences(text) == expected


def test_bad_files_are_skipped_or_reported(tmp_path, caplog):
    (tmp_path / "good.txt").write_text("Fine text here. Second sentence.\n", encoding="utf-8")
    (tmp_path / "binary.txt").write_bytes(b"\x7fELF\x00\x00\x01" + bytes(range(256)) * 8)
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "noise.txt.gz").write_bytes(gzip.compress(bytes(range(128, 256)) * 64))  # no NUL, not UTF-8
    (tmp_path / "latin1.txt").write_bytes("ok line\n\nna\xefve caf\xe9 line\n".encode("latin-1"))
    (tmp_path / "bad.jsonl").write_text('{"text": "Good record."}\n{broken\n{"body": "x"}\n', encoding="utf-8")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        docs = list(iter_documents(tmp_path))
    msgs = [str(w.message) for w in caught]
    assert [d.text for d in docs] == ["Good record.", "Fine text here. Second sentence.", "ok line", "na\ufffdve caf\ufffd line"]
    assert any(m.startswith(f"{tmp_path / 'binary.txt'}:1: binary file") for m in msgs)
    assert any(m.startswith(f"{tmp_path / 'empty.txt'}:0: empty file") for m in msgs)
    assert any(m.startswith(f"{tmp_path / 'noise.txt.gz'}:1: binary file (not UTF-8") for m in msgs)
    assert any(m.startswith(f"{tmp_path / 'latin1.txt'}:3: invalid UTF-8") for m in msgs)
    assert any(m.startswith(f"{tmp_path / 'bad.jsonl'}:2: invalid JSON") for m in msgs)
    assert any(m.startswith(f"{tmp_path / 'bad.jsonl'}:3: record has no 'text'") for m in msgs)
    assert all("\n" not in m for m in msgs)
    assert any("latin1.txt:3" in r.getMessage() for r in caplog.records)  # also through logging


def test_huge_single_line_is_chunked(tmp_path):
    words = (" ".join(WORDS) + " ").encode()
    f = tmp_path / "huge.txt"
    f.write_bytes(b"before\n\n" + words * (10_000_000 // len(words)) + b"\n\nafter\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        docs = list(iter_documents(f))
    assert any(str(w.message).startswith(f"{f}:3: line longer than") for w in caught)
    assert docs[0].text == "before" and docs[-1].text == "after" and docs[-1].line == 5
    middle = " ".join(d.text for d in docs[1:-1]).split()
    assert len(middle) == len(WORDS) * (10_000_000 // len(words))  # no word was cut at a chunk border
    assert set(middle) == set(WORDS)
    # The splitter bounds a "sentence" without punctuation.
    pieces = split_sentences(docs[1].text[:100_000])
    assert max(map(len, pieces)) <= 10_000 and " ".join(pieces) == docs[1].text[:100_000].strip()


def test_no_usable_text_raises(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "bin.txt").write_bytes(b"\x00" * 100)
    with pytest.warns(UserWarning), pytest.raises(BertforgeError, match="no usable text"):
        list(iter_documents(tmp_path))


# ---------------------------------------------------------------------------------------------- shards

def read_all(c):
    return [c.document(i) for i in range(len(c))]


def test_shards_round_trip_and_workers_agree(small, tmp_path):
    d, docs, tok = small
    m1 = prepare_corpus(d, tok, tmp_path / "w1", workers=1, shard_tokens=500, progress=False)
    m2 = prepare_corpus(d, tok, tmp_path / "w2", workers=2, shard_tokens=500, progress=False)
    assert m1["dtype"] == "uint16" and len(m1["shards"]) > 3
    assert m1["num_documents"] == len(docs) and m1["num_sentences"] == sum(map(len, docs))
    for name in ("ids.bin", "word_start.bin", "sent_offsets.npy", "doc_offsets.npy", "doc_hash.npy"):
        for s in m1["shards"]:
            assert (tmp_path / "w1" / f"{s['name']}.{name}").read_bytes() == (tmp_path / "w2" / f"{s['name']}.{name}").read_bytes()
    assert {k: v for k, v in m1.items() if k != "stats"} == {k: v for k, v in m2.items() if k != "stats"}
    assert not list((tmp_path / "w1").glob("*.tmp"))
    c = ShardedCorpus(tmp_path / "w1", tokenizer=tok)
    for i, sents in enumerate(docs):
        stored = c.document(i)
        assert [s.tolist() for s in stored] == tok.encode_ids(sents)
        ws = np.concatenate([c.word_starts(*c.sentence_offsets(i)[[j, j + 1]]) for j in range(len(sents))])
        words = [w for _, ww in tok.encode_words(sents) for w in ww]
        starts = [int(k == 0 or w != prev) for ids, ww in tok.encode_words(sents) for k, (w, prev) in enumerate(zip(ww, [None] + ww[:-1]))]
        assert ws.tolist() == starts and len(words) == len(ws)
    assert c.special_ids == tok.special_ids and c.mask_id == tok.mask_token_id


def test_multi_token_words_marked(small, tmp_path):
    _, _, tok = small
    f = tmp_path / "w.txt"
    f.write_text("Extraordinary circumstances nevertheless.\n", encoding="utf-8")
    prepare_corpus(f, tok, tmp_path / "out", progress=False)
    c = ShardedCorpus(tmp_path / "out")
    (sent,) = c.document(0)
    ws = c.word_starts(0, len(sent)).tolist()
    pieces = [t.startswith("##") for t in tok.convert_ids_to_tokens(sent.tolist())] if hasattr(tok, "convert_ids_to_tokens") \
        else [tok.backend.id_to_token(int(t)).startswith("##") for t in sent]
    assert any(pieces), "test needs multi-piece words"
    assert ws == [0 if p else 1 for p in pieces]


def test_splits_and_ranks(small, tmp_path):
    d, docs, tok = small
    prepare_corpus(d, tok, tmp_path / "s", progress=False, shard_tokens=700, heldout_fraction=0.2)
    all_ = ShardedCorpus(tmp_path / "s")
    train, held = ShardedCorpus(tmp_path / "s", split="train"), ShardedCorpus(tmp_path / "s", split="heldout")
    # content hashes of token ids: 120 documents at 0.2 give 24 +- 4.4 held out; within 4 sigma
    assert 0.05 < len(held) / len(all_) < 0.35
    assert sorted(np.r_[train.doc_ids, held.doc_ids].tolist()) == list(range(len(all_)))
    # Content-hash split: the same documents are held out when the corpus is re-sharded with other settings.
    prepare_corpus(d, tok, tmp_path / "t", progress=False, shard_tokens=10_000, workers=1)
    held2 = ShardedCorpus(tmp_path / "t", split="heldout", heldout_fraction=0.2)
    assert [x.tolist() for i in range(len(held)) for x in held.document(i)] == \
        [x.tolist() for i in range(len(held2)) for x in held2.document(i)]
    ranks = [ShardedCorpus(tmp_path / "s", split="train", rank=r, world_size=3) for r in range(3)]
    assert sorted(np.concatenate([r.doc_ids for r in ranks]).tolist()) == train.doc_ids.tolist()
    assert max(map(len, ranks)) - min(map(len, ranks)) <= 1
    doc_ptr, starts, ends = ranks[1].sentence_spans()
    assert len(doc_ptr) == len(ranks[1]) + 1
    for i in range(len(ranks[1])):
        assert [ranks[1].tokens(s, e).tolist() for s, e in zip(starts[doc_ptr[i]:doc_ptr[i + 1]], ends[doc_ptr[i]:doc_ptr[i + 1]])] \
            == [x.tolist() for x in ranks[1].document(i)]


def test_loader_errors(small, tmp_path):
    d, _, tok = small
    with pytest.raises(BertforgeError, match="manifest.json: missing"):
        ShardedCorpus(tmp_path)
    prepare_corpus(d / "a.txt", tok, tmp_path / "x", progress=False)
    other = make_tokenizer([d / "a.txt"])
    other.backend.add_tokens(["zzzextra"])
    with pytest.raises(BertforgeError, match="fingerprint"):
        ShardedCorpus(tmp_path / "x", tokenizer=other)
    with pytest.raises(BertforgeError, match="split"):
        ShardedCorpus(tmp_path / "x", split="dev")
    # Re-preparing replaces the old shards; the manifest is written last.
    m = prepare_corpus(d / "a.txt", tok, tmp_path / "x", progress=False, shard_tokens=100)
    assert sorted(p.name for p in (tmp_path / "x").glob("*.ids.bin")) == [s["name"] + ".ids.bin" for s in m["shards"]]


def test_tokenizer_as_path_or_backend(small, tmp_path):
    d, _, tok = small
    tok.backend.save(str(tmp_path / "tokenizer.json"))
    a = prepare_corpus(d / "a.txt", tmp_path / "tokenizer.json", tmp_path / "p", progress=False)
    b = prepare_corpus(d / "a.txt", tok.backend, tmp_path / "q", progress=False)
    assert a["tokenizer"]["fingerprint"] == b["tokenizer"]["fingerprint"]
    assert (tmp_path / "p" / "shard_00000.ids.bin").read_bytes() == (tmp_path / "q" / "shard_00000.ids.bin").read_bytes()


def test_tokenizer_travels_to_workers_as_its_json(small):
    import pickle

    _, _, tok = small
    state = tok.__getstate__()
    assert set(state) == {"json", "kind", "specials", "do_lower_case", "model_max_length"}
    blob = pickle.dumps(tok)
    assert len(blob) < len(state["json"]) + 1000
    back = pickle.loads(blob)
    assert back.backend.to_str() == tok.backend.to_str() and back.specials == tok.specials
    sents = ["Extraordinary circumstances nevertheless.", "The government and the company."]
    assert back.encode_words(sents) == tok.encode_words(sents) and back.special_ids == tok.special_ids


@pytest.mark.slow
def test_gutenberg_books_prepare_throughput(tmp_path, shared_data):
    books = [shared_data("gutenberg", "11-0.txt"), shared_data("gutenberg", "2600-0.txt")]
    tok = make_tokenizer(books, vocab_size=8000)
    t0 = time.perf_counter()
    m = prepare_corpus(books, tok, tmp_path / "g", workers=2, progress=False)
    seconds = time.perf_counter() - t0
    print(f"\nprepare: {m['num_tokens']} tokens, {m['num_documents']} documents in {seconds:.2f}s with 2 workers "
          f"= {m['num_tokens'] / seconds:,.0f} tokens/s")
    c = ShardedCorpus(tmp_path / "g")
    text = (lambda i: " ".join(tok.decode(s.tolist()) for s in c.document(i)).replace(" ##", ""))
    first = text(0)
    assert "gutenberg" not in first.lower() and "alice" in first.lower()
    last = text(len(c) - 1)
    assert "gutenberg" not in last.lower()
    assert m["num_tokens"] > 500_000 and os.path.getsize(tmp_path / "g" / "shard_00000.ids.bin") == 2 * m["num_tokens"]


def test_split_sentences_keep_space_joins_back_to_the_text():
    # What a left-to-right LM reads (GPT-2's byte-level BPE encodes the spaces): the sentences joined are the text,
    # with paragraph breaks kept as "\n\n" and runs of whitespace inside a paragraph made one space.
    text = "Mr. Smith came. He sat down!  Then\nhe left.\n\n\"Why?\" she asked. Nobody knew."
    sents = split_sentences(text, keep_space=True)
    assert sents == ["Mr. Smith came.", " He sat down!", " Then he left.", "\n\n\"Why?\" she asked.", " Nobody knew."]
    assert [s.strip() for s in sents] == split_sentences(text)
