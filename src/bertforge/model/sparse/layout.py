"""The inputs of sparse long attention: `prepare` turns a batch into a `SparseLayout`, which travels down the
encoder's layers in place of the boolean mask (see `long_attention` for Longformer, `block_sparse` for BigBird).

transformers pads every Longformer batch to a multiple of the window before the layers; the blocked maths of
`long_attention` needs only a multiple of w / 2, which each layer pads itself (and cuts), so the results are the
same at every length and no padding happens here. BigBird's blocks are positions, so its batches are padded here to
a multiple of `block_size` (said once per length remainder) and cut back by `SparseLayout.unpad`.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.config import ModelConfig
from bertforge.config.long import block_sparse_min_length
from bertforge.errors import BertforgeError
from bertforge.families.family import BLOCK_SPARSE, SLIDING_WINDOW


@dataclass
class SparseLayout:
    """What a sparse attention layer reads besides its input: which tokens are real, which are global.

    keep [B, T] bool: real tokens (T may include the padding `prepare` added, `pad_len` tokens at the end).
    Longformer's global tokens (all None when no row has any): `is_global` [B, T] bool; `global_index` [B, G], each
    row's global positions in order, padded with 0 where `global_valid` [B, G] is False (G = the most global
    tokens of any row); `global_slots` = global_valid.nonzero(), found once per batch, not once per layer."""

    keep: torch.Tensor
    is_global: torch.Tensor | None = None
    global_index: torch.Tensor | None = None
    global_valid: torch.Tensor | None = None
    global_slots: tuple[torch.Tensor, torch.Tensor] | None = None
    pad_len: int = 0

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, ...] without the padding `prepare` added."""
        return x[:, : x.shape[1] - self.pad_len] if self.pad_len else x


_SAID: set[tuple[str, int]] = set()


def global_mask_from_indices(input_ids: torch.Tensor, indices: list[int]) -> torch.Tensor:
    """A [B, T] global-attention mask with the tokens at `indices` (the same in every row) global; an index outside
    the sequence is refused in one line."""
    length = input_ids.shape[1]
    bad = [i for i in indices if not -length <= i < length]
    if bad:
        raise BertforgeError(f"global attention index {bad[0]} is out of range for a sequence of {length} tokens")
    mask = torch.zeros_like(input_ids, dtype=torch.long)
    mask[:, list(indices)] = 1
    return mask


def prepare(cfg: ModelConfig, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
            token_type_ids: torch.Tensor | None, position_ids: torch.Tensor | None,
            global_attention_mask: torch.Tensor | None):
    """(input_ids, token_type_ids, position_ids, SparseLayout | None) for a sparse family's encoder.

    Longformer: global tokens from `global_attention_mask` [B, T] (1 = global; transformers' input), never on
    padding. BigBird block-sparse: the batch is padded to a multiple of `block_size` (said once; outputs are cut
    back by `SparseLayout.unpad`); a batch of at most (5 + 2 r) blocks runs full attention as in transformers, and
    so does attention_type "original_full": then the layout is None and the layers get the ordinary mask."""
    sparse, (B, T) = cfg.family.sparse_attention, input_ids.shape
    if global_attention_mask is not None:
        if sparse != SLIDING_WINDOW:
            raise BertforgeError(f"global_attention_mask is a Longformer input; a {cfg.model_type} model has no "
                                 "global tokens of choice")
        if tuple(global_attention_mask.shape) != (B, T):
            raise BertforgeError(f"global_attention_mask has shape {tuple(global_attention_mask.shape)}, the input "
                                 f"ids {(B, T)}")
    if sparse == BLOCK_SPARSE and (cfg.attention_type != "block_sparse" or T <= block_sparse_min_length(cfg)):
        return input_ids, token_type_ids, position_ids, None  # full attention: the ordinary mask rule
    if attention_mask is not None and attention_mask.dim() != 2:
        raise BertforgeError(f"a {cfg.model_type} model takes a [batch, length] attention_mask, not a query x key "
                             "one (its sparse attention pattern is fixed)")
    keep = (attention_mask.bool() if attention_mask is not None
            else torch.ones(B, T, dtype=torch.bool, device=input_ids.device))
    if sparse == BLOCK_SPARSE:
        pad = (-T) % cfg.block_size
        if pad:
            if (sparse, T % cfg.block_size) not in _SAID:
                _SAID.add((sparse, T % cfg.block_size))
                warnings.warn(f"input length {T} is not a multiple of BigBird's block_size {cfg.block_size}: padded "
                              f"to {T + pad} inside the model (outputs are cut back to {T})", stacklevel=3)
            input_ids = F.pad(input_ids, (0, pad), value=cfg.pad_token_id)
            token_type_ids = None if token_type_ids is None else F.pad(token_type_ids, (0, pad), value=0)
            position_ids = None if position_ids is None else F.pad(position_ids, (0, pad), value=cfg.pad_token_id)
            keep = F.pad(keep, (0, pad), value=False)
        return input_ids, token_type_ids, position_ids, SparseLayout(keep, pad_len=pad)
    layout = SparseLayout(keep)
    if global_attention_mask is not None:
        is_global = global_attention_mask.bool() & keep  # transformers: mask * (global + 1), so padding stays 0
        counts = is_global.sum(1)
        most = int(counts.max())
        if most:
            # global positions first, in order (a stable sort of "not global")
            layout.is_global = is_global
            layout.global_index = torch.sort((~is_global).to(torch.int8), dim=1, stable=True).indices[:, :most]
            layout.global_valid = torch.arange(most, device=keep.device) < counts[:, None]
            layout.global_slots = layout.global_valid.nonzero(as_tuple=True)
    return input_ids, token_type_ids, position_ids, layout


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [B, T, ...] at index [B, G] -> [B, G, ...]."""
    return x[torch.arange(x.shape[0], device=x.device)[:, None], index]


def task_global_mask(input_ids: torch.Tensor, kind: str, sep_token_id: int) -> torch.Tensor | None:
    """Longformer's global tokens for a task kind (Beltagy et al. 2020, sec. 6), as transformers' Longformer task
    classes set them when given none: [CLS] for sequence classification and regression (and for MLM pretraining,
    bertforge's choice); the question, every token before the first separator, for QA ("qa"); the tokens after the
    first separator pair for multiple choice ("choice"); none for tagging ("tag": None). A row without a separator
    keeps [CLS] only."""
    if kind == "tag":
        return None
    length = input_ids.shape[1]
    mask = torch.zeros_like(input_ids, dtype=torch.long)
    if kind not in ("qa", "choice"):
        mask[:, 0] = 1
        return mask
    is_sep = input_ids == sep_token_id
    found = is_sep.any(1, keepdim=True)
    first = is_sep.int().argmax(1, keepdim=True)
    pos = torch.arange(length, device=input_ids.device)[None, :]
    part = pos < first if kind == "qa" else pos > first + 1
    cls_only = pos == 0
    return torch.where(found, part, cls_only).long()


class SparseProjection:
    """`project` for the sparse layers, which `for_inference` does not fuse: BERT's one [3H, H] matmul while
    `query` / `key` / `value` are float `nn.Linear`s, three calls once int8 quantisation has replaced them (their
    weights are packed then, with no `.weight` tensor to concatenate). Mixed in before `SelfAttention`."""

    def project(self, x: torch.Tensor) -> torch.Tensor:
        if all(type(m) is nn.Linear for m in (self.query, self.key, self.value)):
            return super().project(x)
        return torch.cat([self.query(x), self.key(x), self.value(x)], dim=-1)
