"""StructBERT's word-structural corruption (Wang et al. 2020, section 3.1): shuffle trigrams, predict the order.

After MLM masking, a share of the trigrams of unmasked tokens is shuffled in place and the model must put every
shuffled token back: at each of the three positions it predicts the original token with the (tied) MLM output
layer, i.e. maximises sum_i log P(pos_i = t_i | shuffled input). The paper "randomly choose[s] 5% of the trigrams
from unmasked tokens"; a sequence of n tokens has about n trigrams, so here round(0.05 * n) disjoint trigrams are
shuffled (15% of tokens at most), each made of three consecutive non-special tokens that MLM did not choose. A
trigram is given one of its five non-identity orders, so the order always changes (a repeated token such as
"no no no" can still read the same). Labels go to `wso_labels`, apart from `mlm_labels`, so the two losses and
accuracies are reported separately.

`WordShuffle` wraps a `Masker` and keeps its interface, so static and dynamic masking draw shuffles too.
"""
from __future__ import annotations

import numpy as np

from bertforge.data.masking import IGNORE_INDEX, Masker
from bertforge.errors import BertforgeError

# The five orders of (a, b, c) other than (a, b, c).
_SHUFFLES = np.array([[0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]])


class WordShuffle:
    """MLM masking (the wrapped Masker) plus trigram shuffling of unmasked tokens; adds `wso_labels`."""

    def __init__(self, masker: Masker, trigram_rate: float = 0.05):
        if not 0.0 < trigram_rate <= 1.0 / 3:
            raise BertforgeError(f"trigram_rate must be in (0, 1/3], got {trigram_rate}")
        self.masker, self.trigram_rate = masker, trigram_rate

    def __call__(self, input_ids: np.ndarray, word_start: np.ndarray | None = None,
                 rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        rng = rng if rng is not None else np.random.default_rng()
        out = self.masker(input_ids, word_start, rng)
        original = np.asarray(input_ids, dtype=np.int64)
        special = self.masker.is_special(original)
        free = ~special & (out["mlm_labels"] == IGNORE_INDEX)
        n = int(round(self.trigram_rate * int((~special).sum())))
        starts = self.pick_trigrams(free, n, rng)
        ids, labels = out["input_ids"], np.full(len(original), IGNORE_INDEX, np.int64)
        if len(starts):
            cols = starts[:, None] + np.arange(3)                                   # [n, 3] positions
            perm = _SHUFFLES[rng.integers(0, len(_SHUFFLES), len(starts))]
            ids[cols] = original[starts[:, None] + perm]
            labels[cols] = original[cols]
        out["wso_labels"] = labels
        return out

    @staticmethod
    def pick_trigrams(free: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
        """Start positions of up to n disjoint trigrams of free positions, in random order of candidates."""
        ok = free[:-2] & free[1:-1] & free[2:] if len(free) >= 3 else np.zeros(0, bool)
        taken = np.zeros(len(free), bool)
        starts = []
        for s in rng.permutation(np.flatnonzero(ok)).tolist():
            if len(starts) == n:
                break
            if not taken[s:s + 3].any():
                taken[s:s + 3] = True
                starts.append(s)
        return np.sort(np.asarray(starts, np.int64))
