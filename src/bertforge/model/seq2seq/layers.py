"""The pieces of the encoder-decoder (`seq2seq.py`): norms, T5's relative position bias, attention (self and
cross), the feed-forward block and the two kinds of layer. Each reads the family's switches from a
`Seq2SeqConfig` (RMSNorm or LayerNorm, pre- or post-norm, biases, score scaling, gated FFN); attention goes
through `attention.attend` like every other model of bertforge.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from bertforge.config.seq2seq import Seq2SeqConfig
from bertforge.errors import BertforgeError
from bertforge.families.family import FAN_IN_INIT, NORMAL_INIT
from bertforge.model.attention import ATTN_IMPLEMENTATIONS, attend
from bertforge.model.dropout import Dropout
from bertforge.model.encoder import activation


class RMSNorm(nn.Module):
    """T5's LayerNorm: x / rms(x) * weight; no mean subtracted, no bias; the mean square in fp32."""

    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            x = x.to(self.weight.dtype)
        return self.weight * x


def make_norm(cfg: Seq2SeqConfig) -> nn.Module:
    if cfg.family.rms_norm:
        return RMSNorm(cfg.d_model, cfg.layer_norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)


def relative_position_bucket(relative_position: torch.Tensor, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> torch.Tensor:
    """T5's buckets (Mesh TensorFlow's): distances key - query below num_buckets/2 (per direction when
    bidirectional) get a bucket each, longer ones share logarithmically wider buckets up to max_distance, beyond
    which all share the last. Causal (decoder) attention sees only keys behind the query: one direction."""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    large = max_exact + (torch.log(distance.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).long()
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, distance, large)


class RelativePositionBias(nn.Module):
    """A learned score per (bucket of key - query distance, head), added to every layer's attention scores. T5
    keeps it in the first layer's self-attention and shares it with the others (`seq2seq.Stack` holds it once)."""

    def __init__(self, cfg: Seq2SeqConfig, n_heads: int, bidirectional: bool):
        super().__init__()
        self.num_buckets, self.max_distance = cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance
        self.bidirectional = bidirectional
        self.relative_attention_bias = nn.Embedding(self.num_buckets, n_heads)

    def forward(self, query_length: int, key_length: int, past: int = 0) -> torch.Tensor:
        """[1, heads, query_length, key_length] for queries at positions past.. past + query_length - 1."""
        device = self.relative_attention_bias.weight.device
        query = torch.arange(past, past + query_length, device=device)[:, None]
        key = torch.arange(key_length, device=device)[None, :]
        buckets = relative_position_bucket(key - query, self.bidirectional, self.num_buckets, self.max_distance)
        return self.relative_attention_bias(buckets).permute(2, 0, 1)[None]


class Seq2SeqAttention(nn.Module):
    """Multi-head attention with T5's module names (q, k, v, o); self-attention (keys from x, a KV cache when
    decoding) or cross-attention (keys and values from the encoder's output, projected once: `keys_values`)."""

    def __init__(self, cfg: Seq2SeqConfig, n_heads: int, causal: bool = False, attn_implementation: str = "sdpa"):
        super().__init__()
        if attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise BertforgeError(f"unknown attn_implementation {attn_implementation!r} "
                                 f"(expected {', '.join(ATTN_IMPLEMENTATIONS)})")
        self.n_heads, self.head_dim, self.causal = n_heads, cfg.head_dim_for(n_heads), causal
        inner, bias = n_heads * self.head_dim, cfg.family.bias
        self.dropout_p, self.eager = cfg.attention_dropout, attn_implementation == "eager"
        self.scale = None if cfg.family.scaled_attention else 1.0  # T5: no 1/sqrt(d) (its init absorbs it)
        self.q = nn.Linear(cfg.d_model, inner, bias=bias)
        self.k = nn.Linear(cfg.d_model, inner, bias=bias)
        self.v = nn.Linear(cfg.d_model, inner, bias=bias)
        self.o = nn.Linear(inner, cfg.d_model, bias=bias)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, heads * d] -> [B, heads, T, d]"""
        return x.view(x.shape[0], x.shape[1], self.n_heads, self.head_dim).transpose(1, 2)

    def keys_values(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values of `memory` [B, S, H] (the encoder's output), per head."""
        return self.heads(self.k(memory)), self.heads(self.v(memory))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, bias: torch.Tensor | None = None,
                kv: tuple[torch.Tensor, torch.Tensor] | None = None, kv_cache=None) -> torch.Tensor:
        """x [B, T, H]; `mask` bool [B, 1, 1 or T, S] (True = may attend) or None; `bias` T5's position scores;
        `kv` the cross-attention keys and values (else self-attention on x, stored in `kv_cache` when given)."""
        B, T, _ = x.shape
        q = self.heads(self.q(x))
        k, v = kv if kv is not None else self.keys_values(x)
        if kv is None and kv_cache is not None:
            k, v = kv_cache.update(k, v)
        ctx, _ = attend(q, k, v, mask, self.dropout_p if self.training else 0.0, self.eager, causal=self.causal,
                        bias=bias, scale=self.scale)
        return self.o(ctx.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


class Seq2SeqFeedForward(nn.Module):
    """wo(act(wi x)), or T5 v1.1's gated form wo(act(wi_0 x) * wi_1 x); dropout after the activation."""

    def __init__(self, cfg: Seq2SeqConfig, width: int):
        super().__init__()
        bias = cfg.family.bias
        self.gated = cfg.gated_ffn
        if self.gated:
            self.wi_0 = nn.Linear(cfg.d_model, width, bias=bias)
            self.wi_1 = nn.Linear(cfg.d_model, width, bias=bias)
        else:
            self.wi = nn.Linear(cfg.d_model, width, bias=bias)
        self.wo = nn.Linear(width, cfg.d_model, bias=bias)
        self.act = activation(cfg.activation)
        self.dropout = Dropout(cfg.activation_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.wi_0(x)) * self.wi_1(x) if self.gated else self.act(self.wi(x))
        return self.wo(self.dropout(h))


class Seq2SeqLayer(nn.Module):
    """One encoder layer (self-attention, FFN) or, with `cross`, one decoder layer (causal self-attention,
    cross-attention over the encoder's output, FFN). Each sub-block is a residual around it, normalised before
    (T5: x + f(norm(x))) or after (BART: norm(x + f(x)))."""

    def __init__(self, cfg: Seq2SeqConfig, n_heads: int, ffn_width: int, cross: bool,
                 attn_implementation: str = "sdpa"):
        super().__init__()
        self.pre_norm = cfg.family.norm_position == "pre"
        self.self_attn = Seq2SeqAttention(cfg, n_heads, causal=cross, attn_implementation=attn_implementation)
        self.self_attn_norm = make_norm(cfg)
        if cross:
            self.cross_attn = Seq2SeqAttention(cfg, n_heads, attn_implementation=attn_implementation)
            self.cross_attn_norm = make_norm(cfg)
        self.ffn = Seq2SeqFeedForward(cfg, ffn_width)
        self.ffn_norm = make_norm(cfg)
        self.dropout = Dropout(cfg.dropout)

    def residual(self, x: torch.Tensor, norm: nn.Module, block) -> torch.Tensor:
        if self.pre_norm:
            return x + self.dropout(block(norm(x)))
        return norm(x + self.dropout(block(x)))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, bias: torch.Tensor | None = None,
                cross_kv: tuple[torch.Tensor, torch.Tensor] | None = None, cross_mask: torch.Tensor | None = None,
                kv_cache=None) -> torch.Tensor:
        x = self.residual(x, self.self_attn_norm, lambda h: self.self_attn(h, mask, bias, kv_cache=kv_cache))
        if cross_kv is not None:
            x = self.residual(x, self.cross_attn_norm, lambda h: self.cross_attn(h, cross_mask, kv=cross_kv))
        return self.residual(x, self.ffn_norm, self.ffn)


