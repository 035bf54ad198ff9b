"""Rows, batches and forward passes shared by training, evaluation and prediction.

A *row* is one example's (or one SQuAD window's) tensors trimmed to its real length, so that batches can be
grouped by length and padded only to their own longest row.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from tqdm.auto import tqdm

from bertforge.tasks.features import IGNORE_INDEX

PAD_VALUES = {"input_ids": None, "token_type_ids": 0, "attention_mask": 0, "labels": IGNORE_INDEX,
              "word_index": -1}
INPUT_KEYS = ("input_ids", "token_type_ids", "attention_mask")
TRAIN_KEYS = INPUT_KEYS + ("labels", "start_positions", "end_positions")  # what model(**batch) takes in training


def unpad(batch: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Split a padded feature dict into per-example rows trimmed to their real length (for length-grouping)."""
    lengths = batch["attention_mask"].sum(-1)
    if lengths.dim() == 2:  # multiple choice: keep every choice as long as its longest
        lengths = lengths.max(-1).values
    rows = []
    for i, n in enumerate(lengths.tolist()):
        row = {}
        for k, v in batch.items():
            row[k] = v[i][..., :n] if v.dim() >= 2 and v.shape[-1] == batch["attention_mask"].shape[-1] else v[i]
        rows.append(row)
    return rows


def make_collate(pad_id: int) -> Callable[[list[dict]], dict[str, torch.Tensor]]:
    """Pad rows to the longest in the batch (token-level keys) and stack scalars (labels, positions)."""

    def collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        t = max(r["input_ids"].shape[-1] for r in rows)
        out = {}
        for key in rows[0]:
            vals = [r[key] for r in rows]
            if key in PAD_VALUES and vals[0].dim() >= 1 and (key != "labels" or vals[0].dim() == rows[0]["input_ids"].dim()):
                fill = pad_id if key == "input_ids" else PAD_VALUES[key]
                vals = [torch.nn.functional.pad(v, (0, t - v.shape[-1]), value=fill) for v in vals]
            out[key] = torch.stack(vals)
        return out

    return collate


def row_length(row: dict[str, torch.Tensor]) -> int:
    return int(row["input_ids"].shape[-1])


def forward_rows(model: nn.Module, rows: list[dict], pad_id: int, batch_size: int, keys: tuple[str, ...],
                 desc: str = "eval", progress: bool = True) -> list[dict[str, torch.Tensor]]:
    """Run the model over rows (sorted by length for speed), returning each row's outputs (trimmed) in order."""
    device = next(model.parameters()).device
    collate = make_collate(pad_id)
    order = sorted(range(len(rows)), key=lambda i: -row_length(rows[i]))
    results: list[dict[str, torch.Tensor] | None] = [None] * len(rows)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in tqdm(range(0, len(order), batch_size), desc=desc, disable=not progress, leave=False):
            idx = order[start:start + batch_size]
            batch = collate([{k: v for k, v in rows[i].items() if k in INPUT_KEYS} for i in idx])
            out = model(**{k: v.to(device) for k, v in batch.items()})
            for j, i in enumerate(idx):
                n = row_length(rows[i])
                # token-level outputs ([B, T, K] logits, [B, T] start/end) lose their padding; [B, K] stay whole
                token_level = lambda k: out[k].dim() == 3 or k in ("start_logits", "end_logits")  # noqa: E731
                results[i] = {k: (out[k][j][:n] if token_level(k) else out[k][j]).float().cpu() for k in keys}
    model.train(was_training)
    return results  # type: ignore[return-value]


def qa_logits(model: nn.Module, rows: list[dict], pad_id: int, batch_size: int, width: int,
              desc: str = "eval", progress: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Start/end logits [F, width] for SQuAD post-processing (trimmed padding refilled with a very low score)."""
    outs = forward_rows(model, rows, pad_id, batch_size, ("start_logits", "end_logits"), desc, progress)
    start = torch.full((len(rows), width), -1e4)
    end = torch.full((len(rows), width), -1e4)
    for i, o in enumerate(outs):
        n = o["start_logits"].shape[0]
        start[i, :n], end[i, :n] = o["start_logits"], o["end_logits"]
    return start, end
