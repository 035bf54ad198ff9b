"""Disentangled relative-position attention (He et al. 2021, DeBERTa; He et al. 2023, DeBERTa-v3).

Positions are no input embedding here: each attention layer adds, to its content scores q_i . k_j, two scores
from the relative distance d = i - j,

    content -> position   c2p[i, j] = q_i . pk[r(d)]       pk = the layer's position keys of the shared table
    position -> content   p2c[i, j] = k_j . pq[r(d)]       pq = its position queries (r(-d) seen from the key)

all three divided by sqrt(3 d_head) (sqrt((1 + terms) d_head) with fewer terms). r(d) is the table row of a
distance: d itself within +-buckets/2, log-spaced beyond, up to `max_relative_positions` (`log_bucket`), offset
by the table's half width. The table (2 x half width relative embeddings, then a LayerNorm) is one per encoder,
shared by the layers (`RelativePositionEmbeddings`); each layer projects it to position keys and queries with
its own `pos_key_proj` / `pos_query_proj`, or with its content key and query projections (`share_att_key`, v3).

The two terms reach `attend` as its additive `bias` with `scale` 1/sqrt(3 d_head), so the attention itself stays
on SDPA's fused kernel with the bias as its float mask (transformers computes it with an eager matmul-softmax).
Only the table rows that distances of this length reach are projected: 2T - 1 of them for a sequence of T tokens
shorter than the half width, instead of all 2 x 256 (DeBERTa-v3).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from bertforge.config import ModelConfig
from bertforge.model.attention import SelfAttention, attend
from bertforge.model.dropout import Dropout


def half_width(cfg: ModelConfig) -> int:
    """Rows of the relative table on each side of distance 0: `position_buckets`, else `max_relative_positions`
    (else the absolute limit, `max_position_embeddings`)."""
    return cfg.position_buckets if cfg.position_buckets > 0 else max_distance(cfg)


def max_distance(cfg: ModelConfig) -> int:
    return cfg.max_relative_positions if cfg.max_relative_positions > 0 else cfg.max_position_embeddings


def log_bucket(distance: torch.Tensor, buckets: int, max_position: int) -> torch.Tensor:
    """DeBERTa's bucket of each relative distance: itself when |d| <= buckets/2, else sign(d) x (buckets/2 +
    ceil((buckets/2 - 1) log(|d| / (buckets/2)) / log((max_position - 1) / (buckets/2)))). The float steps are
    transformers' (`make_log_bucket_position`), so the buckets are the same at every boundary."""
    sign = torch.sign(distance)
    mid = buckets // 2
    inside = (distance < mid) & (distance > -mid)
    magnitude = torch.where(inside, torch.tensor(mid - 1).type_as(distance), torch.abs(distance))
    scale = torch.log(torch.tensor((max_position - 1) / mid))
    log_pos = torch.ceil(torch.log(magnitude / mid) / scale * (mid - 1)) + mid
    return torch.where(magnitude <= mid, distance.type_as(log_pos), log_pos * sign).long()


def _bucket_bound(distance: int, buckets: int, max_position: int) -> int:
    """An upper bound of |bucket| over distances up to `distance`, in Python (no device round trip): the
    bucket grows with |d|; one more row absorbs a float-rounding difference from the tensor computation."""
    mid = buckets // 2
    if buckets <= 0 or distance <= mid:
        return distance
    return mid + math.ceil(math.log(distance / mid) / math.log((max_position - 1) / mid) * (mid - 1)) + 1


@dataclass
class RelativePositions:
    """What every layer of one forward shares: the normalised table rows in use [R, H] and, for query i and key j,
    the row of their distance [T, T] (an index into `table`)."""

    table: torch.Tensor
    index: torch.Tensor


def relative_index(length: int, device: torch.device, buckets: int, max_position: int,
                   half: int) -> tuple[torch.Tensor, int, int]:
    """(index [T, T], first row, last row + 1): the table row of distance i - j for query i and key j, counted
    from the first row that a sequence of `length` tokens reaches. While an ONNX graph is traced, every row is
    kept, so the graph holds for any length."""
    pos = torch.arange(length, device=device)
    distance = pos[:, None] - pos[None, :]
    if buckets > 0:
        distance = log_bucket(distance, buckets, max_position)
    rows = torch.clamp(distance + half, 0, 2 * half - 1)
    if torch.onnx.is_in_onnx_export():
        return rows, 0, 2 * half
    reach = min(half, max(length - 1, _bucket_bound(length - 1, buckets, max_position)))
    first, stop = half - reach, min(half + reach + 1, 2 * half)
    return rows - first, first, stop


