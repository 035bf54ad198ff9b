"""The one positions rule: a sequence length the model's learned position table cannot hold is refused before any
work, in one line naming where the length came from (a flag, or a field of a saved file) and the model's limit.

Every verb that reads a length calls it: finetune / evaluate / predict (`--max-seq-len`, or the max_seq_len a
fine-tuned model's config.json records), distill task (`--max-seq-len`, against the teacher and the student),
distill general (`--seq-len`), analyze (`--max-length`), embed / index / serve (the max_seq_length a sentence
encoder's folder records). A default length is no request: `fit_length` shortens it to the model's limit.
Relative (XLNet, T5), rotary (ModernBERT) and disentangled (DeBERTa: distances past its buckets share the outermost
one, as in transformers, which bounds no DeBERTa input either) positions have no table to run past: no limit.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError


def position_limit(cfg: Any) -> int | None:
    """The longest input (tokens, special tokens included) a model's learned position table holds, or None when
    nothing bounds it. `cfg`: a ModelConfig or a Seq2SeqConfig."""
    family = cfg.family
    if family.relative_positions or getattr(cfg, "position_embedding_type", "absolute") != "absolute":
        return None
    offset = cfg.position_offset if hasattr(cfg, "position_offset") else family.position_offset
    return cfg.max_position_embeddings - offset


def check_length(length: int, cfg: Any, model: str | Path, what: str) -> int:
    """Refuse `length` if the model's positions cannot hold it; returns it. `what` names its origin: a flag
    ("--max-seq-len") or a saved field ("runs/x/config.json: max_seq_len")."""
    limit = position_limit(cfg)
    if limit is not None and length > limit:
        fix = f"use {what} {limit} or less" if what.startswith("-") else f"it may be {limit} at most"
        raise BertforgeError(f"{what} {length} is longer than the {limit} positions of {model}; {fix}")
    return length


def fit_length(length: int, cfg: Any) -> int:
    """A default length, shortened to the model's limit."""
    limit = position_limit(cfg)
    return length if limit is None else min(length, limit)
