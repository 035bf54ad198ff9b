"""Masking statistics and invariants for token, whole-word and span (SpanBERT) modes."""
import numpy as np
import pytest

from bertforge.data.masking import IGNORE_INDEX, Masker, mask_rng
from bertforge.errors import BertforgeError

VOCAB, PAD, UNK, CLS, SEP, MASK = 1000, 0, 1, 2, 3, 4
SPECIALS = {PAD, UNK, CLS, SEP, MASK}


def make_sequences(n_seq=800, seq_len=128, seed=0, max_word=4):
    """[CLS] A [SEP] B [SEP] sequences of random non-special ids, with random word lengths 1..max_word."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_seq):
        ids = rng.integers(5, VOCAB, seq_len)
        cut = int(rng.integers(10, seq_len - 10))
        ids[0], ids[cut], ids[-1] = CLS, SEP, SEP
        ws = np.zeros(seq_len, np.uint8)
        pos = 0
        while pos < seq_len:
            ws[pos] = 1
            pos += int(rng.integers(1, max_word + 1))
        out.append((ids, ws))
    return out


def words_of(ids, ws):
    """Word id per token (-1 for specials), the same segmentation the masker uses."""
    special = np.isin(ids, list(SPECIALS))
    start = ws.astype(bool) | special
    start[1:] |= special[:-1]
    wid = np.cumsum(start) - 1
    wid[special] = -1
    return wid


def run(mode, n_seq=800, seq_len=128, max_word=4, **kw):
    masker = Masker(VOCAB, MASK, SPECIALS, mode=mode, **kw)
    results = []
    for i, (ids, ws) in enumerate(make_sequences(n_seq, seq_len, max_word=max_word)):
        results.append((ids, ws, masker(ids, ws, mask_rng(0, 0, i))))
    return masker, results


@pytest.mark.parametrize("mode", ["token", "whole_word", "span"])
def test_budget_and_80_10_10(mode):
    masker, results = run(mode)
    chosen = candidates = n_mask = n_rand = n_keep = 0
    for ids, ws, out in results:
        sel = out["mlm_labels"] != IGNORE_INDEX
        n_cand = int((~np.isin(ids, list(SPECIALS))).sum())
        if mode == "token":  # exactly round(15%) per sequence, as Google does
            assert sel.sum() == round(0.15 * n_cand)
        assert sel.sum() <= round(0.15 * n_cand)
        assert not np.isin(ids[sel], list(SPECIALS)).any(), "a special token was chosen"
        assert (out["mlm_labels"][sel] == ids[sel]).all()
        assert (out["input_ids"][~sel] == ids[~sel]).all(), "an unchosen token changed"
        masked = out["input_ids"][sel] == MASK
        kept = out["input_ids"][sel] == ids[sel]
        rand = ~masked & ~kept
        assert not np.isin(out["input_ids"][sel][rand], list(SPECIALS)).any()
        chosen += int(sel.sum())
        candidates += n_cand
        n_mask, n_rand, n_keep = n_mask + int(masked.sum()), n_rand + int(rand.sum()), n_keep + int(kept.sum())
    assert candidates > 90_000
    assert abs(chosen / candidates - 0.15) < 0.005
    if mode == "span":
        return  # its 80/10/10 is per span: test_span_80_10_10_per_span
    # A random replacement equal to the original (1 in ~1000) counts as "kept": negligible.
    assert abs(n_mask / chosen - 0.8) < 0.01
    assert abs(n_rand / chosen - 0.1) < 0.01
    assert abs(n_keep / chosen - 0.1) < 0.01


def test_span_80_10_10_per_span():
    """Span mode draws the treatment once per span: count spans (4x more data, as there are ~5x fewer draws)."""
    _, results = run("span", n_seq=3200)
    counts = {"mask": 0, "rand": 0, "keep": 0}
    for ids, _, out in results:
        sel = np.flatnonzero(out["mlm_labels"] != IGNORE_INDEX)
        for s in sel[out["sbo_pos"][sel] == 0]:  # first token of each span decides (all share it)
            m = out["input_ids"][s]
            counts["mask" if m == MASK else "keep" if m == ids[s] else "rand"] += 1
    n = sum(counts.values())
    assert n > 10_000
    assert abs(counts["mask"] / n - 0.8) < 0.01
    assert abs(counts["rand"] / n - 0.1) < 0.01
    assert abs(counts["keep"] / n - 0.1) < 0.01


@pytest.mark.parametrize("mode", ["whole_word", "span"])
def test_never_splits_a_word(mode):
    _, results = run(mode, n_seq=300)
    for ids, ws, out in results:
        wid = words_of(ids, ws)
        sel = out["mlm_labels"] != IGNORE_INDEX
        for w in np.unique(wid[sel]):
            assert sel[wid == w].all(), "word partly masked"


@pytest.mark.parametrize("seq_len,max_word", [(128, 4), (512, 2)])
def test_span_lengths_and_sbo(seq_len, max_word):
    masker, results = run("span", n_seq=800 if seq_len == 128 else 200, seq_len=seq_len, max_word=max_word)
    # The truncated geometric (p=0.2, max 10) that SpanBERT samples from has mean 3.79.
    assert abs(masker.mean_span_length - 3.79) < 0.01
    sampled = masker.sample_span_lengths(np.random.default_rng(0), 100_000)
    assert abs(sampled.mean() - 3.8) < 0.2 and sampled.min() == 1 and sampled.max() == 10
    span_words = []
    for ids, ws, out in results:
        sel = np.flatnonzero(out["mlm_labels"] != IGNORE_INDEX)
        starts = sel[out["sbo_pos"][sel] == 0]
        wid = words_of(ids, ws)
        for k, s in enumerate(starts):
            end = starts[k + 1] if k + 1 < len(starts) else sel[-1] + 1
            span = sel[(sel >= s) & (sel < end)]
            assert (np.diff(span) == 1).all(), "a span is not contiguous"
            assert (out["sbo_pos"][span] == np.arange(len(span))).all()
            assert (out["sbo_left"][span] == max(s - 1, 0)).all()
            assert (out["sbo_right"][span] == min(span[-1] + 1, len(ids) - 1)).all()
            # One 80/10/10 decision per span.
            treat = {("mask" if m == MASK else "keep" if m == o else "rand")
                     for m, o in zip(out["input_ids"][span], ids[span])}
            assert len(treat) == 1 or treat == {"rand", "keep"}  # a random id can equal the original
            span_words.append(len(np.unique(wid[span])))
        unsel = out["mlm_labels"] == IGNORE_INDEX
        assert (out["sbo_left"][unsel] == 0).all() and (out["sbo_pos"][unsel] == 0).all()
    if seq_len == 512:
        # Spans are placed where they fit, so realised lengths follow the distribution; only the last span of a
        # sequence can be cut by the budget (that matters more at 128 tokens, where the budget is ~4 spans).
        assert abs(np.mean(span_words) - 3.8) < 0.2


def test_masks_reproducible_per_seed_epoch_index():
    masker = Masker(VOCAB, MASK, SPECIALS, mode="span")
    ids, ws = make_sequences(1)[0]
    a = masker(ids, ws, mask_rng(7, 2, 11))
    b = masker(ids, ws, mask_rng(7, 2, 11))
    c = masker(ids, ws, mask_rng(7, 3, 11))
    assert all((a[k] == b[k]).all() for k in a)
    assert not (a["mlm_labels"] == c["mlm_labels"]).all()


def test_max_predictions_and_short_sequences():
    masker = Masker(VOCAB, MASK, SPECIALS, max_predictions=5)
    ids = np.r_[CLS, np.arange(10, 110), SEP]
    assert (masker(ids, rng=np.random.default_rng(0))["mlm_labels"] != IGNORE_INDEX).sum() == 5
    # One real token still gets a prediction (max(1, round(0.15))); only specials get none.
    one = Masker(VOCAB, MASK, SPECIALS)(np.array([CLS, 50, SEP]), rng=np.random.default_rng(0))
    assert (one["mlm_labels"] != IGNORE_INDEX).sum() == 1
    none = Masker(VOCAB, MASK, SPECIALS, mode="span")(np.array([CLS, SEP]), np.ones(2), np.random.default_rng(0))
    assert (none["mlm_labels"] == IGNORE_INDEX).all()


def test_bad_settings_raise():
    with pytest.raises(BertforgeError):
        Masker(VOCAB, MASK, SPECIALS, mode="words")
    with pytest.raises(BertforgeError):
        Masker(VOCAB, MASK, SPECIALS, mask_replace=0.9, random_replace=0.2)
    with pytest.raises(BertforgeError):
        Masker(VOCAB, MASK, SPECIALS, mode="whole_word")(np.array([CLS, 9, SEP]))  # no word_start
    with pytest.raises(BertforgeError):
        Masker(VOCAB, MASK, SPECIALS)(np.array([CLS, VOCAB + 3, SEP]))
