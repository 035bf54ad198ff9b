"""Masked-language-model masking: token (BERT), whole-word (BERT-wwm) and span (SpanBERT) modes.

Per sequence exactly round(mlm_probability * non-special tokens) positions are chosen (at least one), as
Google's create_pretraining_data.py does; whole-word and span modes choose whole words and stop short only if no
remaining word fits the budget. Chosen tokens become [MASK] (mask_replace), a random non-special token
(random_replace) or stay unchanged (the rest); span mode draws that choice once per span.

All randomness comes from a numpy Generator; `mask_rng(seed, epoch, index)` gives the one for an example, so
masks are reproducible and a resumed run sees the same masks.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from bertforge.errors import BertforgeError

IGNORE_INDEX = -100
MODES = ("token", "whole_word", "span")


def mask_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator for masking example `index` in `epoch` (a stream apart from example building's)."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1, epoch, index)))


def batch_mask_rng(seed: int, epoch: int, indices: Iterable[int]) -> np.random.Generator:
    """The generator for masking a whole batch of these examples (in this order) in `epoch`: a pure function of
    the batch's content, so any worker, and a resumed run, draws the same masks."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(3, epoch, *map(int, indices))))


class Masker:
    """Choose and corrupt MLM positions of one sequence at a time (see module docstring)."""

    def __init__(self, vocab_size: int, mask_id: int, special_ids: Iterable[int], mlm_probability: float = 0.15,
                 mask_replace: float = 0.8, random_replace: float = 0.1, mode: str = "token",
                 span_p: float = 0.2, span_max: int = 10, max_predictions: int | None = None):
        if mode not in MODES:
            raise BertforgeError(f"masking mode must be one of {', '.join(MODES)}, not {mode!r}")
        if not 0.0 < mlm_probability < 1.0:
            raise BertforgeError(f"mlm_probability must be in (0, 1), got {mlm_probability}")
        if mask_replace < 0 or random_replace < 0 or mask_replace + random_replace > 1.0 + 1e-9:
            raise BertforgeError(f"mask_replace ({mask_replace}) + random_replace ({random_replace}) must be in [0, 1]")
        if not 0.0 < span_p <= 1.0 or span_max < 1:
            raise BertforgeError(f"span_p must be in (0, 1] and span_max >= 1, got {span_p}, {span_max}")
        self.vocab_size, self.mask_id, self.mode = int(vocab_size), int(mask_id), mode
        self.mlm_probability, self.mask_replace, self.random_replace = mlm_probability, mask_replace, random_replace
        self.max_predictions = max_predictions
        self.special_ids = sorted({int(i) for i in special_ids} | {self.mask_id})
        self._is_special = np.zeros(self.vocab_size, bool)
        self._is_special[[i for i in self.special_ids if 0 <= i < self.vocab_size]] = True
        # Random replacements never produce a special token (Google's code can draw [CLS]; that is noise).
        self._normal_ids = np.flatnonzero(~self._is_special)
        # SpanBERT's span-length distribution: geometric(p) truncated to 1..span_max and renormalised (mean 3.8).
        lengths = np.arange(1, span_max + 1)
        probs = span_p * (1 - span_p) ** (lengths - 1)
        self.span_lengths, self.span_probs = lengths, probs / probs.sum()
        self._span_cdf = np.cumsum(self.span_probs)
        self._span_cdf[-1] = 1.0  # no rounding gap at the top

    def is_special(self, ids: np.ndarray) -> np.ndarray:
        """Bool per token: a special token (never masked, shuffled or predicted)."""
        return self._is_special[np.asarray(ids, dtype=np.int64)]

    @property
    def mean_span_length(self) -> float:
        return float((self.span_lengths * self.span_probs).sum())

    def budget(self, n_candidates: int) -> int:
        """How many tokens to predict in a sequence with n_candidates non-special tokens."""
        if n_candidates == 0:
            return 0
        n = max(1, int(round(n_candidates * self.mlm_probability)))
        return min(n, self.max_predictions) if self.max_predictions else n

    def sample_span_lengths(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n span lengths (in words) from the truncated geometric distribution."""
        return self.span_lengths[np.searchsorted(self._span_cdf, rng.random(n), side="right")]

    def __call__(self, input_ids: np.ndarray, word_start: np.ndarray | None = None,
                 rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        """Mask one sequence. Returns input_ids (corrupted copy) and mlm_labels (original id where chosen, -100
        elsewhere); span mode adds sbo_left / sbo_right (positions just outside the span, clamped to the
        sequence) and sbo_pos (position inside the span), 0 where not chosen."""
        ids = np.asarray(input_ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise BertforgeError(f"token id out of range [0, {self.vocab_size}) in the sequence to mask")
        rng = rng if rng is not None else np.random.default_rng()
        special = self._is_special[ids]
        n = self.budget(int((~special).sum()))
        if self.mode == "token":
            chosen = rng.permutation(np.flatnonzero(~special))[:n]
            groups = None
        else:
            if word_start is None:
                raise BertforgeError(f"masking mode {self.mode!r} needs word_start flags")
            w_lo, w_hi = _words(special, np.asarray(word_start, bool))
            groups = (self._whole_words if self.mode == "whole_word" else self._spans)(w_lo, w_hi, n, rng)
            chosen = _expand(groups[0], groups[1])
        out_ids = ids.copy()
        labels = np.full(len(ids), IGNORE_INDEX, np.int64)
        labels[chosen] = ids[chosen]
        # 80/10/10: per token, or (span mode) one draw per span applied to all its tokens.
        if self.mode == "span":
            u = np.repeat(rng.random(len(groups[0])), groups[1] - groups[0])
        else:
            u = rng.random(len(chosen))
        to_mask = chosen[u < self.mask_replace]
        to_random = chosen[(u >= self.mask_replace) & (u < self.mask_replace + self.random_replace)]
        out_ids[to_mask] = self.mask_id
        out_ids[to_random] = self._normal_ids[rng.integers(0, len(self._normal_ids), len(to_random))]
        out = {"input_ids": out_ids, "mlm_labels": labels}
        if self.mode == "span":
            lo, hi = groups  # token spans [lo, hi)
            length = hi - lo
            last = len(ids) - 1
            sbo_left, sbo_right, sbo_pos = (np.zeros(len(ids), np.int64) for _ in range(3))
            sbo_left[chosen] = np.repeat(np.maximum(lo - 1, 0), length)
            sbo_right[chosen] = np.repeat(np.minimum(hi, last), length)
            sbo_pos[chosen] = np.arange(len(chosen)) - np.repeat(np.cumsum(length) - length, length)
            out.update(sbo_left=sbo_left, sbo_right=sbo_right, sbo_pos=sbo_pos)
        return out

    def mask_batch(self, ids: np.ndarray, lengths: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Token mode over a padded batch [B, T] at once (rows hold `lengths` real tokens): the same rule as
        `__call__` per row (exactly `budget` non-special tokens chosen per row, then 80/10/10), drawn as whole-batch
        numpy operations instead of a generator and a permutation per example. Returns input_ids and mlm_labels."""
        if self.mode != "token":
            raise BertforgeError(f"mask_batch: token mode only, not {self.mode!r}")
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise BertforgeError(f"token id out of range [0, {self.vocab_size}) in the sequence to mask")
        B, T = ids.shape
        blocked = self._is_special[ids] | (np.arange(T)[None, :] >= np.asarray(lengths)[:, None])
        n_cand = T - blocked.sum(axis=1)
        n = np.where(n_cand > 0, np.maximum(1, np.rint(n_cand * self.mlm_probability)), 0).astype(np.int64)
        if self.max_predictions:
            n = np.minimum(n, self.max_predictions)
        # a uniformly random subset of n candidates per row: the n smallest of uniform keys (blocked ones last)
        keys = rng.random((B, T))
        keys[blocked] = 2.0
        ranks = np.empty((B, T), np.int64)
        np.put_along_axis(ranks, np.argsort(keys, axis=1, kind="stable"), np.arange(T)[None, :].repeat(B, 0), 1)
        chosen = ranks < n[:, None]
        u = rng.random((B, T))
        to_mask = chosen & (u < self.mask_replace)
        to_random = chosen & (u >= self.mask_replace) & (u < self.mask_replace + self.random_replace)
        out_ids = ids.copy()
        out_ids[to_mask] = self.mask_id
        out_ids[to_random] = self._normal_ids[rng.integers(0, len(self._normal_ids), int(to_random.sum()))]
        return {"input_ids": out_ids, "mlm_labels": np.where(chosen, ids, IGNORE_INDEX)}

    def _whole_words(self, w_lo: np.ndarray, w_hi: np.ndarray, n: int, rng: np.random.Generator):
        """Google's whole-word masking: words in random order, each taken if it still fits the budget."""
        order = rng.permutation(len(w_lo))
        sizes = (w_hi - w_lo)[order]
        cum = np.cumsum(sizes)
        k = int(np.searchsorted(cum, n, side="right"))  # the longest prefix of words that fits
        take = list(order[:k])
        total = int(cum[k - 1]) if k else 0
        for j in range(k, len(order)):  # fill the rest of the budget with later words that still fit
            if total == n:
                break
            if total + sizes[j] <= n:
                take.append(order[j])
                total += int(sizes[j])
        take = np.sort(np.asarray(take, np.int64))
        return w_lo[take], w_hi[take]

    def _spans(self, w_lo: np.ndarray, w_hi: np.ndarray, n: int, rng: np.random.Generator):
        """SpanBERT: draw a span length in words, then a start word from which that many consecutive free words
        follow (never crossing a special token or an earlier span), until the budget is met. Only a span that
        would overshoot the budget is cut short (by whole words), so realised lengths follow the distribution.

        Free words are kept as a short list of runs [s, e), so each span costs a few list operations."""
        n_words = len(w_lo)
        if n == 0 or n_words == 0:
            return w_lo[:0], w_hi[:0]
        prefix = np.concatenate([[0], np.cumsum(w_hi - w_lo)]).tolist()  # tokens in words [0, k)
        cuts = (np.flatnonzero(w_hi[:-1] != w_lo[1:]) + 1).tolist()  # a special token sits before these words
        runs = [[s, e] for s, e in zip([0] + cuts, cuts + [n_words])]
        spans: list[tuple[int, int]] = []
        total = 0
        draws = iter(())
        for _ in range(4 * n_words + 32):  # each pass masks a span or rejects a length; bounded for safety
            left = n - total
            if left <= 0 or not runs:
                break
            try:
                length, u = next(draws)
            except StopIteration:  # draw lengths (inverse CDF) and uniforms in blocks: one numpy call each
                draws = zip(self.sample_span_lengths(rng, 32).tolist(), rng.random(32).tolist())
                length, u = next(draws)
            counts = [max(0, e - s - length + 1) for s, e in runs]
            n_starts = sum(counts)
            if n_starts == 0:
                continue  # no room for this length: draw another
            r = int(u * n_starts)
            k = 0
            while r >= counts[k]:
                r -= counts[k]
                k += 1
            a = runs[k][0] + r
            b = a + length - 1
            if prefix[b + 1] - prefix[a] > left:  # the budget's last tokens
                picked = self._last_span(runs, prefix, length, left, u)
                if picked is None:
                    break
                k, a, b = picked
            s, e = runs.pop(k)
            runs[k:k] = [x for x in ([s, a], [b + 1, e]) if x[1] > x[0]]
            total += prefix[b + 1] - prefix[a]
            spans.append((a, b))
        spans.sort()
        a = np.asarray([s for s, _ in spans], np.int64)
        b = np.asarray([e for _, e in spans], np.int64)
        return w_lo[a], w_hi[b]

    @staticmethod
    def _last_span(runs: list[list[int]], prefix: list[int], length: int, left: int, u: float):
        """(run, first word, last word) of a span that fits the remaining budget: of the drawn length if some
        start allows it, else cut to the whole words that fit; None when not even one word fits."""
        starts, run_of = [], []
        for k, (s, e) in enumerate(runs):
            for a in range(s, e - length + 1):
                if prefix[a + length] - prefix[a] <= left:
                    starts.append(a)
                    run_of.append(k)
        if starts:
            i = int(u * len(starts))
            return run_of[i], starts[i], starts[i] + length - 1
        for k, (s, e) in enumerate(runs):
            for a in range(s, e):
                if prefix[a + 1] - prefix[a] <= left:
                    starts.append(a)
                    run_of.append(k)
        if not starts:
            return None
        i = int(u * len(starts))
        a, k = starts[i], run_of[i]
        b = a
        while b + 1 < runs[k][1] and prefix[b + 2] - prefix[a] <= left:
            b += 1
        return k, a, b


def _words(special: np.ndarray, word_start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Token ranges [lo, hi) of the words of a sequence: a word starts at a word_start flag or after a special
    token, ends before the next word start or special token; special tokens belong to no word."""
    boundary = word_start | special
    boundary[1:] |= special[:-1]
    if len(boundary):
        boundary[0] = True
    b = np.flatnonzero(boundary)
    hi = np.append(b[1:], len(special))
    is_word = ~special[b]
    return b[is_word], hi[is_word]


def _expand(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Concatenate aranges [lo_k, hi_k) without a Python loop."""
    length = hi - lo
    if len(length) == 0:
        return np.zeros(0, np.int64)
    return np.repeat(lo - (np.cumsum(length) - length), length) + np.arange(int(length.sum()))