class RelativePositionEmbeddings(nn.Module):
    """The encoder's shared relative-position table: `embeddings` (2 x half width rows) and, with
    `norm_rel_ebd` "layer_norm", its `LayerNorm`. `forward(x)` gives the `RelativePositions` of x's length."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.buckets, self.max_position, self.half = cfg.position_buckets, max_distance(cfg), half_width(cfg)
        self.embeddings = nn.Embedding(2 * self.half, cfg.hidden_size)
        self.LayerNorm = (nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
                          if cfg.norm_relative_embeddings else None)

    def forward(self, x: torch.Tensor) -> RelativePositions:
        index, first, stop = relative_index(x.shape[1], x.device, self.buckets, self.max_position, self.half)
        table = self.embeddings.weight[first:stop]
        if self.LayerNorm is not None:
            table = self.LayerNorm(table)
        return RelativePositions(table.to(x.dtype), index)


class DisentangledSelfAttention(SelfAttention):
    """Self-attention whose scores add the content -> position and position -> content terms (see the module
    docstring). Q/K/V are `SelfAttention`'s (`query`, `key`, `value`); the position projections `pos_key_proj`
    (c2p) and `pos_query_proj` (p2c) exist unless the layer shares its content projections (`share_att_key`)."""

    def __init__(self, cfg: ModelConfig, attn_implementation: str = "sdpa", n_heads: int | None = None):
        super().__init__(cfg, attn_implementation, n_heads)
        self.terms = tuple(cfg.relative_attention_terms)
        self.share = cfg.share_relative_projections
        inner = self.n_heads * self.head_dim
        if not self.share:
            if "c2p" in self.terms:
                self.pos_key_proj = nn.Linear(cfg.hidden_size, inner)
            if "p2c" in self.terms:
                self.pos_query_proj = nn.Linear(cfg.hidden_size, inner)
        self.table_dropout = Dropout(cfg.hidden_dropout_prob)  # transformers' pos_dropout, once per layer
        self.scale = 1.0 / math.sqrt(self.head_dim * (1 + len(self.terms)))

    def position_bias(self, q: torch.Tensor, k: torch.Tensor, relative: RelativePositions,
                      mask: torch.Tensor | None = None) -> torch.Tensor | None:
        """c2p + p2c [B, heads, T, T], scaled, with `mask`'s keys at the dtype's lowest value; None without terms.
        q, k: [B, heads, T, d] (views of the fused projection)."""
        if not self.terms:
            return None
        table = self.table_dropout(relative.table)
        index = relative.index.expand(q.shape[0], self.n_heads, -1, -1)
        bias = None
        if "c2p" in self.terms:  # q_i . pk[r(i - j)]: scores against every row, then each key's row picked
            bias = torch.gather(self._scores(q, self.key if self.share else self.pos_key_proj, table), -1, index)
        if "p2c" in self.terms:  # k_j . pq[r(i - j)]: per key j its row for each query i, then transposed
            scores = self._scores(k, self.query if self.share else self.pos_query_proj, table)
            p2c = torch.gather(scores, -1, index.transpose(-1, -2)).transpose(-1, -2)
            bias = p2c if bias is None else bias + p2c
        if mask is not None:  # in place: the bias is this call's own tensor (attend would copy it to mask it)
            bias.masked_fill_(~mask, torch.finfo(bias.dtype).min)
        return bias

    def _scores(self, x: torch.Tensor, proj: nn.Module, table: torch.Tensor) -> torch.Tensor:
        """x [B, heads, T, d] against the table's rows projected by `proj`, scaled: [B, heads, T, R]. One batched
        product per head over all B x T rows (x's batch and position dims merge into a view of the projection),
        so neither x nor the projected rows are copied out per batch element, as a broadcast matmul would."""
        B, h, T, d = x.shape
        rows = proj(table).view(table.shape[0], h, d).permute(1, 2, 0) * self.scale  # [heads, d, R]
        flat = x.transpose(0, 1).reshape(h, B * T, d)
        return torch.bmm(flat, rows).view(h, B, T, -1).transpose(0, 1)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.query, nn.Linear):
            return super().project(x)
        return torch.cat([self.query(x), self.key(x), self.value(x)], -1)  # an int8 inference copy's modules

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, eager: bool = False,
                head_mask: torch.Tensor | None = None, kv_cache=None, rotary=None,
                relative: RelativePositions | None = None):
        if kv_cache is not None or rotary is not None or relative is None:
            raise ValueError("disentangled attention takes the encoder's RelativePositions, no cache or rotary")
        B, T, _ = x.shape
        q, k, v = self.project(x).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        bias = self.position_bias(q, k, relative, mask)
        ctx, probs = attend(q, k, v, mask if bias is None else None, self.dropout_p if self.training else 0.0,
                            eager or self.attn_implementation == "eager", head_mask, bias=bias, scale=self.scale)
        return ctx.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim), probs


def relative_self_attention(cfg: ModelConfig, attn_implementation: str,
                            n_heads: int | None) -> DisentangledSelfAttention | None:
    """The layer's self-attention when positions enter as a disentangled bias, else None."""
    if cfg.position_embedding_type != "disentangled":
        return None
    return DisentangledSelfAttention(cfg, attn_implementation, n_heads)


__all__ = ["DisentangledSelfAttention", "RelativePositionEmbeddings", "RelativePositions", "half_width",
           "log_bucket", "relative_index", "relative_self_attention"]
