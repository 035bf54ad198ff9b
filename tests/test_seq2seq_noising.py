"""T5 span corruption and BART text infilling / sentence permutation (bertforge.data.noising): statistics over many
draws, exact reconstruction, determinism."""
import numpy as np
import pytest

from bertforge.data.masking import mask_rng
from bertforge.data.noising import (BartNoise, SpanCorruption, TextInfilling, fill_masks, fill_sentinels,
                                    permute_sentences, poisson_span_lengths, random_spans_noise_mask, t5_lengths)
from bertforge.errors import BertforgeError

SENTINELS = list(range(999, 899, -1))  # <extra_id_0> is the highest id, as in T5's vocabulary
EOS, MASK, BOS = 1, 4, 0


def _runs(mask: np.ndarray) -> list[int]:
    """Lengths of the True runs of a bool array."""
    padded = np.concatenate([[False], mask, [False]]).astype(int)
    d = np.diff(padded)
    return list(np.flatnonzero(d == -1) - np.flatnonzero(d == 1))


def test_noise_mask_share_and_mean_span_over_many_draws():
    rng = np.random.default_rng(0)
    shares, spans = [], []
    for _ in range(2000):
        m = random_spans_noise_mask(114, 0.15, 3.0, rng)
        assert m.shape == (114,) and not m[0] and m[-1]  # starts with a gap, ends with a span
        shares.append(m.mean())
        spans += _runs(m)
    assert int(round(114 * 0.15)) == 17 and all(abs(s - 17 / 114) < 1e-12 for s in shares)  # exact per sequence
    assert np.mean(spans) == pytest.approx(17 / 6, abs=1e-9)  # round(17 / 3) = 6 spans of 17 noise tokens
    rng = np.random.default_rng(1)
    lengths = [r for _ in range(2000) for r in _runs(random_spans_noise_mask(512, 0.15, 3.0, rng))]
    assert np.mean(lengths) == pytest.approx(77 / 26, abs=1e-9)  # 77 noise tokens in 26 spans
    shares, lengths = [], []  # over many lengths the roundings average out: 15% noise, mean span 3
    for n in rng.integers(100, 1000, 3000):
        m = random_spans_noise_mask(int(n), 0.15, 3.0, rng)
        shares.append(m.mean())
        lengths += _runs(m)
    assert np.mean(shares) == pytest.approx(0.15, abs=0.002)
    assert np.mean(lengths) == pytest.approx(3.0, abs=0.03)
    assert max(lengths) > 8  # lengths vary (uniform segmentation), not fixed 3s


def test_span_corruption_reconstructs_and_matches_t5_lengths():
    sc = SpanCorruption(SENTINELS, EOS)
    raw, target_len = t5_lengths(512)
    assert (raw, target_len) == (568, 114)  # T5's own numbers for inputs_length=512
    raw, target_len = t5_lengths(128)
    for i in range(200):
        ids = np.random.default_rng(i).integers(10, 800, raw)
        out = sc(ids, mask_rng(0, 0, i))
        assert len(out["input_ids"]) <= 128 and len(out["labels"]) <= target_len
        assert out["input_ids"][-1] == EOS and out["labels"][-1] == EOS
        n = int(np.isin(out["input_ids"], SENTINELS).sum())
        assert list(out["labels"][np.isin(out["labels"], SENTINELS)]) == SENTINELS[:n]  # in order, from 0
        assert list(out["input_ids"][np.isin(out["input_ids"], SENTINELS)]) == SENTINELS[:n]
        assert fill_sentinels(out["input_ids"], out["labels"], SENTINELS, EOS) == list(ids)
    a, b = sc(np.arange(10, 200), mask_rng(3, 1, 7)), sc(np.arange(10, 200), mask_rng(3, 1, 7))
    assert all(np.array_equal(a[k], b[k]) for k in a)  # a pure function of (seed, epoch, index)
    assert not np.array_equal(a["labels"], sc(np.arange(10, 200), mask_rng(3, 2, 7))["labels"])


