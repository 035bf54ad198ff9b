"""Sparse long attention as an attention choice of the one encoder: Longformer's sliding window + global tokens.

`Encoder.forward` calls `sparse.prepare` when the config's family is sparse (`Family.sparse_attention`); it returns a
`SparseLayout`, which travels down the layers in place of the boolean mask, and every layer's self-attention
(`LongformerSelfAttention` here, `block_sparse.BigBirdSelfAttention`) reads it. The maths goes through
`attention.attend` like every other attention, on blocks with the batch folded, so nothing T x T is built:

- local (Beltagy et al. 2020; transformers' `LongformerSelfAttention`): query i sees the keys j with
  |i - j| <= w / 2 (w: the layer's `attention_window`) that are real tokens and not global, plus every global
  token's key, all with the `query` / `key` / `value` projections. Computed as blocks of w / 2 queries against the
  3 blocks of keys around them (3 w / 2 keys, a band mask) + the G global keys: memory B x heads x T x (3w/2 + G).
- global: a global token's row is recomputed with `query_global` / `key_global` / `value_global` against every
  real key (G x T) and replaces its local row.
- a padding query's output is zero (transformers' convention), so no row is ever empty (an empty row is NaN).

The inputs (`SparseLayout`, `prepare`) live in `model.sparse`; BigBird's block-sparse layer in `model.block_sparse`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.config import ModelConfig
from bertforge.errors import BertforgeError
from bertforge.families.family import BLOCK_SPARSE, SLIDING_WINDOW
from bertforge.model.attention import SelfAttention, attend
from bertforge.model.sparse.bigbird import BigBirdSelfAttention
from bertforge.model.sparse.layout import SparseLayout, SparseProjection, gather_rows


class LongformerSelfAttention(SparseProjection, SelfAttention):
    """transformers' `LongformerSelfAttention`: `query` / `key` / `value` for the sliding window and the keys of
    global tokens, `query_global` / `key_global` / `value_global` for the global tokens' own rows."""

    def __init__(self, cfg: ModelConfig, attn_implementation: str = "sdpa", n_heads: int | None = None,
                 index: int = 0):
        super().__init__(cfg, attn_implementation, n_heads)
        h, inner = cfg.hidden_size, self.n_heads * cfg.head_dim
        self.query_global, self.key_global, self.value_global = (nn.Linear(h, inner), nn.Linear(h, inner),
                                                                 nn.Linear(h, inner))
        self.half_window = cfg.attention_window[index] // 2

    def forward(self, x: torch.Tensor, mask, eager: bool = False, head_mask: torch.Tensor | None = None,
                kv_cache=None, rotary=None):
        if not isinstance(mask, SparseLayout):
            raise BertforgeError("Longformer attention runs inside its Encoder (the layout comes from "
                                 "model.sparse.prepare)")
        B, T, _ = x.shape
        h, d, w = self.n_heads, self.head_dim, self.half_window
        eager = eager or self.attn_implementation == "eager"
        p = self.dropout_p if self.training else 0.0
        q, k, v = self.project(x).view(B, T, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)  # [B, h, T, d]
        n = -(-T // w)  # blocks of w queries; block c sees the keys of blocks c-1, c, c+1
        extra = n * w - T
        keep, index, valid = mask.keep, mask.global_index, mask.global_valid
        # keys a local row may see in its window: real and not global (global keys come as their own columns)
        local = keep if mask.is_global is None else keep & ~mask.is_global
        key_ok = F.pad(local, (w, extra + w), value=False).unfold(1, 3 * w, w)  # [B, n, 3w]
        keys = F.pad(k, (0, 0, w, extra + w)).unfold(2, 3 * w, w).transpose(-1, -2)  # [B, h, n, 3w, d]
        values = F.pad(v, (0, 0, w, extra + w)).unfold(2, 3 * w, w).transpose(-1, -2)
        slot = torch.arange(3 * w, device=x.device)
        offset = slot[None, :] - (torch.arange(w, device=x.device)[:, None] + w)  # key - query position [w, 3w]
        allowed = (offset.abs() <= w)[None, None] & key_ok[:, :, None, :]  # [B, n, w, 3w]
        # a padding query keeps its own key (its window may hold no real one); its output is zeroed below
        query_pad = ~F.pad(keep, (0, extra), value=False).view(B, n, w)
        allowed = allowed | (query_pad[..., None] & (offset == 0))
        if index is not None:  # every local row also sees the global tokens (local projections)
            G = index.shape[1]
            kg, vg = (gather_rows(t.transpose(1, 2), index).transpose(1, 2) for t in (k, v))  # [B, h, G, d]
            keys = torch.cat([keys, kg[:, :, None].expand(B, h, n, G, d)], dim=3)
            values = torch.cat([values, vg[:, :, None].expand(B, h, n, G, d)], dim=3)
            allowed = torch.cat([allowed, valid[:, None, None, :].expand(B, n, w, G)], dim=3)
        K = keys.shape[3]
        qb = F.pad(q, (0, 0, 0, extra)).view(B, h, n, w, d).transpose(1, 2).reshape(B * n, h, w, d)
        ctx, _ = attend(qb, keys.transpose(1, 2).reshape(B * n, h, K, d),
                        values.transpose(1, 2).reshape(B * n, h, K, d), allowed.reshape(B * n, 1, w, K), p, eager,
                        head_mask)
        ctx = ctx.view(B, n, h, w, d).permute(0, 1, 3, 2, 4).reshape(B, n * w, h, d)[:, :T]  # [B, T, h, d]
        ctx = ctx * keep[:, :, None, None]
        if index is not None:  # global rows: their own projections against every real key
            qg = self.query_global(gather_rows(x, index)).view(B, -1, h, d).transpose(1, 2)
            kg = self.key_global(x).view(B, T, h, d).transpose(1, 2)
            vg = self.value_global(x).view(B, T, h, d).transpose(1, 2)
            gmask = keep[:, None, None, :] | ~valid[:, None, :, None]  # an empty slot sees all (discarded)
            gctx, _ = attend(qg, kg, vg, gmask, p, eager, head_mask)
            rows, slots = mask.global_slots
            ctx = ctx.index_put((rows, index[rows, slots]), gctx.transpose(1, 2)[rows, slots])
        return ctx.reshape(B, T, h * d), None


def sparse_self_attention(cfg: ModelConfig, attn_implementation: str, n_heads: int | None,
                          index: int) -> SelfAttention | None:
    """The self-attention of layer `index` of a sparse family, or None for full attention."""
    if cfg.family.sparse_attention == SLIDING_WINDOW:
        return LongformerSelfAttention(cfg, attn_implementation, n_heads, index)
    if cfg.family.sparse_attention == BLOCK_SPARSE:
        return BigBirdSelfAttention(cfg, attn_implementation, n_heads, index)
    return None
