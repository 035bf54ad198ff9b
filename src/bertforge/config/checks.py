"""What a config.json may hold, checked before anything is built: each family's schema says what its fields must be
(`Family.schema.checks`, in its file in `bertforge.families`: a whole number in a range, a number in a range, true or
false, text (or texts)); a name means the same in every schema that has it (a dropout rate is a rate everywhere), so
the families' checks merge into one table, `FIELDS`. `check_fields(d, source)` runs on the raw dict, before the
family reads it: "layer_norm_eps": "abc", a dropout of 7 or a pad_token_id past the vocabulary is one line naming
the file and the field, not a traceback from deep inside torch. Sizes the weights file holds are compared with it as
well (`config.hf.check_against_weights`) before a model is built.
"""
from __future__ import annotations

import math
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.families import FAMILIES
from bertforge.families.record.schema import TOKEN_ID_FIELDS, Field


def _merged() -> dict[str, Field]:
    table: dict[str, Field] = {}
    for fam in FAMILIES.values():
        for name, spec in fam.schema.checks.items():
            if table.setdefault(name, spec) != spec:
                raise BertforgeError(f"family {fam.model_type}: config field {name} is checked as {spec}, another "
                                     f"family's as {table[name]} (a name must mean the same in every schema)")
    return table


FIELDS: dict[str, Field] = _merged()
__all__ = ["FIELDS", "TOKEN_ID_FIELDS", "Field", "check_fields"]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _show(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def _problem(spec: Field, value: Any) -> str | None:
    """Why `value` is not what `spec` allows, or None."""
    if value is None:
        return None if spec.nullable else "must be given (got null)"
    if spec.kind == "bool":
        return None if isinstance(value, bool) or value in (0, 1) else f"must be true or false (got {value!r})"
    if spec.kind == "text":
        return None if isinstance(value, str) else f"must be text (got {value!r})"
    if spec.kind == "texts":
        ok = isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
        return None if ok else f"must be text or a list of texts (got {value!r})"
    if spec.kind == "window" and isinstance(value, list):
        return next((_problem(Field("int", spec.low, spec.high), v) for v in value
                     if _problem(Field("int", spec.low, spec.high), v)), None)
    if spec.kind in ("int", "window") and not _whole(value):
        return f"must be a whole number (got {value!r})"
    if not _number(value):
        return f"must be a number (got {value!r})"
    low, high = spec.low, spec.high
    if (low is not None and (value < low or (spec.open_low and value == low))) or (high is not None and value > high):
        if spec.kind == "int":
            return f"must be in {_show(low)}..{_show(high)} (got {value!r})"
        if spec.open_low:
            return f"must be above {_show(low)} and at most {_show(high)} (got {value!r})"
        return f"must be between {_show(low)} and {_show(high)} (got {value!r})"
    return None


def check_fields(d: Any, source: str) -> None:
    """Every field of a config.json dict `d` the table knows, by type and range, and each special token id
    against `vocab_size`: the first problem is one line naming `source` and the field."""
    if not isinstance(d, dict):
        raise BertforgeError(f"{source}: expected a JSON object (got {type(d).__name__})")
    for name, value in d.items():
        spec = FIELDS.get(name)
        why = _problem(spec, value) if spec is not None else None
        if why:
            raise BertforgeError(f"{source}: {name} {why}")
    vocab = d.get("vocab_size")
    for name in TOKEN_ID_FIELDS:
        value = d.get(name)
        if _whole(value) and _whole(vocab) and value >= vocab:
            raise BertforgeError(f"{source}: {name} is {value}, past the vocabulary (vocab_size {vocab}: ids "
                                 f"0..{vocab - 1})")

