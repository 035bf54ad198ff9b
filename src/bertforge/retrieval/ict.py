"""The Inverse Cloze Task (Lee et al. 2019, ORQA): a retriever pretrained on raw text alone. The text is cut into
blocks of consecutive sentences; an example is a random sentence of a block as the question and the block as its
passage, the sentence removed from it with probability 0.9 (kept with 0.1, so that the towers also learn that word
overlap counts); the other blocks of the batch are the negatives.

Each example is drawn from (seed, epoch, block) alone, so a resumed run sees the same examples as an uninterrupted one
and every epoch draws new sentences."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from bertforge.data.corpus import split_sentences
from bertforge.retrieval.dpr import RetrievalExample

REMOVE_PROB = 0.9  # ORQA's share of examples whose question is removed from its block


def make_blocks(documents: Iterable[str], tokenizer: Any, max_tokens: int) -> list[tuple[str, ...]]:
    """Blocks of consecutive sentences of each document, each at most `max_tokens` tokens (a longer sentence is a
    block of its own, cut when encoded); only blocks of two sentences or more are kept (one sentence has no
    context to find it in)."""
    blocks: list[tuple[str, ...]] = []
    for text in documents:
        sentences = [s for s in split_sentences(text) if s.strip()]
        if len(sentences) < 2:
            continue
        ids = tokenizer(sentences, padding=False, truncation=False, return_tensors=None)["input_ids"]
        lengths = [max(len(row) - 2, 1) for row in ids]  # without [CLS] / [SEP]
        block: list[str] = []
        size = 0
        for sentence, n in zip(sentences, lengths):
            if block and size + n > max_tokens:
                if len(block) >= 2:
                    blocks.append(tuple(block))
                block, size = [], 0
            block.append(sentence)
            size += n
        if len(block) >= 2:
            blocks.append(tuple(block))
    return blocks


def ict_example(block: tuple[str, ...], rng: np.random.Generator, remove_prob: float = REMOVE_PROB
                ) -> RetrievalExample:
    """One ICT example of `block`: a random sentence as the question, the block as the passage (without that
    sentence with probability `remove_prob`)."""
    i = int(rng.integers(len(block)))
    keep = rng.random() >= remove_prob
    passage = block if keep else block[:i] + block[i + 1:]
    return RetrievalExample(block[i], " ".join(passage))


class ICTDataset:
    """ICT examples, one per block, drawn anew every epoch from (seed, epoch, block index)."""

    def __init__(self, blocks: list[tuple[str, ...]], seed: int = 0, remove_prob: float = REMOVE_PROB):
        self.blocks, self.seed, self.remove_prob = blocks, int(seed), remove_prob
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, k: int) -> RetrievalExample:
        rng = np.random.default_rng([self.seed, self.epoch, int(k)])
        return ict_example(self.blocks[k], rng, self.remove_prob)
