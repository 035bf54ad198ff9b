"""XLNet (Yang et al. 2019): a Transformer-XL encoder with two-stream attention, for permutation language modelling.

Module and parameter names are transformers' `modeling_xlnet.py` (`word_embedding`, `mask_emb`,
`layer.N.rel_attn.q`, ...), so an `XLNetLMHeadModel` checkpoint maps by one prefix (see bertforge.model.checkpoint).
What differs from BERT's encoder:

  - No position table. Each layer scores query i against key j with three terms (Dai et al. 2019, Yang et al.):
        content    (q_i + r_w_bias) . k_j
        position   (q_i + r_r_bias) . R_(i-j)       R = sinusoids of the distance, projected by `r`
        segment    (q_i + r_s_bias) . s_[i, j]      s = `seg_embed`[same or different segment]
    The position and segment terms are added to the scores as a bias, so `attend` (the one attention
    computation, one softmax and masking convention) computes the softmax and the weighted sum.
  - Two streams share every weight: the content stream h (position i sees its own token: the usual hidden states)
    and the query stream g, which starts from `mask_emb` and knows the position it predicts but not the token.
  - `perm_mask[b, i, j]` true / 1: position i may not attend to j (a factorisation order; the content stream
    always sees itself). `target_mapping` [B, P, T]: the P positions the query stream predicts. Without them the
    model is a bidirectional encoder (content stream only).
  - `mems`: hidden states of the previous segment, attended to as extra keys (Transformer-XL recurrence).
  - Post-LN like BERT; the feed-forward block is one module `ff` (layer_1, layer_2, layer_norm).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from bertforge.model.checkpoint import load_pretrained, save_pretrained
from bertforge.config import ModelConfig
from bertforge.errors import BertforgeError
from bertforge.families import ENCODER
from bertforge.model.folder import ModelFolder
from bertforge.model.attention import ATTN_IMPLEMENTATIONS, attend
from bertforge.model.dropout import Dropout
from bertforge.model.encoder import activation


@dataclass
class XLNetOutput:
    last_hidden_state: torch.Tensor  # [B, P, H] (query stream) with target_mapping, else [B, T, H]
    mems: tuple[torch.Tensor, ...] | None = None  # per layer [B, M, H]: the inputs to keep for the next segment
    hidden_states: tuple[torch.Tensor, ...] | None = None  # L+1 x [B, T, H] of the content stream


def relative_positions(qlen: int, klen: int, d_model: int, clamp_len: int = -1,
                       device: torch.device | None = None) -> torch.Tensor:
    """Sinusoid encodings [klen + qlen, d_model] of the distances klen, klen - 1, ..., -qlen + 1 (index p holds
    distance klen - p); distances beyond clamp_len (when > 0) share the encoding of clamp_len."""
    dist = torch.arange(klen, -qlen, -1, device=device).float()
    if clamp_len > 0:
        dist = dist.clamp(-clamp_len, clamp_len)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, d_model, 2, device=device).float() / d_model)
    angle = dist[:, None] * inv_freq
    return torch.cat([angle.sin(), angle.cos()], dim=-1)


def rel_shift(x: torch.Tensor, klen: int) -> torch.Tensor:
    """Scores by distance index -> scores by key: x [B, n, qlen, klen + qlen] to out [B, n, qlen, klen] with
    out[..., i, j] = x[..., i, qlen - i + j]. Query i sits at absolute position mlen + i, key j at j; their distance
    mlen + i - j is at index klen - (mlen + i - j) = qlen - i + j. Transformer-XL's reshape does this without a
    gather: read the [qlen, P] rows as [P, qlen], drop the first row, read back as [qlen, P - 1]."""
    b, n, q, p = x.shape
    return x.reshape(b, n, p, q)[:, :, 1:].reshape(b, n, q, p - 1)[..., :klen]


class RelativeAttention(nn.Module):
    """Relative multi-head attention for both streams (HF's XLNetRelativeAttention: one weight per [H, heads, d])."""

    def __init__(self, cfg: ModelConfig, attn_implementation: str = "sdpa"):
        super().__init__()
        if attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise BertforgeError(f"unknown attn_implementation {attn_implementation!r} "
                                 f"(expected {', '.join(ATTN_IMPLEMENTATIONS)})")
        h, n, d = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
        self.q, self.k, self.v, self.o, self.r = (nn.Parameter(torch.empty(h, n, d)) for _ in range(5))
        self.r_r_bias, self.r_s_bias, self.r_w_bias = (nn.Parameter(torch.empty(n, d)) for _ in range(3))
        self.seg_embed = nn.Parameter(torch.empty(2, n, d))
        self.layer_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.hidden_dropout_prob)
        self.eager = attn_implementation == "eager"

    @staticmethod
    def heads(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x [B, T, H] projected by w [H, n, d] -> [B, n, T, d]."""
        return torch.einsum("bth,hnd->bntd", x, w)

    def scores_and_attend(self, q, k, v, k_r, seg_diff, mask) -> torch.Tensor:
        """One stream's attention: content scores inside `attend`, position and segment scores as its bias."""
        pos = rel_shift(torch.einsum("bnid,pnd->bnip", q + self.r_r_bias[:, None], k_r), k.shape[2])
        bias = pos
        if seg_diff is not None:  # [B, T, K] True where query and key lie in different segments
            seg = torch.einsum("bnid,snd->bnis", q + self.r_s_bias[:, None], self.seg_embed)  # [B, n, T, 2]
            bias = bias + torch.where(seg_diff[:, None], seg[..., 1:], seg[..., :1])
        p = self.dropout.p if self.training else 0.0
        ctx, _ = attend(q + self.r_w_bias[:, None], k, v, mask, p, self.eager, bias=bias * q.shape[-1] ** -0.5)
        return ctx

    def post(self, residual: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        out = torch.einsum("bntd,hnd->bth", ctx, self.o)
        return self.layer_norm(self.dropout(out) + residual)

    def forward(self, h, g, mask_h, mask_g, r, seg_diff, mems=None, target_mapping=None):
        cat = h if mems is None else torch.cat([mems, h], dim=1)
        k, v = self.heads(cat, self.k), self.heads(cat, self.v)
        k_r = torch.einsum("ph,hnd->pnd", r, self.r)
        out_h = self.post(h, self.scores_and_attend(self.heads(h, self.q), k, v, k_r, seg_diff, mask_h))
        if g is None:
            return out_h, None
        q_g = self.heads(g, self.q)  # [B, n, P, d]
        if target_mapping is not None:  # each query sits at the position it predicts (its relative distances)
            q_g = torch.einsum("bnmd,bmt->bntd", q_g, target_mapping)
        ctx_g = self.scores_and_attend(q_g, k, v, k_r, seg_diff, mask_g)
        if target_mapping is not None:
            ctx_g = torch.einsum("bntd,bmt->bnmd", ctx_g, target_mapping)
        return out_h, self.post(g, ctx_g)


class XLNetFeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.layer_1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.layer_2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.dropout = Dropout(cfg.hidden_dropout_prob)
        self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dropout(self.layer_2(self.dropout(self.act(self.layer_1(x)))))
        return self.layer_norm(y + x)


class XLNetLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, attn_implementation: str = "sdpa"):
        super().__init__()
        self.rel_attn = RelativeAttention(cfg, attn_implementation)
        self.ff = XLNetFeedForward(cfg)

    def forward(self, h, g, mask_h, mask_g, r, seg_diff, mems=None, target_mapping=None):
        h, g = self.rel_attn(h, g, mask_h, mask_g, r, seg_diff, mems, target_mapping)
        return self.ff(h), None if g is None else self.ff(g)


class XLNetEncoder(nn.Module):
    """Word embeddings -> L two-stream relative layers (HF's XLNetModel). See the module docstring."""

    def __init__(self, cfg: ModelConfig, attn_implementation: str = "sdpa"):
        super().__init__()
        if cfg.family.streams != 2:
            raise BertforgeError(f"XLNetEncoder needs a two-stream (XLNet) config, got model_type "
                                 f"{cfg.model_type!r}")
        self.config = cfg
        self.word_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.mask_emb = nn.Parameter(torch.empty(1, 1, cfg.hidden_size))
        self.layer = nn.ModuleList([XLNetLayer(cfg, attn_implementation) for _ in range(cfg.num_hidden_layers)])
        self.dropout = Dropout(cfg.hidden_dropout_prob)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, RelativeAttention):
            for p in (module.q, module.k, module.v, module.o, module.r, module.r_r_bias, module.r_s_bias,
                      module.r_w_bias, module.seg_embed):
                nn.init.normal_(p, 0.0, std)
        elif isinstance(module, XLNetEncoder):
            nn.init.normal_(module.mask_emb, 0.0, std)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, perm_mask: torch.Tensor | None = None,
                target_mapping: torch.Tensor | None = None, mems: list[torch.Tensor] | None = None,
                use_mems: bool = False, output_hidden_states: bool = False) -> XLNetOutput:
        """input_ids [B, T]; attention_mask [B, T] (1 = real token); token_type_ids [B, T] (any ids: only equal or
        not matters); perm_mask [B, T, T] (true / 1: i may not see j); target_mapping [B, P, T] (one-hot rows);
        mems: per layer [B, M, H]. With use_mems, returns each layer's input (last mem_len) as the next mems."""
        B, T = input_ids.shape
        mlen = mems[0].shape[1] if mems is not None and mems[0] is not None else 0
        klen = mlen + T
        # blocked [B, T, K]: a key this query may not see (permutation order or padding); mems are always visible.
        blocked = None
        if perm_mask is not None:
            blocked = perm_mask.bool()
        if attention_mask is not None:
            pad = attention_mask.eq(0)[:, None, :].expand(B, T, T)
            blocked = pad if blocked is None else blocked | pad
        mask_h = mask_g = None  # `attend`'s convention: True = may attend, [B, 1, T, K] over the heads
        if blocked is not None:
            blocked = torch.cat([blocked.new_zeros(B, T, mlen), blocked], dim=2)
            eye = torch.eye(T, dtype=torch.bool, device=input_ids.device)
            eye = torch.cat([eye.new_zeros(T, mlen), eye], dim=1)
            mask_g = ~blocked[:, None]
            mask_h = mask_g | eye  # the content stream always sees its own token
        seg_diff = None
        if token_type_ids is not None:
            keys = torch.cat([token_type_ids.new_zeros(B, mlen), token_type_ids], dim=1)
            seg_diff = token_type_ids[:, :, None] != keys[:, None, :]
        h = self.dropout(self.word_embedding(input_ids))
        g = None
        if target_mapping is not None:
            target_mapping = target_mapping.to(h.dtype)
            g = self.dropout(self.mask_emb.expand(B, target_mapping.shape[1], -1))
        r = self.dropout(relative_positions(T, klen, self.config.hidden_size, self.config.clamp_len, h.device))
        hidden, new_mems = [h], []
        for i, layer in enumerate(self.layer):
            if use_mems:
                new_mems.append(self._cache(h, None if mems is None else mems[i]))
            h, g = layer(h, g, mask_h, mask_g, r.to(h.dtype), seg_diff, None if mems is None else mems[i],
                         target_mapping)
            hidden.append(h)
        out = self.dropout(g if g is not None else h)
        return XLNetOutput(out, tuple(new_mems) if use_mems else None,
                           tuple(hidden) if output_hidden_states else None)

    def _cache(self, h: torch.Tensor, prev: torch.Tensor | None) -> torch.Tensor:
        """The next segment's memory: this layer's input after the previous memory, the last mem_len positions."""
        cat = h if prev is None else torch.cat([prev, h], dim=1)
        keep = self.config.mem_len
        return (cat[:, -keep:] if keep else cat).detach()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @classmethod
    def from_pretrained(cls, path: "str | Path | ModelFolder", attn_implementation: str = "sdpa",
                        revision: str | None = None) -> "XLNetEncoder":
        folder = ModelFolder.open(path, revision=revision)
        model = cls(folder.config_for(ENCODER, verb="an XLNet encoder"), attn_implementation)
        load_pretrained(model, folder.path)
        return model.eval()

    def save_pretrained(self, path: str | Path, tokenizer=None) -> None:
        save_pretrained(self, path, self.config, tokenizer=tokenizer)


