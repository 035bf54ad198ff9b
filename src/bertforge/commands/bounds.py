"""Bounds of numeric command-line flags, declared once where each flag is declared (`type=COUNT`, ...).

A value outside its bound is refused by argparse before the verb starts, as one line naming the flag:
`bertforge finetune: error: --lr must be a finite number > 0 (got nan)` (bertforge.cli.OneLineParser's
wording). Every numeric flag of every
verb uses one of these (tests/test_reliability_validation.py walks the parsers and checks it), so a new flag
cannot silently accept 0 steps, a negative size or a NaN learning rate.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Number:
    """An argparse `type=` that parses a finite int or float within [low, high] (`open_low`: strictly above low)."""

    integer: bool
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    what: str = "a finite number"  # completes "--FLAG must be ..."

    @property
    def __name__(self) -> str:  # argparse names the type in some messages
        return self.what

    def __call__(self, text: str) -> int | float:
        try:
            value: int | float = int(text) if self.integer else float(text)
        except ValueError:
            kind = "a whole number" if self.integer else "a number"
            raise argparse.ArgumentTypeError(f"must be {kind} {self.what} (got {text!r})") from None
        if not math.isfinite(value):
            what = "" if self is FINITE else f" {self.what}"
            raise argparse.ArgumentTypeError(f"must be a finite number{what} (got {text})")
        too_low = self.low is not None and (value <= self.low if self.open_low else value < self.low)
        if too_low or (self.high is not None and value > self.high):
            raise argparse.ArgumentTypeError(f"must be {self.what} (got {value})")
        return value

    def bad_values(self) -> list[str]:
        """Values this bound refuses (the adversarial test feeds each to every flag declared with it)."""
        bad = ["nan", "inf", "-inf", "x"]
        if self.low is not None:
            bad.append(str(int(self.low) - 1) if self.integer else str(self.low - 1))
            if self.open_low:
                bad.append(str(int(self.low)) if self.integer else str(self.low))
        if self.high is not None:
            bad.append(str(int(self.high) + 1) if self.integer else str(self.high * 2 + 1))
        if self.integer:
            bad.append("1.5")
        return bad

    def good_value(self) -> str:
        """One value this bound accepts."""
        if self.high is not None and self.low is not None and not self.integer:
            return str((self.low + self.high) / 2)
        if self.low is None:
            return "1"
        return str(int(self.low) + 1) if self.integer else str(self.low + 1)


COUNT = Number(True, 1, what="at least 1")                  # steps, sizes, batches, examples, layers
COUNT0 = Number(True, 0, what="at least 0")                 # optional extras where 0 means none
SEED = Number(True, 0, 2**32 - 1, what="in 0..4294967295")  # numpy refuses seeds outside 32 bits
PORT = Number(True, 0, 65535, what="in 0..65535")
POSITIVE = Number(False, 0, open_low=True, what="> 0")      # learning rates, temperatures, epochs
NONNEG = Number(False, 0, what=">= 0")                      # loss weights, decay, waits
FRACTION = Number(False, 0, 1, what="in [0, 1]")            # probabilities, ratios, shares
OPEN_FRACTION = Number(False, 0, 1, open_low=True, what="in (0, 1]")
FINITE = Number(False, what="finite")                       # exponents that may be negative


def int_range(low: int, high: int) -> Number:
    return Number(True, low, high, what=f"in {low}..{high}")


# Optimizer steps: the longest published pretraining runs take about 10^6 steps (BERT 1M, ELECTRA-Large 4M at
# most); 10^9 is a thousand times that (11 days at 1 ms a step). Far beyond it a warm-up / decay schedule never
# leaves its first steps: --max-steps 1e26 trains at lr ~1e-27, forever.
STEPS = int_range(1, 10**9)
# Epochs: fine-tuning runs 2-10; 10^6 leaves room for tiny data sets while refusing "forever".
EPOCHS = Number(False, 0, 10**6, open_low=True, what="in (0, 1000000]")
# A sequence length in tokens: 16x the longest published encoder inputs (Longformer / BigBird 4096, ModernBERT
# 8192); a learned position table of width 768 holds 200 MB at the bound (at 1e12: 3 PB).
LENGTH = int_range(1, 1 << 16)


# torch's TorchScript ONNX exporter (dynamo=False) writes opsets up to 20; attention needs 14 and up
OPSET = int_range(14, 20)
