"""XLNet's factorisation orders with partial prediction (Yang et al. 2019, sections 2.2-2.3).

For each sequence a factorisation order z is sampled uniformly over its non-special tokens, and only the last
1/K of z is predicted (K = 6 in the paper's base models: about 16.7% of tokens, near BERT's 15%). The tokens
before the cut are context: every target sees all of them, and they see each other in both directions, so their
order among themselves changes nothing. What an example needs is therefore each target's place among the targets:
`perm_rank` (0 .. P-1 in the order, -1 for context, special tokens and padding), from which the model builds
`perm_mask` and `target_mapping` (`bertforge.model.permutation_mask`, `target_mapping_of`). This is XLNet's
`_local_perm` with the targets chosen as the tail of one uniform order. Special tokens ([CLS], [SEP]) are always
context, as XLNet's functional tokens are never predicted.

The inputs stay unchanged (no [MASK]): the query stream predicts a target from its position alone.
`PermutationSampler` has the `Masker` interface (input_ids, word_start, rng) -> dict, so the dataset and collator
draw orders statically or dynamically exactly as they draw MLM masks.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from bertforge.data.masking import IGNORE_INDEX
from bertforge.errors import BertforgeError


class PermutationSampler:
    """Sample a factorisation order and its last 1/k as targets; returns input_ids (unchanged), mlm_labels (the
    token at each target, -100 elsewhere) and perm_rank (each target's place in the order, -1 elsewhere)."""

    def __init__(self, vocab_size: int, special_ids: Iterable[int], k: int = 6):
        if k < 1:
            raise BertforgeError(f"--plm-k must be at least 1 (predict the last 1/K of each order), got {k}")
        self.vocab_size, self.k = int(vocab_size), int(k)
        self._is_special = np.zeros(self.vocab_size, bool)
        self._is_special[[i for i in special_ids if 0 <= i < self.vocab_size]] = True

    def budget(self, n_candidates: int) -> int:
        """How many of n_candidates tokens are predicted: the last round(n / K) of the order, at least one."""
        return 0 if n_candidates == 0 else max(1, int(round(n_candidates / self.k)))

    def __call__(self, input_ids: np.ndarray, word_start: np.ndarray | None = None,
                 rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        ids = np.asarray(input_ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise BertforgeError(f"token id out of range [0, {self.vocab_size}) in the sequence to permute")
        rng = rng if rng is not None else np.random.default_rng()
        candidates = np.flatnonzero(~self._is_special[ids])
        order = rng.permutation(candidates)                   # the factorisation order z
        targets = order[len(order) - self.budget(len(order)):]  # its last 1/K, in order
        rank = np.full(len(ids), -1, np.int64)
        rank[targets] = np.arange(len(targets))
        labels = np.full(len(ids), IGNORE_INDEX, np.int64)
        labels[targets] = ids[targets]
        return {"input_ids": ids.copy(), "mlm_labels": labels, "perm_rank": rank}
