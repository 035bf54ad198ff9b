"""Denoising objectives of the encoder-decoders: T5's span corruption and BART's text infilling and sentence
permutation. Each works on one sequence of token ids (numpy) with a numpy Generator, so an example's noise is a
pure function of (seed, epoch, index) through `bertforge.data.masking.mask_rng`, as the MLM masks are.

T5 (Raffel et al. 2020, sec. 3.1.4; `random_spans_noise_mask` of t5.data.preprocessors): round(15%) of the tokens
are noise, in round(noise / 3) spans; the span lengths and the gaps between them are uniformly random segmentations,
the sequence starts with a gap and ends with a span. Each noise span becomes one sentinel <extra_id_k> in the input
(k counts up from 0); the target is every sentinel followed by the span it replaced, then eos:

    input:  Thank you <extra_id_0> me to your party <extra_id_1> week . </s>
    target: <extra_id_0> for inviting <extra_id_1> last </s>

BART (Lewis et al. 2020, sec. 2.2; fairseq's DenoisingDataset with replace_length=1): the sentences are shuffled
(sentence permutation), then ceil(30%) of the tokens are masked in spans whose lengths are drawn from Poisson(3)
until they cover that many (the last one cut to fit); each span becomes ONE <mask>, and a 0-length span inserts a
<mask> where nothing was removed, so the model must also learn how many tokens are missing. The target is the
original text. Unlike fairseq, spans never overlap or touch (when there is room), so every <mask> stands for exactly
one recorded span and the noise share is exact.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bertforge.errors import BertforgeError

# ---- T5 span corruption ------------------------------------------------------------------------------------------


def _random_segmentation(num_items: int, num_segments: int, rng: np.random.Generator) -> np.ndarray:
    """Split num_items into num_segments positive parts, uniformly over all such splits (T5's construction)."""
    first_in_segment = np.zeros(num_items, bool)
    first_in_segment[1:] = rng.permutation(np.arange(num_items - 1) < num_segments - 1)
    return np.bincount(np.cumsum(first_in_segment), minlength=num_segments)


def random_spans_noise_mask(length: int, noise_density: float, mean_noise_span_length: float,
                            rng: np.random.Generator) -> np.ndarray:
    """Bool [length]: True on noise. round(length * density) noise tokens (at least 1, at most length - 1) in
    round(noise / mean span) spans (at least 1); the sequence starts with non-noise and ends with noise."""
    if length < 2:  # nothing to split: T5 pads to 2 and cuts back, which leaves the one token as non-noise
        return np.zeros(length, bool)
    num_noise = min(max(int(round(length * noise_density)), 1), length - 1)
    num_spans = max(int(round(num_noise / mean_noise_span_length)), 1)
    num_spans = min(num_spans, num_noise, length - num_noise)  # each span and each gap needs at least one token
    noise_lengths = _random_segmentation(num_noise, num_spans, rng)
    gap_lengths = _random_segmentation(length - num_noise, num_spans, rng)
    interleaved = np.stack([gap_lengths, noise_lengths], 1).reshape(-1)  # gap, span, gap, span, ...
    return np.repeat(np.arange(2 * num_spans) % 2 == 1, interleaved)


def t5_lengths(inputs_length: int, noise_density: float = 0.15,
               mean_noise_span_length: float = 3.0) -> tuple[int, int]:
    """(raw tokens to take, target length) so that span-corrupting the raw tokens gives an input of at most
    `inputs_length` tokens, eos included (T5's compute_input_and_target_lengths: 568 raw -> 512 in, 114 out)."""

    def lengths(raw: int) -> tuple[int, int]:
        noise = int(round(raw * noise_density))
        spans = int(round(noise / mean_noise_span_length))
        return raw - noise + spans + 1, noise + spans + 1

    raw = 1
    while lengths(raw + 1)[0] <= inputs_length:
        raw += 1
    return raw, lengths(raw)[1]


@dataclass(frozen=True)
class SpanCorruption:
    """T5's objective on one sequence: `__call__(ids, rng)` -> {"input_ids", "labels"} (eos-terminated)."""

    sentinel_ids: Sequence[int]   # <extra_id_0>, <extra_id_1>, ... in that order
    eos_id: int
    noise_density: float = 0.15
    mean_noise_span_length: float = 3.0

    def __post_init__(self) -> None:
        if not 0.0 < self.noise_density < 1.0:
            raise BertforgeError(f"noise_density must be in (0, 1), got {self.noise_density}")
        if self.mean_noise_span_length < 1.0:
            raise BertforgeError(f"mean_noise_span_length must be >= 1, got {self.mean_noise_span_length}")
        if not self.sentinel_ids:
            raise BertforgeError("span corruption needs sentinel tokens (<extra_id_0>, ...); the tokenizer has none")

    def __call__(self, ids: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
        ids = np.asarray(ids, np.int64)
        noise = random_spans_noise_mask(len(ids), self.noise_density, self.mean_noise_span_length, rng)
        return {"input_ids": self._replace_spans(ids, noise), "labels": self._replace_spans(ids, ~noise)}

    def _replace_spans(self, ids: np.ndarray, drop: np.ndarray) -> np.ndarray:
        """Each run of `drop` becomes the next sentinel; eos appended."""
        starts = drop & ~np.concatenate([[False], drop[:-1]])
        n = int(starts.sum())
        if n > len(self.sentinel_ids):
            raise BertforgeError(f"{n} noise spans but only {len(self.sentinel_ids)} sentinel tokens: use a shorter "
                                 "sequence length or a tokenizer with more sentinels")
        out = ids.copy()
        out[starts] = np.asarray(self.sentinel_ids, np.int64)[:n]
        keep = ~drop | starts
        return np.concatenate([out[keep], [self.eos_id]])


def fill_sentinels(input_ids: Sequence[int], labels: Sequence[int], sentinel_ids: Sequence[int],
                   eos_id: int) -> list[int]:
    """Undo span corruption: each sentinel of the input replaced by what follows it in the target. Only the final
    eos of each is dropped (an eos inside is text: the separator of two packed documents)."""
    strip = lambda ids: [int(t) for t in ids][:-1] if len(ids) and int(ids[-1]) == eos_id else [int(t) for t in ids]  # noqa: E731
    sentinel_index = {int(s): k for k, s in enumerate(sentinel_ids)}
    spans: dict[int, list[int]] = {}
    current = None
    for t in strip(labels):
        if t in sentinel_index:
            current = sentinel_index[t]
            spans[current] = []
        elif current is not None:
            spans[current].append(t)
    out: list[int] = []
    for t in strip(input_ids):
        out.extend(spans.get(sentinel_index[t], []) if t in sentinel_index else [t])
    return out


# ---- BART text infilling and sentence permutation ----------------------------------------------------------------


def poisson_span_lengths(num_to_mask: int, rng: np.random.Generator, lam: float = 3.0) -> np.ndarray:
    """Span lengths drawn from Poisson(lam) until they cover num_to_mask tokens, the last cut so that they sum to
    exactly num_to_mask (fairseq's span-poisson; zeros are kept: each one is an insertion)."""
    if num_to_mask <= 0:
        return np.zeros(0, np.int64)
    drawn: list[np.ndarray] = []
    total = 0
    while total < num_to_mask:
        chunk = rng.poisson(lam, size=max(num_to_mask, 8))
        drawn.append(chunk)
        total += int(chunk.sum())
    lengths = np.concatenate(drawn)
    cum = np.cumsum(lengths)
    last = int(np.searchsorted(cum, num_to_mask))  # the first span that reaches the budget
    lengths = lengths[:last + 1].copy()
    lengths[last] = num_to_mask - (int(cum[last - 1]) if last else 0)
    return lengths


def _stars_and_bars(total: int, parts: int, rng: np.random.Generator) -> np.ndarray:
    """`total` split into `parts` non-negative integers, uniformly over all such splits."""
    if parts == 1:
        return np.array([total], np.int64)
    bars = np.sort(rng.choice(total + parts - 1, parts - 1, replace=False))
    edges = np.concatenate([[-1], bars, [total + parts - 1]])
    return np.diff(edges) - 1


@dataclass(frozen=True)
class TextInfilling:
    """BART's text infilling on one sequence: `__call__(ids, rng)` -> (noised ids, the removed spans in order).

    ceil(mask_ratio * len) tokens are removed in Poisson(poisson_lambda) spans; each span (0-length ones too)
    becomes one `mask_id`. Spans are kept apart by at least one token when the sequence has room."""

    mask_id: int
    mask_ratio: float = 0.3
    poisson_lambda: float = 3.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.mask_ratio < 1.0:
            raise BertforgeError(f"mask_ratio must be in [0, 1), got {self.mask_ratio}")
        if self.poisson_lambda <= 0:
            raise BertforgeError(f"poisson_lambda must be positive, got {self.poisson_lambda}")

    def __call__(self, ids: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, list[np.ndarray]]:
        ids = np.asarray(ids, np.int64)
        n = len(ids)
        lengths = rng.permutation(poisson_span_lengths(int(math.ceil(n * self.mask_ratio)), rng,
                                                       self.poisson_lambda))
        k = len(lengths)
        if k == 0:
            return ids.copy(), []
        free = n - int(lengths.sum())
        # gaps before, between and after the spans; inner gaps of at least one token where there is room
        floor = np.zeros(k + 1, np.int64)
        if free >= k - 1:
            floor[1:k] = 1
        gaps = floor + _stars_and_bars(free - int(floor.sum()), k + 1, rng)
        pieces: list[np.ndarray] = []
        spans: list[np.ndarray] = []
        pos = 0
        for gap, length in zip(gaps[:-1], lengths):
            pieces += [ids[pos:pos + gap], np.array([self.mask_id])]
            spans.append(ids[pos + gap:pos + gap + length])
            pos += gap + length
        pieces.append(ids[pos:])
        return np.concatenate(pieces), spans


def fill_masks(noised: Sequence[int], spans: Sequence[Sequence[int]], mask_id: int) -> list[int]:
    """Undo text infilling: the k-th <mask> replaced by the k-th removed span."""
    out: list[int] = []
    k = 0
    for t in noised:
        if int(t) == mask_id:
            out.extend(int(x) for x in spans[k])
            k += 1
        else:
            out.append(int(t))
    return out


def permute_sentences(ids: np.ndarray, sentence_starts: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """The sentences of `ids` (sentence k runs from sentence_starts[k] to the next start) in a random order."""
    ids = np.asarray(ids, np.int64)
    bounds = sorted({0, *(int(s) for s in sentence_starts if 0 < int(s) < len(ids))}) + [len(ids)]
    sentences = [ids[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    if len(sentences) < 2:
        return ids.copy()
    return np.concatenate([sentences[i] for i in rng.permutation(len(sentences))])


@dataclass(frozen=True)
class BartNoise:
    """BART's pretraining noise on one text (no <s> / </s>): sentence permutation (with probability
    `permute_sentences`, fairseq's --permute-sentences 1.0 for the released model), then text infilling.
    `__call__(ids, sentence_starts, rng)` -> {"input_ids": <s> noised </s>, "labels": <s> original </s>}."""

    bos_id: int
    eos_id: int
    mask_id: int
    mask_ratio: float = 0.3
    poisson_lambda: float = 3.0
    permute_sentences: float = 1.0

    def __call__(self, ids: np.ndarray, sentence_starts: Sequence[int],
                 rng: np.random.Generator) -> dict[str, np.ndarray]:
        ids = np.asarray(ids, np.int64)
        source = permute_sentences(ids, sentence_starts, rng) if rng.random() < self.permute_sentences else ids
        noised, _ = TextInfilling(self.mask_id, self.mask_ratio, self.poisson_lambda)(source, rng)
        wrap = lambda x: np.concatenate([[self.bos_id], x, [self.eos_id]]).astype(np.int64)  # noqa: E731
        return {"input_ids": wrap(noised), "labels": wrap(ids)}
