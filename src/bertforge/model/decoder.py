"""The decoder: GPT-2 (Radford et al. 2019), a left-to-right language model, with transformers' GPT2LMHeadModel names.

    x = wte(ids) + wpe(positions)
    for each block:  x = x + attn(ln_1(x))      causal self-attention (`attention.attend`, causal=True)
                     x = x + mlp(ln_2(x))       c_fc -> gelu_new -> c_proj
    logits = ln_f(x) @ wte^T                    the output embedding is the input embedding (tied)

Pre-LayerNorm blocks (unlike BERT's post-LN), learned absolute positions, one fused `c_attn` projection for
Q/K/V. GPT-2 stores its projections as Conv1D ([in, out]); here they are nn.Linear and `bertforge.model.checkpoint`
transposes them, so a directory saved here loads in transformers' GPT2LMHeadModel unchanged and back.

Generation drives `DecoderLM` through two calls (see `bertforge.generation`): `prefill(prompt)` runs the prompt
once and fills a `cache.KVCache`; `step(tokens, cache)` runs one new token per row against it.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from bertforge.model.checkpoint import load_pretrained, save_pretrained
from bertforge.config import ModelConfig
from bertforge.errors import BertforgeError
from bertforge.families import DECODER
from bertforge.model.folder import ModelFolder
from bertforge.model.attention import MultiHeadAttention
from bertforge.model.cache import KVCache
from bertforge.model.dropout import Dropout
from bertforge.model.encoder import activation, init_weights


class CausalSelfAttention(MultiHeadAttention):
    """GPT-2's attention: `c_attn` (Q/K/V in one projection), left-to-right `attend`, `c_proj` back to H."""

    causal = True

    def __init__(self, cfg: ModelConfig, attn_implementation: str = "sdpa"):
        super().__init__(cfg.num_attention_heads, cfg.head_dim, cfg.attention_probs_dropout_prob, attn_implementation)
        self.c_attn = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.c_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.resid_dropout = Dropout(cfg.hidden_dropout_prob)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_attn(x)

    def forward(self, x, mask, eager=False, head_mask=None, kv_cache=None):
        ctx, probs = super().forward(x, mask, eager, head_mask, kv_cache)
        return self.resid_dropout(self.c_proj(ctx)), probs


class DecoderFeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.act = activation(cfg.hidden_act)
        self.c_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.dropout = Dropout(cfg.hidden_dropout_prob)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, attn_implementation: str = "sdpa"):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.attn = CausalSelfAttention(cfg, attn_implementation)
        self.ln_2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = DecoderFeedForward(cfg)

    def forward(self, x, mask, kv_cache=None, eager=False):
        a, probs = self.attn(self.ln_1(x), mask, eager, kv_cache=kv_cache)
        x = x + a
        return x + self.mlp(self.ln_2(x)), probs


