"""Multi-head self-attention, and `attend`: the one place attention is computed (SDPA or the eager reference).

`attend` takes per-head queries, keys and values and a boolean mask (True = may attend), and returns the context and,
on the eager path, the probabilities. Every attention module of bertforge calls it, so there is one softmax
convention, one masking rule and one `scaled_dot_product_attention` call site. `causal=True` is the decoder's
left-to-right rule, aligned to the last key, so it holds when the queries are the newest tokens after a KV cache.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.config import ModelConfig
from bertforge.device import like
from bertforge.errors import BertforgeError
from bertforge.model.dropout import dropout, uniform_masks

ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout_p: float = 0.0,
           eager: bool = False, head_mask: torch.Tensor | None = None,
           causal: bool = False, bias: torch.Tensor | None = None,
           scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(q k^T / sqrt(d) + bias + mask) v for q, k, v [B, heads, T, d]; `mask` bool, broadcastable to
    [B, heads, Tq, Tk], True where a key may be attended to, or None. Returns (context [B, heads, Tq, d],
    probabilities or None). `eager` materialises the probabilities (the reference maths); otherwise torch's fused
    kernel runs. `head_mask` [heads] multiplies each head's probabilities (HF's and Michel et al.'s head mask); on
    the SDPA path it scales each head's context, which is the same product: (m * P) @ V = m * (P @ V).
    `causal`: query i (the (Tk - Tq + i)-th token) also never sees a later key; with a `mask` as well, each query
    keeps at least its own key, so a padding query's row is never empty (an empty row would give NaN).
    `bias`: extra scores, already scaled, broadcastable to [B, heads, Tq, Tk] (XLNet's relative-position and
    segment terms); a masked key gets the dtype's lowest value, so a row with no key left is uniform, not NaN.
    `scale`: what q k^T is multiplied by (default 1/sqrt(d); T5 uses 1.0)."""
    per_head = None if head_mask is None else head_mask.to(q.dtype).view(1, -1, 1, 1)
    if dropout_p > 0 and uniform_masks(q):
        # With dropout on the CPU, SDPA runs these same unfused steps (its fused kernel takes no dropout), but draws
        # its mask with bernoulli_; the eager path draws it twice as fast (`model.dropout`).
        eager = True
    is_causal = False
    if causal:
        Tq, Tk = q.shape[-2], k.shape[-2]
        if mask is None and bias is None and Tq == Tk and not eager:
            is_causal = True  # the fused kernel's own causal path (training, prompt prefill)
        elif Tq > 1 or mask is not None:  # one new query after a cache sees every key: nothing to mask
            ones = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device)
            tril = ones.tril(Tk - Tq)
            mask = tril if mask is None else (mask & tril) | (tril & ones.triu(Tk - Tq))  # + each query's own key
    if bias is not None:  # the boolean mask folds into the additive scores
        bias = bias.to(q.dtype)
        mask = bias if mask is None else bias.masked_fill(~mask, torch.finfo(bias.dtype).min)
    if eager:
        # q scaled before the product: a pass over [T, d] instead of [T, T] (and q's copy into matmul layout)
        scores = (q * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)) @ k.transpose(-1, -2)
        if mask is not None and mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        elif mask is not None:
            scores = scores + mask
        probs = scores.softmax(dim=-1)
        if per_head is not None:
            probs = probs * per_head
        ctx = dropout(probs, dropout_p) @ v
        return ctx, probs
    ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal,
                                         scale=scale)
    if per_head is not None:
        ctx = ctx * per_head
    return ctx, None


def segment_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] segment numbers (1, 2, ... per packed sequence; 0 = padding) -> bool [B, T, T] query x key mask:
    block-diagonal, so several sequences packed into one row never attend to each other. A padding query
    attends to itself only (a row with no key at all would make the softmax NaN)."""
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    eye = torch.eye(segment_ids.shape[1], dtype=torch.bool, device=segment_ids.device)
    return (same & (segment_ids[:, None, :] > 0)) | eye


def sliding_window_mask(mask: torch.Tensor | None, length: int, half_window: int,
                        device: torch.device) -> torch.Tensor | None:
    """`mask` (bool, broadcastable to [B, 1, T, T], or None) restricted to keys within `half_window` positions of
    each query (|i - j| <= half_window: Hugging Face's ModernBERT convention, local_attention // 2). A query keeps
    itself, so a padding query far from every real token has a key (an empty row would make the softmax NaN,
    and a NaN value row poisons every query even at probability 0). When the window spans the whole sequence
    the mask is returned unchanged, so short batches keep SDPA's fastest path."""
    if length - 1 <= half_window:
        return mask
    pos = torch.arange(length, device=device)
    window = (pos[:, None] - pos[None, :]).abs() <= half_window  # [T, T]
    if mask is None:
        return window[None, None]
    eye = torch.eye(length, dtype=torch.bool, device=device)
    return (mask & window) | eye


def rotary_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE tables for `position_ids` ([T] or [B, T]): cos and sin [.., T, head_dim] in fp32, the frequencies
    theta^(-2i/d) repeated over both halves (the rotate-half layout of GPT-NeoX, Llama and ModernBERT). Computed
    per forward: it is T x d work, and no buffer means no precision loss when the model is cast to bf16."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.float)
                                / head_dim))
    freqs = position_ids[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, heads, T, d] by the position angles, in fp32 (the result has x's dtype)."""
    if cos.dim() == 3:  # per-row positions [B, T, d] -> broadcast over heads
        cos, sin = cos[:, None], sin[:, None]
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)


