"""Example builders (NSP segment/sentence pairs, FULL-/DOC-SENTENCES, SOP), PretrainingDataset and collate."""
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer as Backend
from tokenizers import models, normalizers, pre_tokenizers, trainers

from bertforge.data import Masker, PretrainingDataset, ShardedCorpus, collate, make_builder, prepare_corpus
from bertforge.data.examples import plan_rng
from bertforge.data.masking import IGNORE_INDEX
from bertforge.errors import BertforgeError
from bertforge.tokenization import Tokenizer

WORDS = ("time people year way day thing man world life hand part child eye woman place work week case point "
         "government company number group problem fact extraordinary unbelievable remarkable considering").split()
SEQ = 64


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("ex")
    rng = np.random.default_rng(1)
    docs = []
    for _ in range(300):
        sents = [" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), int(rng.integers(3, 12)))).capitalize() + "."
                 for _ in range(int(rng.integers(8, 30)))]
        docs.append(" ".join(sents))
    (d / "c.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    backend = Backend(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.train([str(d / "c.txt")], trainers.WordPieceTrainer(
        vocab_size=90, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    prepare_corpus(d / "c.txt", Tokenizer(backend), d / "shards", shard_tokens=20_000, progress=False)
    return ShardedCorpus(d / "shards")


def doc_index(c):
    """Map a global token offset to its view-document index, and sentence starts for checking boundaries."""
    doc_ptr, starts, ends = c.sentence_spans()
    doc_start, doc_end = starts[doc_ptr[:-1]], ends[doc_ptr[1:] - 1]
    return lambda g: int(np.searchsorted(doc_start, g, side="right")) - 1, doc_start, doc_end, set(starts.tolist())


def check_layout(c, ex, seq_len):
    ids, tt = ex["input_ids"], ex["token_type_ids"]
    assert len(ids) <= seq_len and ids[0] == c.cls_id and ids[-1] == c.sep_id
    assert len(tt) == len(ids) and len(ex["word_start"]) == len(ids)
    assert (np.diff(tt) >= 0).all()  # 0s then 1s


@pytest.mark.parametrize("name", ["segment_pair", "sentence_pair"])
def test_nsp_labels_and_random_b_from_other_document(corpus, name):
    b = make_builder(name, seq_len=SEQ)
    plan = b.plan(corpus, plan_rng(0, 0))
    locate, _, _, sent_starts = doc_index(corpus)
    assert len(plan) > 1500
    assert abs((plan.label == 0).mean() - 0.5) < 0.03
    untruncated = 0
    for i in range(len(plan)):
        (a0, a1, ga, _), (b0, b1, gb, _) = plan.ranges(i)
        assert (ga, gb) == (0, 1) and a1 > a0 and b1 > b0 and (a1 - a0) + (b1 - b0) <= SEQ - 3
        if plan.label[i] == 1:
            assert locate(b0) != locate(a0), "random B from the same document"
        else:
            assert locate(b0) == locate(a0) and b0 >= a1, "IsNext B must follow A in its document"
        if (a1 - a0) + (b1 - b0) < SEQ - 3:  # not truncated: segments are whole sentences
            untruncated += 1
            assert a0 in sent_starts and b0 in sent_starts
            if plan.label[i] == 0:
                assert b0 == a1
        ex = b.materialize(corpus, plan, i)
        check_layout(corpus, ex, SEQ)
        n_a = a1 - a0
        assert ex["input_ids"][1:1 + n_a].tolist() == corpus.tokens(a0, a1).tolist()
        assert ex["input_ids"][1 + n_a] == corpus.sep_id and (ex["token_type_ids"] == 1).sum() == b1 - b0 + 1
        assert int(ex["sentence_label"]) == plan.label[i]
    assert untruncated > 100


def test_sentence_pair_is_single_sentences(corpus):
    plan = make_builder("sentence_pair", seq_len=512).plan(corpus, plan_rng(0, 0))
    _, _, _, sent_starts = doc_index(corpus)
    doc_ptr, starts, ends = corpus.sentence_spans()
    bounds = dict(zip(starts.tolist(), ends.tolist()))
    for i in range(0, len(plan), 7):
        for s, e, _, _ in plan.ranges(i):
            assert bounds[s] == e  # exactly one sentence (nothing truncated at 512)


def test_segment_pair_short_sequences(corpus):
    lengths = make_builder("segment_pair", seq_len=SEQ, short_seq_prob=0.5).plan(corpus, plan_rng(0, 0)).lengths()
    full = make_builder("segment_pair", seq_len=SEQ, short_seq_prob=0.0).plan(corpus, plan_rng(0, 0)).lengths()
    # Half the documents get a random target length in [2, 61]: shorter chunks, so more and shorter examples
    # (a chunk still holds at least two whole sentences, which bounds how short they get).
    assert len(lengths) > 1.1 * len(full) and np.mean(lengths) < np.mean(full) - 3


def test_full_sentences_packed_with_separators(corpus):
    b = make_builder("full_sentences", seq_len=SEQ)
    plan = b.plan(corpus, plan_rng(0, 0))
    locate, doc_start, doc_end, _ = doc_index(corpus)
    lengths = plan.lengths()
    assert (lengths[:-1] == SEQ).all() and lengths[-1] <= SEQ
    assert (plan.label == -1).all()
    covered = []
    joins = 0
    for i in range(len(plan)):
        ex = b.materialize(corpus, plan, i)
        check_layout(corpus, ex, SEQ)
        assert "sentence_label" not in ex and (ex["token_type_ids"] == 0).all()
        ids, pos = ex["input_ids"], 1
        for s, e, _, sep in plan.ranges(i):
            if sep:  # a document join inside the sequence: a separator, and the next document starts
                assert ids[pos] == corpus.sep_id and s == doc_start[locate(s)] and pos > 1
                pos, joins = pos + 1, joins + 1
            assert ids[pos:pos + e - s].tolist() == corpus.tokens(s, e).tolist()
            pos += e - s
            covered.append((s, e))
        assert pos == len(ids) - 1
    assert joins > 100
    # Every token of the corpus exactly once, in order.
    flat = np.concatenate([np.arange(s, e) for s, e in covered])
    assert (flat == np.arange(corpus.total_tokens)).all()


def test_doc_sentences_never_cross_documents(corpus):
    b = make_builder("doc_sentences", seq_len=SEQ)
    plan = b.plan(corpus, plan_rng(0, 0))
    locate, doc_start, doc_end, _ = doc_index(corpus)
    per_doc = {}
    for i in range(len(plan)):
        (s, e, _, sep), = plan.ranges(i)
        assert not sep and locate(s) == locate(e - 1)
        per_doc.setdefault(locate(s), []).append((s, e))
    assert len(per_doc) == len(corpus)
    for d, blocks in per_doc.items():
        assert blocks[0][0] == doc_start[d] and blocks[-1][1] == doc_end[d]
        assert all(e - s == SEQ - 2 for s, e in blocks[:-1])  # only a document's last sequence is short
    assert (plan.lengths() < SEQ).sum() >= len(corpus) - 5


def test_sop_swaps_half(corpus):
    b = make_builder("sop", seq_len=SEQ)
    plan = b.plan(corpus, plan_rng(3, 0))
    locate, _, _, _ = doc_index(corpus)
    assert len(plan) > 1000 and abs(plan.label.mean() - 0.5) < 0.03
    for i in range(len(plan)):
        (a0, a1, _, _), (b0, b1, _, _) = plan.ranges(i)
        assert locate(a0) == locate(b0) == locate(a1 - 1) == locate(b1 - 1)
        if plan.label[i] == 1:
            assert a0 >= b1  # swapped: A is the later segment
        else:
            assert b0 >= a1
    # Without truncation the two segments are adjacent: the swapped pair is exactly the reverse.
    (a0, a1, _, _), (b0, b1, _, _) = plan.ranges(int(np.flatnonzero((plan.label == 1) & (plan.lengths() < SEQ))[0]))
    assert b1 == a0


def test_plans_deterministic(corpus):
    for name in ("segment_pair", "sentence_pair", "sop"):
        b = make_builder(name, seq_len=SEQ)
        p1, p2, p3 = b.plan(corpus, plan_rng(5, 0)), b.plan(corpus, plan_rng(5, 0)), b.plan(corpus, plan_rng(6, 0))
        assert (p1.start == p2.start).all() and (p1.label == p2.label).all()
        assert len(p1.start) != len(p3.start) or not (p1.start == p3.start).all()
    with pytest.raises(BertforgeError):
        make_builder("nsp")


def test_dataset_dynamic_masking_and_collate(corpus):
    ds = PretrainingDataset(corpus, "segment_pair", seq_len=SEQ, seed=1)
    col = ds.collator()
    items = [ds[i] for i in (3, 0, 17, 5)]
    batch = col(items)
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "mlm_labels", "sentence_label"}
    width = max(len(x["input_ids"]) for x in items)
    assert all(v.shape == (4, width) for k, v in batch.items() if k != "sentence_label")
    assert all(v.dtype == torch.long for v in batch.values())
    for r, x in enumerate(items):
        n = len(x["input_ids"])
        assert batch["attention_mask"][r].tolist() == [1] * n + [0] * (width - n)
        assert (batch["input_ids"][r, n:] == corpus.pad_id).all() and (batch["mlm_labels"][r, n:] == IGNORE_INDEX).all()
        sel = batch["mlm_labels"][r] != IGNORE_INDEX
        assert sel.sum() == max(1, round(0.15 * (n - 3)))
        assert (batch["mlm_labels"][r][sel].numpy() == x["input_ids"][sel[:n].numpy()]).all()
    assert batch["sentence_label"].tolist() == [int(x["sentence_label"]) for x in items]
    # Same epoch -> same masks (resume); a new epoch -> new masks; the clean examples never change.
    again = col([ds[i] for i in (3, 0, 17, 5)])
    assert torch.equal(again["input_ids"], batch["input_ids"])
    col.set_epoch(1)
    assert not torch.equal(col(items)["mlm_labels"], batch["mlm_labels"])
    assert ds.lengths().tolist()[:4] == [len(ds[i]["input_ids"]) for i in range(4)]