# ---- inputs of permutation language modelling -----------------------------------------------------------------
def permutation_mask(rank: torch.Tensor) -> torch.Tensor:
    """perm_mask [B, T, T] from each position's place in the factorisation order among the targets ([B, T]; -1 for
    a position that is not predicted): i may not see a target j that comes at or after i in the order. So context
    tokens see each other and no target; a target sees the context and the targets before it (the query stream
    not itself; the content stream adds itself)."""
    return rank[:, None, :].ge(0) & rank[:, None, :].ge(rank[:, :, None])


def target_mapping_of(targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Bool targets [B, T] -> (target_mapping [B, P, T] one-hot rows in position order, padded with zero rows to
    the batch's most targets P; valid [B, P] bool, False for those padding rows)."""
    counts = targets.sum(1)
    P = max(int(counts.max()) if targets.numel() else 0, 1)
    valid = torch.arange(P, device=targets.device)[None, :] < counts[:, None]
    positions = torch.zeros(targets.shape[0], P, dtype=torch.long, device=targets.device)
    positions[valid] = targets.nonzero()[:, 1]  # nonzero() is row-major: each row's targets in position order
    mapping = torch.zeros(targets.shape[0], P, targets.shape[1], device=targets.device)
    mapping.scatter_(2, positions[:, :, None], valid[:, :, None].float())
    return mapping, valid
