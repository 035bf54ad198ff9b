"""Estimated training FLOPs per token, to compare arms at equal compute (ELECTRA's Table 1 does the same).

Training costs three forward passes (forward + backward; Kaplan et al. 2020's 6N per token is this with N the
matrix parameters). A forward pass per token: 2 FLOPs per weight of each matrix it goes through, plus attention's
two T x d products per layer (scores and the weighted sum), plus the vocabulary head only where a token is
predicted (MLM: the masked share; a left-to-right LM: every token; ELECTRA: the generator's masked share and a
per-token discriminator head). Embedding look-ups are free; layer norms, softmax and activations are ignored.
"""
from __future__ import annotations

from typing import Any

from bertforge.config import ModelConfig
from bertforge.families.electra import RTD_OBJECTIVE
from bertforge.pretraining.recipes import LEFT_TO_RIGHT


def encoder_forward_flops(cfg: ModelConfig, seq_len: int) -> float:
    """Forward FLOPs per token of the encoder stack (no head). Disentangled attention (DeBERTa) adds each relative
    term's scores against the 2T - 1 table rows a sequence reaches (the table's own projection, once per batch,
    is left out)."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    mlp_in = 2 * i if cfg.gated_mlp else i       # a gated MLP's first matrix has both halves
    per_layer = 2 * (4 * h * h + h * mlp_in + i * h) + 2 * 2 * seq_len * h
    if cfg.position_embedding_type == "disentangled":
        per_layer += len(cfg.relative_attention_terms) * 2 * (2 * seq_len - 1) * h
    project = 2 * cfg.embedding_size * h if cfg.embedding_size != h else 0
    return cfg.num_hidden_layers * per_layer + project


def vocab_head_flops(cfg: ModelConfig) -> float:
    """Forward FLOPs of the MLM head for one predicted token: transform (H -> E) and the tied projection."""
    return 2 * (cfg.hidden_size * cfg.embedding_size + cfg.embedding_size * cfg.vocab_size)


def training_flops_per_token(arm: dict[str, Any], seq_len: int) -> float:
    """arm: {"objective", "mask_prob", "model": ModelConfig, "generator": ModelConfig | None}."""
    cfg, objective = arm["model"], arm["objective"]
    forward = encoder_forward_flops(cfg, seq_len)
    if objective == RTD_OBJECTIVE:
        gen = arm["generator"]
        forward += 2 * cfg.hidden_size * cfg.hidden_size  # the discriminator's per-token dense layer
        forward += encoder_forward_flops(gen, seq_len) + arm["mask_prob"] * vocab_head_flops(gen)
    elif objective in LEFT_TO_RIGHT:
        forward += vocab_head_flops(cfg)
    else:
        forward += arm["mask_prob"] * vocab_head_flops(cfg)
    return 3.0 * forward
