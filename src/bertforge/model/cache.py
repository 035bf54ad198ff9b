"""The key/value cache of a decoder's self-attention: what makes generating a token cost one position, not all.

Keys and values of every layer live in one buffer preallocated for the whole generation ([layers, B, heads,
max_length, d]), so a decoding step writes one slot in place instead of concatenating growing tensors. Every row
has the same length: a batch of prompts of different lengths is left-padded, and `key_mask` (None when nothing is
padded) says which cached positions are real tokens. `reorder` selects (and repeats) rows: beam search keeps the
caches of the beams it continues, and expanding a prompt's cache to B x beams rows is the same call.
"""
from __future__ import annotations

import torch

from bertforge.errors import BertforgeError


class LayerKV:
    """One layer's view of a `KVCache`: what the attention module calls (`update`)."""

    def __init__(self, cache: "KVCache", layer: int):
        self.cache, self.layer = cache, layer

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this call's keys and values [B, heads, t, d] after the cached ones; return all of them so far."""
        return self.cache.update(self.layer, k, v)


class KVCache:
    def __init__(self, n_layers: int, batch: int, n_heads: int, head_dim: int, max_length: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        shape = (n_layers, batch, n_heads, max_length, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0                            # positions filled, the same in every row
        self.key_mask: torch.Tensor | None = None  # [B, max_length] bool, True = a real token; None = no padding
        self.layers = [LayerKV(self, i) for i in range(n_layers)]

    @property
    def batch_size(self) -> int:
        return self.keys.shape[1]

    @property
    def max_length(self) -> int:
        return self.keys.shape[3]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        start, end = self.length, self.length + k.shape[2]
        if end > self.max_length:
            raise BertforgeError(f"the KV cache holds {self.max_length} positions; {end} were asked for")
        self.keys[layer, :, :, start:end] = k
        self.values[layer, :, :, start:end] = v
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def advance(self, n: int) -> None:
        """After every layer has stored `n` new positions."""
        self.length += n

    def set_key_mask(self, attention_mask: torch.Tensor) -> None:
        """Record which of the first attention_mask.shape[1] positions are real tokens (1) or padding (0);
        later positions count as real. Nothing is stored when nothing is padded (the unmasked fast path)."""
        if self.key_mask is None and bool(attention_mask.all()):
            return
        if self.key_mask is None:
            self.key_mask = torch.ones(self.batch_size, self.max_length, dtype=torch.bool,
                                       device=self.keys.device)
        self.key_mask[:, :attention_mask.shape[1]] = attention_mask.bool()

    def reorder(self, index: torch.Tensor) -> "KVCache":
        """Keep rows `index` (in that order, repeats allowed): beam search's choice of beams, or B -> B x beams."""
        n = self.length
        if len(index) == self.batch_size:  # in place: no new buffer per step
            self.keys[:, :, :, :n] = self.keys[:, index, :, :n]
            self.values[:, :, :, :n] = self.values[:, index, :, :n]
        else:
            self.keys, self.values = self.keys[:, index], self.values[:, index]
        if self.key_mask is not None:
            self.key_mask = self.key_mask[index]
        return self


class Seq2SeqCache:
    """An encoder-decoder's decoding state: the decoder's self-attention `KVCache`, and per layer the keys and
    values of the encoder's output for cross-attention (projected once, in prefill), with the encoder's padding
    mask. `reorder` keeps / repeats rows of all of them (beam search), as `KVCache.reorder` does."""

    def __init__(self, self_attn: KVCache, cross: list[tuple[torch.Tensor, torch.Tensor]],
                 cross_mask: torch.Tensor | None, max_new_tokens: int):
        self.self_attn, self.cross, self.cross_mask = self_attn, cross, cross_mask
        self.max_new_tokens = max_new_tokens  # the step that must end in a forced eos (BART), if any
        self.sources = torch.arange(self_attn.batch_size, device=self_attn.keys.device)  # row -> its source

    @property
    def length(self) -> int:
        """Decoder positions so far (the start token included)."""
        return self.self_attn.length

    def reorder(self, index: torch.Tensor) -> "Seq2SeqCache":
        self.self_attn.reorder(index)
        sources = self.sources[index]
        if len(sources) == len(self.sources) and bool((sources == self.sources).all()):
            return self  # beams moved within their source (every step of beam search): the cross rows stay
        self.sources = sources
        self.cross = [(k[index], v[index]) for k, v in self.cross]
        if self.cross_mask is not None:
            self.cross_mask = self.cross_mask[index]
        return self