def test_span_corruption_refuses_too_few_sentinels_and_bad_options():
    with pytest.raises(BertforgeError, match="sentinel"):
        SpanCorruption(SENTINELS[:2], EOS)(np.arange(10, 300), np.random.default_rng(0))
    with pytest.raises(BertforgeError, match="noise_density"):
        SpanCorruption(SENTINELS, EOS, noise_density=1.5)
    with pytest.raises(BertforgeError, match="sentinel"):
        SpanCorruption([], EOS)


def test_poisson_lengths_mean_and_zero_share():
    rng = np.random.default_rng(0)
    lengths = np.concatenate([poisson_span_lengths(10_000, rng)[:-1] for _ in range(20)])  # the last one is cut
    assert lengths.mean() == pytest.approx(3.0, abs=0.05)
    assert (lengths == 0).mean() == pytest.approx(np.exp(-3.0), abs=0.01)  # 0-length spans: insertions
    for n in (1, 7, 38, 500):
        assert poisson_span_lengths(n, rng).sum() == n


def test_text_infilling_share_reconstruction_and_insertions():
    ti = TextInfilling(MASK)
    rng = np.random.default_rng(0)
    removed, masks, inserted, n_spans, total = 0, 0, 0, 0, 0
    for i in range(1000):
        ids = rng.integers(10, 800, 126)
        noised, spans = ti(ids, mask_rng(0, 0, i))
        assert fill_masks(noised, spans, MASK) == list(ids)
        assert sum(len(s) for s in spans) == int(np.ceil(126 * 0.3))  # exactly ceil(30%) per sequence
        assert int((noised == MASK).sum()) == len(spans)  # one <mask> per span
        removed += sum(len(s) for s in spans)
        inserted += sum(len(s) == 0 for s in spans)
        n_spans += len(spans)
        total += len(ids)
        masks += len(spans)
    assert removed / total == pytest.approx(0.3, abs=0.01)
    assert removed / n_spans == pytest.approx(38 / (38 / 3 + 1) * 1.0, rel=0.15)  # ~ Poisson mean, last span cut
    assert inserted / n_spans == pytest.approx(np.exp(-3.0), abs=0.02)


def test_sentence_permutation_keeps_sentences():
    ids = np.arange(30)
    starts = [0, 5, 12, 20]
    seen = set()
    for i in range(50):
        out = permute_sentences(ids, starts, np.random.default_rng(i))
        assert sorted(out) == list(ids)
        pieces = {tuple(ids[a:b]) for a, b in zip(starts, starts[1:] + [30])}
        cuts = [0] + [j for j in range(1, 30) if out[j] != out[j - 1] + 1] + [30]
        assert {tuple(out[a:b]) for a, b in zip(cuts, cuts[1:])} <= pieces | {tuple(ids[a:c]) for a in starts
                                                                              for c in range(a + 1, 31)}
        seen.add(tuple(out))
    assert len(seen) > 10  # 4! = 24 orders
    assert list(permute_sentences(ids, [0], np.random.default_rng(0))) == list(ids)


def test_bart_noise_wraps_and_targets_the_original():
    noise = BartNoise(BOS, EOS, MASK)
    ids = np.arange(10, 60)
    out = noise(ids, [0, 10, 25, 40], mask_rng(0, 0, 0))
    assert list(out["labels"]) == [BOS, *ids, EOS]
    assert out["input_ids"][0] == BOS and out["input_ids"][-1] == EOS and MASK in out["input_ids"]
    again = noise(ids, [0, 10, 25, 40], mask_rng(0, 0, 0))
    assert np.array_equal(out["input_ids"], again["input_ids"])
    no_perm = BartNoise(BOS, EOS, MASK, permute_sentences=0.0)(ids, [0, 10, 25, 40], mask_rng(0, 0, 1))
    kept = [t for t in no_perm["input_ids"][1:-1] if t != MASK]
    assert kept == sorted(kept)  # without permutation the surviving tokens keep their order
