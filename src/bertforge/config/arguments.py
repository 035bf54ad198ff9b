"""What the arguments of a verb may hold, declared once for the command line and the Python API.

Each bound or kind is one object with two doors: argparse calls it on a flag's text (`type=COUNT`; a value outside
is refused as `--batch-size must be a whole number at least 1 (got '0')`, naming the flag), and the public
functions check their arguments with `check_args` before any work (a value outside is one
`bertforge.errors.ArgumentError`, a ValueError and a TypeError, naming the parameter:
`batch_size='32': must be a whole number at least 1, not a str`). Torch-free: the parser imports it.
"""
from __future__ import annotations

import argparse
import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

from bertforge.errors import ArgumentError


def shown(value: Any) -> str:
    """A value as a message shows it: its repr, cut to one short line."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _refuse(param: str, value: Any, expected: str) -> ArgumentError:
    got = "" if value is None or isinstance(value, (str, bool, numbers.Number)) else f" (a {type(value).__name__})"
    return ArgumentError.about(param, value, f"expected {expected}", shown(value) + got)


@dataclass(frozen=True)
class Number:
    """A finite int or float within [low, high] (`open_low`: strictly above low): argparse's `type=` for a flag's
    text, `check` for a Python value."""

    integer: bool
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    what: str = "a finite number"  # completes "--FLAG must be ..."
    open_high: bool = False

    @property
    def __name__(self) -> str:  # argparse names the type in some messages
        return self.what

    @property
    def expected(self) -> str:
        kind = "a whole number" if self.integer else "a finite number"
        return kind if self is FINITE else f"{kind} {self.what}"

    def __call__(self, text: str) -> int | float:
        try:
            value: int | float = int(text) if self.integer else float(text)
        except ValueError:
            kind = "a whole number" if self.integer else "a number"
            raise argparse.ArgumentTypeError(f"must be {kind} {self.what} (got {text!r})") from None
        if not math.isfinite(value):
            what = "" if self is FINITE else f" {self.what}"
            raise argparse.ArgumentTypeError(f"must be a finite number{what} (got {text})")
        if not self.within(value):
            raise argparse.ArgumentTypeError(f"must be {self.what} (got {value})")
        return value

    def within(self, value: float) -> bool:
        too_low = self.low is not None and (value <= self.low if self.open_low else value < self.low)
        too_high = self.high is not None and (value >= self.high if self.open_high else value > self.high)
        return not too_low and not too_high

    def check(self, value: Any, param: str) -> Any:
        """`value` as given when it is a number of this kind within the bound; else one line naming `param`."""
        kind = numbers.Integral if self.integer else numbers.Real
        if isinstance(value, bool) or not isinstance(value, kind):
            raise _refuse(param, value, self.expected)
        if not self.integer and not math.isfinite(value):
            raise _refuse(param, value, self.expected)
        if not self.within(value):
            raise _refuse(param, value, self.expected)
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
            if self.open_high:
                bad.append(str(self.high))
        if self.integer:
            bad.append("1.5")
        return bad

    def good_value(self) -> str:
        """One value this bound accepts."""
        if self.high is not None and self.low is not None and not self.integer:  # (an open bound: inside it)
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
INNER_FRACTION = Number(False, 0, 1, open_low=True, what="in (0, 1)", open_high=True)  # a share of what a model has
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


# ---- kinds of Python values -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Kind:
    """A Python argument's kind: `test(value)` says whether it is one; `expected` completes "expected ..."."""

    test: Callable[[Any], bool]
    expected: str

    def check(self, value: Any, param: str) -> Any:
        if not self.test(value):
            raise _refuse(param, value, self.expected)
        return value


@dataclass(frozen=True)
class OrNone:
    """`spec`, or None (the parameter's "not given")."""

    spec: Any

    def check(self, value: Any, param: str) -> Any:
        if value is None:
            return value
        try:
            return self.spec.check(value, param)
        except ArgumentError:
            raise _refuse(param, value, f"{self.spec.expected}, or None") from None

    @property
    def expected(self) -> str:
        return f"{self.spec.expected}, or None"


def maybe(spec: Any) -> OrNone:
    return OrNone(spec)


def _name(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike)) and bool(str(os.fspath(value)).strip())


def _scalar(value: Any) -> bool:
    """What no model, data or folder can be: None, a bool, a number, bytes."""
    return value is None or isinstance(value, (bool, numbers.Number, bytes))


def _texts(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, (list, tuple)) and all(isinstance(t, str) for t in value))


BOOL = Kind(lambda v: isinstance(v, bool), "True or False")
TEXT = Kind(lambda v: isinstance(v, str) and bool(v.strip()), "a non-empty string")
PATH = Kind(_name, "a path (a str or os.PathLike)")
# a folder or Hub id, or a model already loaded (an object, a (model, tokenizer) pair)
MODEL = Kind(lambda v: _name(v) or not (_scalar(v) or isinstance(v, (str, list, dict, set))),
             "a model folder, a Hugging Face Hub id or a loaded model")
# a path, or data in memory (a list, a dict of splits, a DataFrame, a Dataset, ...)
DATA = Kind(lambda v: _name(v) or not (_scalar(v) or isinstance(v, str)),
            "a path or data in memory (a list, a table, a dataset)")
TEXTS = Kind(_texts, "a string or a list of strings")
DEVICE = Kind(lambda v: (isinstance(v, str) and bool(v.strip())) or type(v).__name__ in ("device", "Placement"),
              "a device name (auto, cpu, cuda, cuda:N, mps)")
MAPPING = Kind(lambda v: isinstance(v, Mapping), "a dict")


def built_student(spec: Any) -> bool:
    """`distill task --student`'s layers:N or bilstm: a student built from the teacher, no model to load."""
    return isinstance(spec, str) and (spec == "bilstm" or spec.startswith("layers:"))


def choice(*names: str) -> Kind:
    return Kind(lambda v: isinstance(v, str) and v in names, "one of " + ", ".join(names))


def check_args(values: Mapping[str, Any], **specs: Any) -> None:
    """Each named argument of `values` (a function's `locals()` at its top) checked against its spec: one
    `ArgumentError` naming the first parameter that is wrong, before any work."""
    for param, spec in specs.items():
        spec.check(values[param], param)
