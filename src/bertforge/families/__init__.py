"""The families: one file per member of the BERT family, each building its facts as `FAMILY` (a `Family`:
`family.py` says what a row holds), for the encoders, the GPT-2 decoder and the encoder-decoders alike.

The package is the registry: every module here that defines `FAMILY` is found and listed, in the order of its
file name, so adding a family is adding its file. `FAMILIES` maps model_type -> row.
"""
from __future__ import annotations

import importlib
import pkgutil

from bertforge.families.family import (ACTIVATIONS, DECODER, ENCODER, ENCODER_DECODER, Family, TokenizerLayout)

FAMILIES: dict[str, Family] = {}
for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    _row = getattr(importlib.import_module(f"{__name__}.{_info.name}"), "FAMILY", None)
    if isinstance(_row, Family):
        FAMILIES[_row.model_type] = _row
MODEL_TYPES = tuple(FAMILIES)
# The family of a ModelConfig (Seq2SeqConfig) built without one, and the recipe `bertforge pretrain` runs without
# --recipe.
DEFAULT_FAMILY = "bert"
DEFAULT_ENCODER_DECODER = "t5"
DEFAULT_RECIPE = "bert"
# The family whose published shapes are the sizes themselves ("bert-tiny" ... "bert-large", `config.sizes.SIZES`):
# `--size` names a shape by it, and its presets are those names.
SIZES_FAMILY = "bert"
SIZE_PREFIX = f"{SIZES_FAMILY}-"
# Replaced-token detection for an encoder family without a layout of its own trains in ELECTRA's (it names the
# generator's tensors `generator_*`); the objective is named after ELECTRA's paper.
RTD_HOST: Family = FAMILIES["electra"]
from bertforge.families.electra import RTD_OBJECTIVE  # noqa: E402  (after the registry, which imports it first)


def of_stack(*stacks: str) -> dict[str, Family]:
    """The families that build one of `stacks` (ENCODER, DECODER, ENCODER_DECODER), by model_type."""
    return {name: fam for name, fam in FAMILIES.items() if fam.stack in stacks}


__all__ = ["ACTIVATIONS", "DECODER", "DEFAULT_ENCODER_DECODER", "DEFAULT_FAMILY", "DEFAULT_RECIPE", "ENCODER",
           "ENCODER_DECODER", "FAMILIES", "MODEL_TYPES", "RTD_HOST", "RTD_OBJECTIVE", "SIZES_FAMILY", "SIZE_PREFIX",
           "Family", "TokenizerLayout", "of_stack"]
