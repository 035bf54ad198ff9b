"""The families: one file per member of the BERT family, each building its facts as `FAMILY` (a `Family` for
the encoders and the GPT-2 decoder, a `Seq2SeqFamily` for the encoder-decoders; `family.py` says what a row holds).

The package is the registry: every module here that defines `FAMILY` is found and listed, in the order of its
file name, so adding a family is adding its file. `FAMILIES` / `SEQ2SEQ_FAMILIES` map model_type -> row.
"""
from __future__ import annotations

import importlib
import pkgutil

from bertforge.families.family import ACTIVATIONS, Family, Seq2SeqFamily

FAMILIES: dict[str, Family] = {}
SEQ2SEQ_FAMILIES: dict[str, Seq2SeqFamily] = {}
for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    _row = getattr(importlib.import_module(f"{__name__}.{_info.name}"), "FAMILY", None)
    if isinstance(_row, Family):
        FAMILIES[_row.model_type] = _row
    elif isinstance(_row, Seq2SeqFamily):
        SEQ2SEQ_FAMILIES[_row.model_type] = _row
MODEL_TYPES = tuple(FAMILIES)
SEQ2SEQ_TYPES = tuple(SEQ2SEQ_FAMILIES)

__all__ = ["ACTIVATIONS", "FAMILIES", "MODEL_TYPES", "SEQ2SEQ_FAMILIES", "SEQ2SEQ_TYPES", "Family", "Seq2SeqFamily"]
