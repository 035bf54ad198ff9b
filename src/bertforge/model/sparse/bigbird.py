"""BigBird's block-sparse attention (Zaheer et al. 2020, the ITC variant that transformers' `BigBirdModel` runs).

The sequence is cut into n blocks of `block_size` tokens (`sparse.prepare` pads it to a multiple). Then:

- the first and the last query block are global: they attend to every real key;
- every other query block i attends to key blocks 0 and n-1 (global), i-1, i, i+1 (window) and
  `num_random_blocks` random blocks per head; keys of padding are masked, and a block that is both window and
  global is counted once (rows 1 and n-2), as in transformers' separate q[1] / q[-2] products.

Each middle query block and its (5 + r) key blocks go through `attention.attend` with the batch folded (one call
for all middle blocks): memory B x heads x T x (5 + r) x block_size, linear in T. Padding queries give zero.

Random blocks, as transformers draws them: in eval mode none, block 0 every time ("no randomness in eval"), so in
eval each middle row sees the first block's keys r more times (that is what its checkpoints are evaluated with);
in training the original BigBird plan, numpy seeded with the layer index, so one fixed plan per layer, the same at
every step (`bigbird_plan`). Short batches (at most (5 + 2r) blocks) use full attention, as in transformers; that
choice is per batch here, where transformers' model keeps full attention once it fell back.
"""
from __future__ import annotations

import numpy as np
import torch

from bertforge.config import ModelConfig
from bertforge.model.attention import SelfAttention, attend
from bertforge.model.sparse.bigbird_plan import training_plan
from bertforge.model.sparse.layout import SparseLayout, SparseProjection


class BigBirdSelfAttention(SparseProjection, SelfAttention):
    """BERT's `query` / `key` / `value`; block-sparse when the encoder passes a `SparseLayout`, else the ordinary
    full attention (attention_type "original_full", and short batches)."""

    def __init__(self, cfg: ModelConfig, attn_implementation: str = "sdpa", n_heads: int | None = None,
                 index: int = 0):
        super().__init__(cfg, attn_implementation, n_heads)
        self.block_size, self.num_random_blocks = cfg.block_size, cfg.num_random_blocks
        self.layer_index, self.max_length = index, cfg.max_position_embeddings  # transformers' seed, old plan

    def random_blocks(self, n: int, device: torch.device) -> torch.Tensor:
        """[heads, n - 2, r] random key blocks of the middle query blocks 1 .. n-2 (see the module docstring)."""
        h, r = self.n_heads, self.num_random_blocks
        if not self.training:
            return torch.zeros(h, n - 2, r, dtype=torch.long, device=device)
        plan = training_plan(self.layer_index, n * self.block_size, self.block_size, r, h, self.max_length)
        return torch.from_numpy(plan.astype(np.int64)).to(device)

    def forward(self, x: torch.Tensor, mask, eager: bool = False, head_mask: torch.Tensor | None = None,
                kv_cache=None, rotary=None):
        if not isinstance(mask, SparseLayout):
            return super().forward(x, mask, eager, head_mask, kv_cache, rotary)
        B, T, _ = x.shape
        h, d, bs = self.n_heads, self.head_dim, self.block_size
        n, m = T // bs, T // bs - 2
        eager = eager or self.attn_implementation == "eager"
        p = self.dropout_p if self.training else 0.0
        q, k, v = self.project(x).view(B, T, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)  # [B, h, T, d]
        keep = mask.keep
        # first and last query blocks: every real key (a padding query sees all; its output is zeroed below)
        edge = torch.cat([q[:, :, :bs], q[:, :, -bs:]], dim=2)
        edge_pad = ~torch.cat([keep[:, :bs], keep[:, -bs:]], dim=1)
        edge_ctx, _ = attend(edge, k, v, keep[:, None, None, :] | edge_pad[:, None, :, None], p, eager, head_mask)
        # middle query blocks: key blocks [0, i-1, i, i+1, n-1] + r random ones, per head
        rows = torch.arange(1, n - 1, device=x.device)
        fixed = torch.stack([torch.zeros_like(rows), rows - 1, rows, rows + 1, torch.full_like(rows, n - 1)], 1)
        once = torch.ones_like(fixed, dtype=torch.bool)
        once[:, 1] = rows - 1 != 0        # row 1: its left neighbour is the first (global) block
        once[:, 3] = rows + 1 != n - 1    # row n-2: its right neighbour is the last block
        blocks = torch.cat([fixed.expand(h, m, 5), self.random_blocks(n, x.device)], dim=-1)  # [h, m, 5 + r]
        slots = blocks.shape[-1]
        heads = torch.arange(h, device=x.device)[:, None, None]
        keys = k.view(B, h, n, bs, d)[:, heads, blocks].reshape(B, h, m, slots * bs, d)
        values = v.view(B, h, n, bs, d)[:, heads, blocks].reshape(B, h, m, slots * bs, d)
        counted = torch.cat([once, torch.ones(m, slots - 5, dtype=torch.bool, device=x.device)], dim=1)
        key_ok = keep.view(B, n, bs)[:, blocks] & counted[None, None, :, :, None]  # [B, h, m, slots, bs]
        query_pad = ~keep.view(B, n, bs)[:, 1:-1]  # [B, m, bs]
        allowed = key_ok.reshape(B, h, m, 1, slots * bs) | query_pad[:, None, :, :, None]
        def fold(t: torch.Tensor) -> torch.Tensor:  # [B, h, m, ...] -> [B * m, h, ...]: blocks into the batch
            return t.transpose(1, 2).reshape(B * m, *t.shape[1:2], *t.shape[3:])

        mid_ctx, _ = attend(fold(q.view(B, h, n, bs, d)[:, :, 1:-1]), fold(keys), fold(values), fold(allowed), p, eager,
                            head_mask)
        mid_ctx = mid_ctx.view(B, m, h, bs, d).transpose(1, 2).reshape(B, h, m * bs, d)
        ctx = torch.cat([edge_ctx[:, :, :bs], mid_ctx, edge_ctx[:, :, bs:]], dim=2) * keep[:, None, :, None]
        return ctx.transpose(1, 2).reshape(B, T, h * d), None
