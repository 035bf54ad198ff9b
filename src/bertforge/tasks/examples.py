"""The examples every task reader returns, and the field checks they share (file:line errors).

Labels stay as the *strings* found in the file (classification) or floats (regression); the feature builders
in ``bertforge.tasks.features`` map them to ids through a label list. Standard library only.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from bertforge.errors import BertforgeError

Label = str | float | None


@dataclass
class TextExample:
    """One sentence or sentence pair. ``label``: a label string, a float (regression) or None (unlabelled)."""

    text: str
    text_pair: str | None = None
    label: Label = None
    guid: str = ""


@dataclass
class TaggingExample:
    """One pre-tokenised sentence with one tag per word (``tags`` empty when unlabelled)."""

    tokens: list[str]
    tags: list[str] = field(default_factory=list)
    guid: str = ""


@dataclass
class ChoiceExample:
    """A context and candidate endings; the model scores ``(context, ending_i)`` pairs. ``label``: the gold index."""

    context: str
    endings: list[str]
    label: int | None = None
    guid: str = ""


def text_field(value: object, where: str, name: str) -> str:
    """A non-empty text value (numbers are accepted as text), stripped; else an error naming ``where`` and ``name``."""
    if value is None or not isinstance(value, str | int | float) or not str(value).strip():
        raise BertforgeError(f"{where}: empty {name}")
    return str(value).strip()


_INTEGRAL = re.compile(r"[+-]?\d+(?:\.0*)?")
BOOLEANS = {"true": "1", "false": "0"}


def normal_label(value: object) -> str:
    """A class label by its value, not its form: a whole number written 1, "1", 1.0 or "1.0" is "1" (pandas writes
    1.0 for an integer column with a missing value); a boolean is "1" / "0"; anything else is its text, stripped."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    if _INTEGRAL.fullmatch(text):
        return str(int(text.split(".")[0]))
    return text


def class_label(value: object, labels: Sequence[str], where: str) -> str:
    """Map a raw label (string, or int index into ``labels``) to its label string, or raise. A label is matched by
    value (`normal_label`: 1.0 and "1" are "1"; "true" / "false" are "1" / "0" for labels 0 / 1)."""
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        if 0 <= value < len(labels):
            return labels[value]
    else:
        s = str(value).strip()
        if s in labels:
            return s
        s = normal_label(value)
        if s in labels:
            return s
        if s.lower() in BOOLEANS and BOOLEANS[s.lower()] in labels and {"0", "1"} <= set(labels):
            return BOOLEANS[s.lower()]
    raise BertforgeError(f"{where}: unknown label {value!r} (expected one of {', '.join(labels)})")


def float_label(value: object, where: str) -> float:
    try:
        score = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise BertforgeError(f"{where}: expected a number for the score, found {value!r}") from None
    if not math.isfinite(score):  # would train to a NaN loss, or report "spearman": NaN as a result
        raise BertforgeError(f"{where}: the score {value!r} is not a finite number")
    return score