def test_dataset_static_masking_dupes(corpus):
    ds = PretrainingDataset(corpus, "doc_sentences", seq_len=SEQ, masking="static", dupe_factor=2, seed=0)
    single = PretrainingDataset(corpus, "doc_sentences", seq_len=SEQ, masking="static", dupe_factor=1, seed=0)
    assert len(ds) == 2 * len(single)
    n = len(single)
    x0, x1 = ds[0], ds[n]  # the same text in the two copies, with different masks
    assert (x0["mlm_labels"] != IGNORE_INDEX).any()
    assert not np.array_equal(x0["mlm_labels"], x1["mlm_labels"])
    col = ds.collator()
    b0 = col([ds[0], ds[n]])
    col.set_epoch(3)
    ds.set_epoch(3)
    assert torch.equal(col([ds[0], ds[n]])["input_ids"], b0["input_ids"])  # static: identical every epoch


def test_dataset_span_masking_uses_word_starts(corpus):
    masker = Masker(corpus.vocab_size, corpus.mask_id, corpus.special_ids, mode="span")
    ds = PretrainingDataset(corpus, "full_sentences", masker=masker, seq_len=SEQ)
    items = [ds[i] for i in range(50)]
    batch = collate(items, masker, corpus.pad_id, seed=0, epoch=0)
    assert {"sbo_left", "sbo_right", "sbo_pos"} <= set(batch) and "sentence_label" not in batch
    for r, x in enumerate(items):
        sel = (batch["mlm_labels"][r] != IGNORE_INDEX).numpy()[:len(x["input_ids"])]
        word = np.cumsum(x["word_start"]) - 1
        for w in np.unique(word[sel]):
            assert sel[word == w].all(), "a word was split by a span"