def init_fan_in(module: nn.Module, cfg: Seq2SeqConfig) -> None:
    """Mesh TensorFlow's initialisation as transformers' T5 does it: each matrix's std is 1/sqrt(fan-in), the
    query's also 1/sqrt(d_kv) (the scaling T5's attention leaves out), the embedding's 1."""
    f, d = cfg.initializer_factor, cfg.d_model
    if isinstance(module, RMSNorm):
        nn.init.constant_(module.weight, f)
    elif isinstance(module, Seq2SeqAttention):
        inner = module.n_heads * module.head_dim
        nn.init.normal_(module.q.weight, 0.0, f * (d * module.head_dim) ** -0.5)
        nn.init.normal_(module.k.weight, 0.0, f * d ** -0.5)
        nn.init.normal_(module.v.weight, 0.0, f * d ** -0.5)
        nn.init.normal_(module.o.weight, 0.0, f * inner ** -0.5)
    elif isinstance(module, Seq2SeqFeedForward):
        for lin in ((module.wi_0, module.wi_1) if module.gated else (module.wi,)):
            nn.init.normal_(lin.weight, 0.0, f * d ** -0.5)
        nn.init.normal_(module.wo.weight, 0.0, f * module.wo.in_features ** -0.5)
    elif isinstance(module, RelativePositionBias):
        nn.init.normal_(module.relative_attention_bias.weight, 0.0, f * d ** -0.5)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, 0.0, f)


def init_normal(module: nn.Module, cfg: Seq2SeqConfig) -> None:
    """BART's: every matrix and embedding N(0, init_std), biases 0, the padding row 0, LayerNorms 1 / 0."""
    std = cfg.initializer_range
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, 0.0, std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, 0.0, std)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


INITS = {FAN_IN_INIT: init_fan_in, NORMAL_INIT: init_normal}  # by Family.init
