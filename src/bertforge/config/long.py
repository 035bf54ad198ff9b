"""The long-attention settings of `ModelConfig` (Longformer and BigBird): defaults and checks. Their `config.json`
fields are the families' (`families/longformer.py`, `families/big_bird.py`).

Longformer (`LongformerConfig`): `attention_window`, one even window per layer (an int means every layer); a token
attends to the keys within window / 2 positions of it, plus the global tokens. BigBird (`BigBirdConfig`):
`attention_type` ("block_sparse" or "original_full"), `block_size` and `num_random_blocks`. `ModelConfig` calls
`normalise` from `__post_init__`.
"""
from __future__ import annotations

from typing import Any

from bertforge.errors import BertforgeError
from bertforge.families import FAMILIES
from bertforge.families.family import BLOCK_SPARSE, SLIDING_WINDOW
from bertforge.families.longformer import WINDOW as LONGFORMER_WINDOW

ATTENTION_TYPES = ("block_sparse", "original_full")  # BigBird's, as transformers names them


def _families_with(pattern: str) -> str:
    return " or ".join(repr(name) for name, fam in FAMILIES.items() if fam.sparse_attention == pattern)


def normalise(cfg: Any) -> None:
    """Fill the family defaults into `cfg` (a ModelConfig) and check the long-attention fields; one line each."""
    sparse = cfg.family.sparse_attention
    if sparse != SLIDING_WINDOW and cfg.attention_window is not None:
        raise BertforgeError(f"attention_window is a Longformer setting (sliding-window attention); model_type "
                             f"{cfg.model_type!r} has none (use model_type {_families_with(SLIDING_WINDOW)})")
    if sparse != BLOCK_SPARSE and cfg.attention_type is not None:
        raise BertforgeError(f"attention_type is a BigBird setting (block-sparse attention); model_type "
                             f"{cfg.model_type!r} has none (use model_type {_families_with(BLOCK_SPARSE)})")
    if sparse == SLIDING_WINDOW:
        window = LONGFORMER_WINDOW if cfg.attention_window is None else cfg.attention_window
        windows = [int(window)] * cfg.num_hidden_layers if isinstance(window, int) else [int(w) for w in window]
        if len(windows) != cfg.num_hidden_layers:
            raise BertforgeError(f"attention_window has {len(windows)} entries for {cfg.num_hidden_layers} layers "
                                 "(give one int, or one window per layer)")
        bad = [w for w in windows if w <= 0 or w % 2]
        if bad:
            raise BertforgeError(f"attention_window {bad[0]} must be a positive even number of tokens")
        cfg.attention_window = windows
    if sparse == BLOCK_SPARSE:
        cfg.attention_type = cfg.attention_type or "block_sparse"
        if cfg.attention_type not in ATTENTION_TYPES:
            raise BertforgeError(f"unknown attention_type {cfg.attention_type!r} (expected "
                                 f"{', '.join(ATTENTION_TYPES)})")
        if cfg.block_size < 1 or cfg.num_random_blocks < 0:
            raise BertforgeError(f"block_size {cfg.block_size} must be >= 1 and num_random_blocks "
                                 f"{cfg.num_random_blocks} >= 0")


def block_sparse_min_length(cfg: Any) -> int:
    """BigBird's block-sparse attention needs more than (5 + 2 r) blocks (2 global + 3 window + r random, + r spare,
    transformers' `max_tokens_to_attend`); a batch this long or shorter runs full attention instead."""
    return (5 + 2 * cfg.num_random_blocks) * cfg.block_size
