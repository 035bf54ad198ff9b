"""`PretrainingDataset` (map-style, indexable: the trainer shuffles and resumes by position) and its collator.

`LMCollator` is the left-to-right LM's (GPT): no masks, the targets are the inputs shifted by one.

Static masking (BERT): `dupe_factor` copies of the examples, each built with its own randomness, and each
example's mask fixed once: it is a pure function of (seed, index), drawn in `__getitem__` with epoch 0, so every
epoch sees the same mask without storing it. Dynamic masking (RoBERTa): `__getitem__` returns the clean example
and the collator draws the mask from (seed, epoch, index) when the batch is made.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from bertforge.data.examples import ExampleBuilder, ExamplePlan, make_builder, plan_rng
from bertforge.data.masking import IGNORE_INDEX, Masker, batch_mask_rng, mask_rng
from bertforge.errors import BertforgeError

_PAD_VALUES = {"input_ids": None, "token_type_ids": 0, "attention_mask": 0, "mlm_labels": IGNORE_INDEX,
               "sbo_left": 0, "sbo_right": 0, "sbo_pos": 0,  # span masking (SpanBERT)
               "wso_labels": IGNORE_INDEX,                    # trigram shuffling (StructBERT)
               "perm_rank": -1}                               # factorisation orders (XLNet)
_OPTIONAL = ("sbo_left", "sbo_right", "sbo_pos", "wso_labels", "perm_rank")


class PlannedDataset(Dataset):
    """What every pretraining dataset over an `ExamplePlan` shares (the encoders' and the encoder-decoders'): one
    example per plan row, the epoch that dynamic noise is drawn from (the loader sets it), and lengths read off the
    plan for length grouping. Subclasses set `self.plan` and write `__getitem__`."""

    plan: ExamplePlan
    epoch: int = 0

    def __len__(self) -> int:
        return len(self.plan)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def lengths(self) -> np.ndarray:
        """Every example's sequence length (for length grouping), computed from the plan."""
        return self.plan.lengths()

    def checked(self, index: int) -> int:
        """`index` as an int, or IndexError when it is outside the plan."""
        index = int(index)
        if not 0 <= index < len(self.plan):
            raise IndexError(f"example {index} out of range [0, {len(self.plan)})")
        return index


class PretrainingDataset(PlannedDataset):
    """Examples of `builder` over `corpus`, masked by `masker` (statically or dynamically). `masker` is a `Masker`
    or anything with its call (input_ids, word_start, rng) -> dict: `WordShuffle`, `PermutationSampler`."""

    def __init__(self, corpus, builder: ExampleBuilder | str = "segment_pair", masker: Masker | None = None,
                 seq_len: int = 128, masking: str = "dynamic", dupe_factor: int = 1, seed: int = 0,
                 **builder_kwargs: Any):
        if masking not in ("static", "dynamic"):
            raise BertforgeError(f"masking must be 'static' or 'dynamic', not {masking!r}")
        if dupe_factor < 1:
            raise BertforgeError(f"dupe_factor must be >= 1, got {dupe_factor}")
        self.corpus = corpus
        self.builder = make_builder(builder, seq_len=seq_len, **builder_kwargs) if isinstance(builder, str) else builder
        if masker is None and corpus.mask_id is not None:  # (a tokenizer without a mask token: a causal LM's)
            masker = Masker(corpus.vocab_size, corpus.mask_id, corpus.special_ids)
        self.masker = masker
        self.masking, self.seed, self.epoch = masking, int(seed), 0
        self.plan = ExamplePlan.concat([self.builder.plan(corpus, plan_rng(self.seed, k)) for k in range(dupe_factor)])
        if len(self.plan) == 0:
            raise BertforgeError(f"{self.builder.name}: the corpus gives no examples ({corpus!r})")

    def __getitem__(self, index: int) -> dict[str, Any]:
        index = self.checked(index)
        # dynamic token masking (RoBERTa's) never reads word starts: not read from the shards at all
        token_only = self.masking == "dynamic" and isinstance(self.masker, Masker) and self.masker.mode == "token"
        ex: dict[str, Any] = self.builder.materialize(self.corpus, self.plan, index, words=not token_only)
        ex["index"] = index
        if self.masking == "static":
            ex.update(self.masker(ex["input_ids"], ex["word_start"], mask_rng(self.seed, 0, index)))
        return ex

    def collator(self) -> "Collator":
        """The collate function for this dataset (dynamic masking only when the dataset is not statically masked)."""
        return Collator(self.masker if self.masking == "dynamic" else None, self.corpus.pad_id, self.seed)


