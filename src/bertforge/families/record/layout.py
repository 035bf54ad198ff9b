"""A family's checkpoint layout: how its files name bertforge's canonical tensors (`Family.checkpoint`)."""
from __future__ import annotations

from dataclasses import dataclass

Rules = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class CheckpointLayout:
    # (canonical pattern, family replacement) rules; `first_rule_only`: the first match wins (no match keeps the
    # canonical name), else every rule applies in turn (BART)
    weight_rules: Rules = ()
    first_rule_only: bool = True
    # The names another layout of the family's files gives the same tensors: read, never written (DeBERTa's legacy
    # MLM head, `cls.predictions.*`).
    alternative_weight_rules: Rules = ()
    # Canonical tensors stored as slices of one fused tensor: (pattern, group naming the part, the parts in order).
    fused_weights: tuple[str, int, tuple[str, ...]] | None = None
    transposed_weights: str | None = None  # a pattern of weights stored [in, out] (GPT-2's Conv1D)
    shared_layers_as_one: bool = False   # all-shared layers are stored once, as layer 0 (ALBERT's one group)
    # the modules a bare encoder of this layout holds (how a saved body is told from a wrapper holding it)
    bare_parts: tuple[str, ...] = ("embeddings", "encoder")
    # Checkpoints that wrap another family's network under names of their own (DPR's question and context encoders
    # hold a BertModel): `wraps` is that family (a model read from them trains and saves as it); `architecture` the
    # bare model's class when it is not f"{hf_prefix}Model"; `alternative_architecture` the class whose layout
    # `alternative_weight_rules` is (then written too, when a writer asks for it)
    wraps: str | None = None
    architecture: str | None = None
    alternative_architecture: str | None = None
    # The sentence vector its checkpoints define (`bertforge embed` on a plain folder of the family): the pooling
    # (None: mean pooling) and the config.json field giving the width of a linear map after it, stored as the
    # canonical `PROJECTION` tensors (0 or absent: none; DPR's [CLS] vector and `projection_dim`)
    sentence_pooling: str | None = None
    projection_field: str | None = None
