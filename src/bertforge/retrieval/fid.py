"""Fusion-in-Decoder (Izacard and Grave 2021): the encoder reads each retrieved passage with the question on its
own (k short inputs, so its cost grows linearly in k), and the decoder attends to all k encodings at once, joined
end to end. Evidence is fused in the decoder's cross-attention rather than by marginalising k answers (RAG).

The generator is bertforge's one encoder-decoder (`model.seq2seq.Seq2SeqLM`): question i's passages are rows
i*k ... i*k+k-1 of `input_ids`, as in RAG, each read as "question: Q title: T context: P" (the paper's format,
`fid_input`). Decoding runs through `generation.search` unchanged (`FusedDecoder` speaks its protocol).
"""
from __future__ import annotations

import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.model.cache import Seq2SeqCache


def fid_input(question: str, title: str, text: str) -> str:
    """One encoder input: the question, then the passage's title and text (the paper's format)."""
    return f"question: {question} title: {title} context: {text}"


def fuse(memory: torch.Tensor, mask: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B*k, S, H] passage encodings and [B*k, S] masks -> [B, k*S, H] and [B, k*S]: each question's k encodings
    joined end to end, for the decoder's cross-attention."""
    rows, S, H = memory.shape
    if rows % k:
        raise BertforgeError(f"the encoder's batch ({rows} rows) is not a multiple of the passages per question "
                             f"(k = {k})")
    return memory.reshape(rows // k, k * S, H), mask.reshape(rows // k, k * S)


class FusionInDecoder(nn.Module):
    """`forward(input_ids [B*k, S], attention_mask, labels [B, T])` -> {"logits" [B, T, V], "loss"}."""

    def __init__(self, generator: nn.Module, n_passages: int):
        super().__init__()
        if n_passages < 1:
            raise BertforgeError(f"n_passages must be >= 1 (got {n_passages})")
        self.generator, self.k = generator, n_passages
        self.config = generator.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor | None = None,
                decoder_input_ids: torch.Tensor | None = None) -> dict:
        memory, mask = fuse(self.generator.encode(input_ids, attention_mask), attention_mask, self.k)
        return self.generator(None, mask, decoder_input_ids=decoder_input_ids, labels=labels,
                              encoder_hidden_states=memory)


class FusedDecoder:
    """Fusion-in-Decoder as a model of the generation protocol: prefill encodes the k passages of each question
    and joins them; the steps are the generator's own."""

    def __init__(self, generator: nn.Module, n_passages: int):
        self.generator, self.k, self.config = generator, n_passages, generator.config

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, max_new_tokens: int):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        memory, mask = fuse(self.generator.encode(input_ids, attention_mask), attention_mask, self.k)
        return self.generator.prefill_encoded(memory, mask, max_new_tokens)

    def step(self, tokens: torch.Tensor, cache: Seq2SeqCache):
        return self.generator.step(tokens, cache)


def generate_fused(generator: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_passages: int,
                   config=None, **options) -> torch.Tensor:
    """Fusion-in-Decoder decoding (greedy, sampled or beam search): [B, 1 + generated]."""
    from bertforge.generation.search import generate_ids

    return generate_ids(FusedDecoder(generator, n_passages), input_ids, attention_mask, config, **options)
