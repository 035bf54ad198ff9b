"""Encoder-decoder pretraining examples over sharded corpora: T5's span corruption and BART's denoising.

`Seq2SeqPretrainingDataset` plans examples with the encoders' builders (`data.examples`) and returns clean token
ranges; `Seq2SeqCollator` noises them (`data.noising`) with `mask_rng(seed, epoch, index)`, so the noise changes
every epoch (dynamic, as T5 and BART train) and a resumed run sees the same noise. Batches are
{input_ids, attention_mask, labels} with labels -100 on padding: what `Seq2SeqLM.forward` takes.

  span-corruption  (T5) contiguous text packed across documents (a </s> at each join), `raw_length` tokens per
                   example, chosen by `noising.t5_lengths` so that the corrupted input, </s> included, fits
                   `seq_len` (T5: 568 -> 512)
  infilling        (BART) blocks of whole sentences of one document, at most seq_len - 2 tokens (fairseq's
                   "complete_doc" blocks; a longer sentence is cut into pieces of that size), <s> ... </s> around the
                   noised text and the target
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from bertforge.data.dataset import PlannedDataset
from bertforge.data.examples import ExamplePlan, FullSentences, plan_rng
from bertforge.data.masking import IGNORE_INDEX, mask_rng
from bertforge.data.noising import BartNoise, SpanCorruption, t5_lengths
from bertforge.errors import BertforgeError

# T5's span corruption (text packed across documents) and BART's text infilling + sentence permutation (blocks of
# one document's sentences).
SPAN_CORRUPTION, INFILLING = "span-corruption", "infilling"
SEQ2SEQ_NOISES = (SPAN_CORRUPTION, INFILLING)


class Seq2SeqPretrainingDataset(PlannedDataset):
    """Clean examples (`ids`, the text's token ids; `sentence_starts`, where its sentences begin) of a corpus."""

    def __init__(self, corpus, noise: str, seq_len: int, seed: int = 0):
        if noise not in SEQ2SEQ_NOISES:
            raise BertforgeError(f"unknown seq2seq noise {noise!r} (choose from {', '.join(SEQ2SEQ_NOISES)})")
        if seq_len < 16:
            raise BertforgeError(f"--seq-len {seq_len} is too short for {noise} pretraining (at least 16)")
        self.corpus, self.noise, self.seq_len, self.seed, self.epoch = corpus, noise, int(seq_len), int(seed), 0
        if noise == SPAN_CORRUPTION:
            self.raw_length, self.target_length = t5_lengths(seq_len)
            builder = FullSentences(self.raw_length + 2)  # the builder keeps 2 slots for [CLS] / [SEP]: unused here
            self.plan = builder.plan(corpus, plan_rng(self.seed, 0))
        else:
            self.raw_length, self.target_length = seq_len - 2, seq_len
            self.plan = sentence_blocks(corpus, self.raw_length)
        if len(self.plan) == 0:
            raise BertforgeError(f"{noise} pretraining: the corpus gives no examples ({corpus!r})")
        _, starts, _ = corpus.sentence_spans()
        self._sentence_starts = np.asarray(starts, np.int64)

    def __getitem__(self, index: int) -> dict[str, Any]:
        index = self.checked(index)
        pieces, starts, pos = [], [0], 0
        for s, e, _, sep_before in self.plan.ranges(index):
            if sep_before:  # a document join (t5's packing): </s> ends the document before
                pieces.append(np.array([self.corpus.sep_id], np.int64))
                pos += 1
                starts.append(pos)
            inner = self._sentence_starts[np.searchsorted(self._sentence_starts, s, side="right"):
                                          np.searchsorted(self._sentence_starts, e, side="left")]
            starts += (inner - s + pos).tolist()
            pieces.append(np.asarray(self.corpus.tokens(s, e), np.int64))
            pos += e - s
        return {"index": index, "ids": np.concatenate(pieces), "sentence_starts": starts}


def sentence_blocks(corpus, capacity: int) -> ExamplePlan:
    """Each document's sentences packed greedily into blocks of at most `capacity` tokens, whole sentences only
    (a sentence longer than `capacity` alone is cut into capacity-sized pieces)."""
    doc_ptr, starts, ends = (a.tolist() for a in corpus.sentence_spans())
    blocks: list[tuple[int, int]] = []
    for d in range(len(doc_ptr) - 1):
        lo = hi = None
        for k in range(doc_ptr[d], doc_ptr[d + 1]):
            s, e = starts[k], ends[k]
            if lo is not None and e - lo > capacity:  # the sentence does not fit: close the block
                blocks.append((lo, hi))
                lo = None
            if lo is None:
                while e - s > capacity:  # an over-long sentence: full pieces, the rest starts a block
                    blocks.append((s, s + capacity))
                    s += capacity
                lo = s
            hi = e
        if lo is not None and hi > lo:
            blocks.append((lo, hi))
    n = len(blocks)
    return ExamplePlan(np.arange(n + 1, dtype=np.int64), np.array([b[0] for b in blocks], np.int64),
                       np.array([b[1] for b in blocks], np.int64), np.zeros(n, np.int8), np.zeros(n, bool),
                       np.full(n, -1, np.int8))


class Seq2SeqCollator:
    """Noise clean examples and pad them into {input_ids, attention_mask, labels}."""

    def __init__(self, noise: SpanCorruption | BartNoise, pad_id: int, seed: int = 0, epoch: int = 0,
                 max_source: int | None = None):
        self.noise, self.pad_id, self.seed, self.epoch, self.max_source = noise, int(pad_id), int(seed), int(epoch), \
            max_source

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not examples:
            raise BertforgeError("collate: empty batch")
        rows = []
        for ex in examples:
            rng = mask_rng(self.seed, self.epoch, int(ex["index"]))
            if isinstance(self.noise, SpanCorruption):
                rows.append(self.noise(ex["ids"], rng))
            else:
                rows.append(self.noise(ex["ids"], ex["sentence_starts"], rng))
        if self.max_source is not None:  # BART's insertions can lengthen a text: keep its </s>, drop what is over
            for r in rows:
                if len(r["input_ids"]) > self.max_source:
                    r["input_ids"] = np.concatenate([r["input_ids"][:self.max_source - 1], r["input_ids"][-1:]])
        return pad_pairs([r["input_ids"] for r in rows], [r["labels"] for r in rows], self.pad_id)


def pad_pairs(sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]],
              pad_id: int) -> dict[str, torch.Tensor]:
    """(source, target) id lists -> input_ids and attention_mask (padded with pad_id), labels (padded with -100)."""
    width = max(len(s) for s in sources)
    t_width = max(len(t) for t in targets)
    ids = np.full((len(sources), width), pad_id, np.int64)
    labels = np.full((len(targets), t_width), IGNORE_INDEX, np.int64)
    for r, (s, t) in enumerate(zip(sources, targets)):
        ids[r, :len(s)] = s
        labels[r, :len(t)] = t
    lengths = torch.tensor([len(s) for s in sources])
    return {"input_ids": torch.from_numpy(ids),
            "attention_mask": (torch.arange(width)[None, :] < lengths[:, None]).long(),
            "labels": torch.from_numpy(labels)}


def make_noise(noise: str, tokenizer_ids: dict[str, Any], noise_density: float = 0.15,
               mean_span: float = 3.0) -> SpanCorruption | BartNoise:
    """The noise function of `noise` (SPAN_CORRUPTION: T5's, at `noise_density` with mean span `mean_span`;
    INFILLING: BART's, `noise_density` of the tokens in Poisson(`mean_span`) spans + sentence permutation), for a
    tokenizer described by `tokenizer_ids` (sentinel_ids, eos_id; bos_id, mask_id)."""
    if noise == SPAN_CORRUPTION:
        return SpanCorruption(tokenizer_ids["sentinel_ids"], tokenizer_ids["eos_id"], noise_density, mean_span)
    if tokenizer_ids.get("mask_id") is None:
        raise BertforgeError("text infilling needs a tokenizer with a <mask> token (byte-level BPE, as BART's)")
    return BartNoise(tokenizer_ids["bos_id"], tokenizer_ids["eos_id"], tokenizer_ids["mask_id"], noise_density,
                     mean_span)