class Collator:
    """Pad a list of examples into a batch of tensors: input_ids, token_type_ids, attention_mask, mlm_labels
    (-100 = not masked), optional sentence_label, sbo_left / sbo_right / sbo_pos, wso_labels, perm_rank. Examples that are not yet
    masked are masked here with `mask_rng(seed, epoch, example["index"])`."""

    def __init__(self, masker: Masker | None, pad_id: int, seed: int = 0, epoch: int = 0):
        self.masker, self.pad_id, self.seed, self.epoch = masker, int(pad_id), int(seed), int(epoch)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return collate(examples, self.masker, self.pad_id, self.seed, self.epoch)


def collate(examples: Sequence[dict[str, Any]], masker: Masker | None = None, pad_id: int = 0, seed: int = 0,
            epoch: int = 0) -> dict[str, torch.Tensor]:
    """Functional form of `Collator`."""
    if not examples:
        raise BertforgeError("collate: empty batch")
    if (isinstance(masker, Masker) and masker.mode == "token" and "mlm_labels" not in examples[0]
            and "index" in examples[0] and all(set(ex) <= _BATCH_MASKED for ex in examples)):
        return _collate_token_masked(examples, masker, pad_id, seed, epoch)
    rows = []
    for ex in examples:
        if "mlm_labels" not in ex:
            if masker is None:
                raise BertforgeError("collate: example is not masked and no masker was given")
            ex = {**ex, **masker(ex["input_ids"], ex.get("word_start"), mask_rng(seed, epoch, int(ex["index"])))}
        rows.append(ex)
    lengths = [len(ex["input_ids"]) for ex in rows]
    width = max(lengths)
    batch: dict[str, torch.Tensor] = {}
    keys = ["input_ids", "token_type_ids", "mlm_labels"] + [k for k in _OPTIONAL if k in rows[0]]
    for key in keys:
        fill = pad_id if key == "input_ids" else _PAD_VALUES[key]
        arr = np.full((len(rows), width), fill, np.int64)
        for r, ex in enumerate(rows):
            arr[r, :lengths[r]] = ex[key]
        batch[key] = torch.from_numpy(arr)
    batch["attention_mask"] = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    if "sentence_label" in rows[0]:
        batch["sentence_label"] = torch.tensor([int(ex["sentence_label"]) for ex in rows], dtype=torch.long)
    return batch


_BATCH_MASKED = {"input_ids", "token_type_ids", "word_start", "index", "sentence_label"}


def _collate_token_masked(examples: Sequence[dict[str, Any]], masker: Masker, pad_id: int, seed: int,
                          epoch: int) -> dict[str, torch.Tensor]:
    """`collate` of dynamically token-masked examples (RoBERTa's, BERT's): padded with array operations, masked
    as one batch (`Masker.mask_batch`, `batch_mask_rng`), no per-token or per-example Python work."""
    lengths = np.fromiter((len(ex["input_ids"]) for ex in examples), np.int64, len(examples))
    width = int(lengths.max())
    real = np.arange(width)[None, :] < lengths[:, None]

    def padded(key: str, fill: int) -> np.ndarray:
        if (lengths == width).all():
            return np.stack([np.asarray(ex[key], np.int64) for ex in examples])
        arr = np.full((len(examples), width), fill, np.int64)
        arr[real] = np.concatenate([np.asarray(ex[key], np.int64) for ex in examples])
        return arr

    ids = padded("input_ids", pad_id)
    rng = batch_mask_rng(seed, epoch, (ex["index"] for ex in examples))
    masked = masker.mask_batch(ids, lengths, rng)
    batch = {"input_ids": torch.from_numpy(masked["input_ids"]),
             "token_type_ids": torch.from_numpy(padded("token_type_ids", 0)),
             "mlm_labels": torch.from_numpy(masked["mlm_labels"]),
             "attention_mask": torch.from_numpy(real.astype(np.int64))}
    if "sentence_label" in examples[0]:
        batch["sentence_label"] = torch.tensor([int(ex["sentence_label"]) for ex in examples], dtype=torch.long)
    return batch


class LMCollator:
    """Pad examples into input_ids and attention_mask for a left-to-right language model: nothing is masked, every
    real token is a target (of the position before it)."""

    def __init__(self, pad_id: int):
        self.pad_id = int(pad_id)

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not examples:
            raise BertforgeError("collate: empty batch")
        lengths = [len(ex["input_ids"]) for ex in examples]
        ids = np.full((len(examples), max(lengths)), self.pad_id, np.int64)
        for r, ex in enumerate(examples):
            ids[r, :lengths[r]] = ex["input_ids"]
        mask = torch.arange(ids.shape[1])[None, :] < torch.tensor(lengths)[:, None]
        return {"input_ids": torch.from_numpy(ids), "attention_mask": mask.long()}