class MultiHeadAttention(nn.Module):
    """Scaled dot-product self-attention over heads; subclasses say how x [B, T, H] becomes [q | k | v] [B, T, 3H].

    `mask` is a bool [B, 1, 1, T] (True = a key that may be attended to), [B, 1, T, T] (query x key: packed rows,
    sliding windows) or None when nothing is padded.
    `causal` subclasses (the decoder's) attend left to right; `kv_cache` (a `cache.LayerKV`) adds the keys and
    values of earlier calls, so that a decoding step projects only its new tokens.
    """

    causal = False

    def __init__(self, n_heads: int, head_dim: int, dropout_p: float, attn_implementation: str):
        super().__init__()
        if attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise BertforgeError(f"unknown attn_implementation {attn_implementation!r} "
                                 f"(expected {', '.join(ATTN_IMPLEMENTATIONS)})")
        self.n_heads, self.head_dim, self.dropout_p = n_heads, head_dim, dropout_p
        self.attn_implementation = attn_implementation

    def project(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, eager: bool = False,
                head_mask: torch.Tensor | None = None, kv_cache=None,
                rotary: tuple[torch.Tensor, torch.Tensor] | None = None):
        """`rotary`: (cos, sin) from `rotary_cos_sin` to rotate queries and keys (RoPE), or None."""
        B, T, _ = x.shape
        q, k, v = self.project(x).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)
        ctx, probs = attend(q, k, v, mask, self.dropout_p if self.training else 0.0,
                            eager or self.attn_implementation == "eager", head_mask, self.causal)
        return ctx.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim), probs


class SelfAttention(MultiHeadAttention):
    """The trainable attention, with HF's three projections `query`, `key`, `value`."""

    def __init__(self, cfg: ModelConfig, attn_implementation: str = "sdpa", n_heads: int | None = None):
        n_heads = cfg.num_attention_heads if n_heads is None else n_heads  # fewer after pruning (prune_heads)
        super().__init__(n_heads, cfg.head_dim, cfg.attention_probs_dropout_prob, attn_implementation)
        h, inner, bias = cfg.hidden_size, n_heads * cfg.head_dim, cfg.attention_bias
        self.query, self.key, self.value = (nn.Linear(h, inner, bias=bias), nn.Linear(h, inner, bias=bias),
                                            nn.Linear(h, inner, bias=bias))

    def project(self, x: torch.Tensor) -> torch.Tensor:
        # One [3H, H] matmul instead of three (fused at forward time, so the parameters keep HF's names): fewer,
        # larger GEMMs and one read of x, which matters most for the small models trained on CPU.
        w = torch.cat([self.query.weight, self.key.weight, self.value.weight])
        b = None if self.query.bias is None else torch.cat([self.query.bias, self.key.bias, self.value.bias])
        return F.linear(x, w, b)


class FusedSelfAttention(MultiHeadAttention):
    """Inference-only variant: Q/K/V concatenated once into one Linear `qkv` (no per-call torch.cat, and one
    nn.Linear that dynamic int8 quantisation can replace). Built by `for_inference`; never trained or saved."""

    def __init__(self, source: SelfAttention):
        super().__init__(source.n_heads, source.head_dim, source.dropout_p, source.attn_implementation)
        bias = source.query.bias is not None
        # Built where the source's weights are (device and dtype): a default-dtype CPU Linear beside a float64 or
        # GPU model crashed `embed --device cuda` ("mat1 is on cuda:0, different from other tensors on cpu").
        self.qkv = nn.Linear(source.query.in_features, 3 * source.query.out_features, bias=bias,
                             **like(source.query.weight))
        with torch.no_grad():
            self.qkv.weight.copy_(torch.cat([source.query.weight, source.key.weight, source.value.weight]))
            if bias:
                self.qkv.bias.copy_(torch.cat([source.query.bias, source.key.bias, source.value.bias]))

    def project(self, x: torch.Tensor) -> torch.Tensor:
        return self.qkv(x)


class OnnxSelfAttention(MultiHeadAttention):
    """Export-only variant: the attention written in the op pattern that onnxruntime's transformer optimiser
    fuses into one `Attention` node (`fusion_attention.py`, the pattern of transformers' BERT export): three
    MatMul + Add projections, K transposed by one Transpose, (Q K^T) / sqrt(d), + an additive mask, Softmax, @ V.
    `attend` scales Q before the product and masks with a boolean `Where`, which the fusion does not match. It
    shares the source's Linear modules; `bertforge export` checks its graph against PyTorch before keeping it."""

    def __init__(self, source: SelfAttention):
        super().__init__(source.n_heads, source.head_dim, 0.0, "eager")
        self.query, self.key, self.value = source.query, source.key, source.value

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, eager: bool = False,
                head_mask: torch.Tensor | None = None, kv_cache=None, rotary=None):
        """`mask`: the additive float mask [B, 1, 1, T] (0 = attend, the dtype's lowest value = padding)."""
        if head_mask is not None or kv_cache is not None or rotary is not None:
            raise BertforgeError("the ONNX export attention takes no head mask, cache or rotary positions")
        B, T, _ = x.shape
        shape = (B, T, self.n_heads, self.head_dim)
        q = self.query(x).view(shape).permute(0, 2, 1, 3)
        k = self.key(x).view(shape).permute(0, 2, 3, 1)  # [B, heads, d, T]: K^T in one Transpose
        v = self.value(x).view(shape).permute(0, 2, 1, 3)
        scores = torch.matmul(q, k) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask
        ctx = torch.matmul(scores.softmax(dim=-1), v)
        return ctx.permute(0, 2, 1, 3).reshape(B, T, self.n_heads * self.head_dim), None