class Decoder(nn.Module):
    """GPT2Model: token + position embeddings -> L pre-LN blocks -> final LayerNorm. Returns hidden states."""

    def __init__(self, cfg: ModelConfig, attn_implementation: str = "sdpa"):
        super().__init__()
        if cfg.stack != DECODER:
            raise BertforgeError(f"model_type {cfg.model_type} is an encoder, not a decoder (GPT-2 layout): "
                                 "load it with bertforge.model.Encoder")
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.wpe = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.drop = Dropout(cfg.hidden_dropout_prob)
        self.h = nn.ModuleList([DecoderLayer(cfg, attn_implementation) for _ in range(cfg.num_hidden_layers)])
        self.ln_f = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.apply(lambda m: init_weights(m, cfg.initializer_range))
        # GPT-2's scaled initialisation: each block adds two residual branches, so their output projections start
        # 1/sqrt(2L) smaller, keeping the residual stream's variance flat with depth.
        for block in self.h:
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                nn.init.normal_(proj.weight, 0.0, cfg.initializer_range / math.sqrt(2 * cfg.num_hidden_layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache: KVCache | None = None,
                output_attentions: bool = False) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """`attention_mask` [B, past + T] (1 = a real token, 0 = padding, as in transformers) or None when nothing
        is padded; with a `cache`, the mask it recorded covers earlier calls and the new tokens count as real.
        Returns (hidden states [B, T, H], attentions per layer when asked for)."""
        T = input_ids.shape[1]
        past = 0 if cache is None else cache.length
        key_mask = None
        if cache is not None:
            if attention_mask is not None:
                cache.set_key_mask(attention_mask)
            if cache.key_mask is not None:
                key_mask = cache.key_mask[:, :past + T]
        elif attention_mask is not None and not bool(attention_mask.all()):
            key_mask = attention_mask.bool()
        if past + T > self.config.max_position_embeddings:
            raise BertforgeError(f"{past + T} positions exceed the model's context of "
                                 f"{self.config.max_position_embeddings} (n_positions)")
        if position_ids is None:
            if key_mask is None:
                position_ids = torch.arange(past, past + T, device=input_ids.device)[None]
            else:  # left padding: every row counts its own real tokens from 0
                position_ids = (key_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:past + T]
        x = self.drop(self.wte(input_ids) + self.wpe(position_ids))
        mask = None if key_mask is None else key_mask[:, None, None, :]
        attentions = []
        for i, block in enumerate(self.h):
            x, probs = block(x, mask, None if cache is None else cache.layers[i], output_attentions)
            attentions.append(probs)
        if cache is not None:
            cache.advance(T)
        return self.ln_f(x), tuple(attentions) if output_attentions else None


class DecoderLM(nn.Module):
    """GPT2LMHeadModel: the decoder and a vocabulary projection tied to its token embedding."""

    def __init__(self, cfg: ModelConfig, attn_implementation: str = "sdpa"):
        super().__init__()
        self.config = cfg
        self.transformer = Decoder(cfg, attn_implementation)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied: one matrix, saved once (as GPT-2 does)

    def lm_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                  position_ids: torch.Tensor | None = None, cache: KVCache | None = None,
                  last_only: bool = False) -> torch.Tensor:
        """Next-token logits [B, T, V] (or [B, V] of the last position with `last_only`). Training objectives
        override `forward`; generation calls this."""
        hidden, _ = self.transformer(input_ids, attention_mask, position_ids, cache)
        return self.lm_head(hidden[:, -1] if last_only else hidden)

    forward = lm_logits

    # ---- generation (the protocol `bertforge.generation` drives; docs/generative.md) ----------------------------
    def new_cache(self, batch_size: int, max_length: int) -> KVCache:
        w = self.transformer.wte.weight
        cfg = self.config
        return KVCache(cfg.num_hidden_layers, batch_size, cfg.num_attention_heads, cfg.head_dim, max_length,
                       w.dtype, w.device)

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                max_new_tokens: int) -> tuple[torch.Tensor, KVCache, torch.Tensor]:
        """Run the (left-padded) prompts once. Returns (next-token logits [B, V], the filled cache, the token
        sequence generation continues: the prompts themselves)."""
        cache = self.new_cache(input_ids.shape[0], input_ids.shape[1] + max_new_tokens)
        logits = self.lm_logits(input_ids, attention_mask, cache=cache, last_only=True)
        return logits, cache, input_ids

    def step(self, tokens: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, KVCache]:
        """One new token per row ([B]) -> (next-token logits [B, V], the cache, now one position longer)."""
        return self.lm_logits(tokens[:, None], cache=cache, last_only=True), cache

    def max_prompt_tokens(self, max_new_tokens: int) -> int:
        """How long a prompt may be: the prompt and every new token share the context (n_positions)."""
        return self.config.max_position_embeddings - max_new_tokens

    def prompt_ids(self, tokenizer, text: str, prepend_bos: bool = False) -> list[int]:
        """A text as this model continues it: the text's tokens, nothing around them, as transformers' `generate`
        and GPT-2's own conditional sampling feed them. An empty text is <bos> alone (a new document: the start
        the model was trained after); `prepend_bos` puts <bos> before a non-empty text too."""
        ids = tokenizer.encode_ids([text])[0]
        bos = self.config.bos_token_id
        return ids if bos is None or (ids and not prepend_bos) else [bos, *ids]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @classmethod
    def from_pretrained(cls, path: "str | Path | ModelFolder", attn_implementation: str = "sdpa",
                        revision: str | None = None) -> "DecoderLM":
        folder = ModelFolder.open(path, revision=revision)
        model = cls(folder.config_for(DECODER, verb="a decoder (GPT-2 layout)"), attn_implementation)
        load_pretrained(model, folder.path)
        return model.eval()

    def save_pretrained(self, path: str | Path, tokenizer=None) -> None:
        save_pretrained(self, path, self.config, architecture=self.config.family.head_classes["lm"],
                        tokenizer=tokenizer)
