"""Model configuration: one dataclass for every member of the family, one table of families, one of sizes.

BERT, RoBERTa, ALBERT, DistilBERT and ELECTRA are the same encoder with different switches:
  - `embedding_size` != hidden_size  -> factorised embeddings projected to H (ALBERT, ELECTRA)
  - `share_layers`                   -> cross-layer parameter sharing (ALBERT)
  - `type_vocab_size` = 0            -> no token-type embeddings (DistilBERT)
  - `use_pooler` = False             -> no [CLS] pooler (DistilBERT, ELECTRA)
  - `Family.positions_after_padding` -> position ids counted from padding_idx + 1 (RoBERTa)
XLNet is a family of its own structure (relative positions, two-stream attention: `bertforge.model.xlnet`) whose
shape fields are the same (hidden_size = d_model, intermediate_size = d_inner, ...); its config.json is XLNet's.
GPT-2 is the one decoder (`bertforge.model.decoder`; `stack` is families.DECODER): the same fields describe its shape.
ModernBERT (Warner et al. 2024) is the same encoder with its switches turned the other way:
  - `norm_position` = "pre"          -> LN before each sub-block, a final LN (the first layer's input is the
                                        embedding LN's output, so it has no attention LN of its own)
  - `position_embedding_type` = "rotary" -> RoPE on queries and keys instead of a learned position table
  - `gated_mlp`                      -> GeGLU: act(x W_a) * (x W_g), both halves in one `intermediate.dense`
  - `attention_bias` / `mlp_bias` / `norm_bias` / `head_bias` = False -> no biases (the decoder keeps one)
  - `local_attention` = W, `global_attn_every_n_layers` = N -> every Nth layer (from 0) attends globally, the
                                        others within |i - j| <= W // 2 (Hugging Face's convention)
Longformer and BigBird are the same encoder with sparse long attention (`Family.sparse_attention`; fields in
`config.long`):
  - `attention_window`                -> Longformer: a window per layer + global tokens of the caller's choice
  - `attention_type`, `block_size`, `num_random_blocks` -> BigBird: block-sparse window + global + random blocks
Everything a family fixes lives in its file in `bertforge.families` (`FAMILIES`); shapes live in `config.sizes.SIZES`;
a config is size x family (+ overrides): `compose("albert", "base")`, or a named preset such as
`preset("albert-base")`. `to_hf_dict` / `from_hf_dict` translate to and from the family's Hugging Face `config.json`
schema, which the family's file holds (reading the file and checking it against the weights: `config.hf`).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from bertforge.config import long as config_long
from bertforge.config.hf import HFConfig, layer_counts
from bertforge.config.sizes import SIZES
from bertforge.errors import BertforgeError
from bertforge.families import (ACTIVATIONS, DECODER, DEFAULT_FAMILY, ENCODER, FAMILIES, SIZE_PREFIX, SIZES_FAMILY,
                                of_stack)
from bertforge.families.big_bird import BLOCK as BIGBIRD_BLOCK
from bertforge.families.big_bird import RANDOM_BLOCKS as BIGBIRD_RANDOM
from bertforge.families.family import GATED_MLP, TOKEN_IDS
from bertforge.families.modernbert import layer_types

SHARE_MODES = ("none", "all", "attention", "ffn")
NORM_POSITIONS = ("post", "pre")
POSITION_TYPES = ("absolute", "rotary", "disentangled")
RELATIVE_TERMS = ("c2p", "p2c")
# the families whose HF encoder takes is_decoder=True (a causal mask)
CAUSAL_ENCODERS = tuple(name for name, fam in FAMILIES.items() if fam.causal_encoder)

_DEFAULT = FAMILIES[DEFAULT_FAMILY]


@dataclass
class ModelConfig(HFConfig):
    stacks: ClassVar[tuple[str, ...]] = (ENCODER, DECODER)
    kept_fields: ClassVar[tuple[str, ...]] = ("id2label", "label2id", "problem_type", "num_labels",
                                              "classifier_dropout", "bertforge_task")
    what: ClassVar[str] = "an encoder or decoder"

    model_type: str = DEFAULT_FAMILY
    vocab_size: int = _DEFAULT.vocab_size
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = _DEFAULT.hidden_act
    hidden_dropout_prob: float = _DEFAULT.dropout
    attention_probs_dropout_prob: float = _DEFAULT.dropout
    max_position_embeddings: int = _DEFAULT.max_position_embeddings
    type_vocab_size: int = _DEFAULT.type_vocab_size
    initializer_range: float = 0.02
    layer_norm_eps: float = _DEFAULT.layer_norm_eps
    pad_token_id: int = _DEFAULT.pad_token_id
    embedding_size: int | None = None  # None -> hidden_size (no factorisation)
    share_layers: str = "none"
    use_pooler: bool = True
    norm_position: str = _DEFAULT.norm_position
    position_embedding_type: str = _DEFAULT.position_embedding_type
    gated_mlp: bool = _DEFAULT.mlp == GATED_MLP
    attention_bias: bool = _DEFAULT.bias
    mlp_bias: bool = _DEFAULT.bias
    norm_bias: bool = _DEFAULT.bias
    head_bias: bool = _DEFAULT.bias      # the MLM transform's dense layer (HF ModernBERT: classifier_bias)
    decoder_bias: bool = True            # the MLM vocabulary bias
    local_attention: int | None = _DEFAULT.local_attention
    global_attn_every_n_layers: int = _DEFAULT.global_attn_every_n_layers
    rope_theta: float = _DEFAULT.rope_theta
    local_rope_theta: float = _DEFAULT.local_rope_theta
    initializer_cutoff_factor: float | None = _DEFAULT.initializer_cutoff_factor
    # Heads left in each layer after pruning (None: num_attention_heads everywhere); bertforge layout only.
    heads_per_layer: list[int] | None = None
    # XLNet: relative distances beyond clamp_len share one encoding (-1: none); mems kept per layer (None: all).
    clamp_len: int = -1
    mem_len: int | None = None
    # Decoders (gpt2): the ids generation starts from and stops at (GPT-2: both <|endoftext|>).
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    # Left-to-right attention in an encoder: the BERT paper's "LTR & No NSP" arm (Devlin et al. 2019, sec. 5.1).
    # Hugging Face's `is_decoder` on a BERT / RoBERTa / ELECTRA config: the same causal mask.
    causal: bool = False
    # Sparse long attention (`config.long`): Longformer's window per layer (an int: every layer); BigBird's
    # "block_sparse" | "original_full", block size and random blocks per query block. None: the family's default.
    attention_window: list[int] | int | None = None
    attention_type: str | None = None
    block_size: int = BIGBIRD_BLOCK
    num_random_blocks: int = BIGBIRD_RANDOM
    # Disentangled relative attention (position_embedding_type "disentangled": `model.relative_position`). The
    # defaults are DeBERTa-v3's; transformers' names: position_buckets, max_relative_positions, pos_att_type,
    # share_att_key, norm_rel_ebd.
    position_buckets: int = 256               # log buckets of relative distance (<= 0: the distance itself)
    max_relative_positions: int = -1          # the longest distance told apart (<= 0: max_position_embeddings)
    relative_attention_terms: tuple[str, ...] = RELATIVE_TERMS  # content->position, position->content
    share_relative_projections: bool = True   # position keys / queries through the content key / query projections
    norm_relative_embeddings: bool = True     # a LayerNorm on the shared relative table
    # Task metadata carried through config.json (id2label etc.); not used by the encoder itself.
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.model_type not in self.families():
            raise BertforgeError(f"unknown model_type {self.model_type!r} (expected one of "
                                 f"{', '.join(self.families())})")
        if self.share_layers not in SHARE_MODES:
            raise BertforgeError(f"unknown share_layers {self.share_layers!r} (expected one of {', '.join(SHARE_MODES)})")
        if self.hidden_size % self.num_attention_heads:
            raise BertforgeError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {self.num_attention_heads}")
        if self.hidden_act.lower() not in ACTIVATIONS:
            raise BertforgeError(f"unsupported hidden_act {self.hidden_act!r} (expected one of {', '.join(ACTIVATIONS)})")
        if self.embedding_size is None:
            self.embedding_size = self.hidden_size
        if self.heads_per_layer is not None and (
                len(self.heads_per_layer) != self.num_hidden_layers
                or not all(1 <= n <= self.num_attention_heads for n in self.heads_per_layer)):
            raise BertforgeError(f"heads_per_layer {self.heads_per_layer} needs {self.num_hidden_layers} counts "
                                 f"between 1 and {self.num_attention_heads}")
        if not self.family.factorised and self.embedding_size != self.hidden_size:
            raise BertforgeError(f"{self.model_type} cannot have embedding_size != hidden_size; use "
                                 f"{' or '.join(n for n, f in FAMILIES.items() if f.factorised)}")
        if self.norm_position not in NORM_POSITIONS:
            raise BertforgeError(f"unknown norm_position {self.norm_position!r} (expected {', '.join(NORM_POSITIONS)})")
        if self.position_embedding_type not in POSITION_TYPES:
            raise BertforgeError(f"unknown position_embedding_type {self.position_embedding_type!r} "
                                 f"(expected {', '.join(POSITION_TYPES)})")
        if self.position_embedding_type == "rotary" and self.head_dim % 2:
            raise BertforgeError(f"rotary positions need an even head size, got {self.head_dim}")
        if self.local_attention is not None and self.local_attention < 2:
            raise BertforgeError(f"local_attention must be >= 2 tokens (or None), got {self.local_attention}")
        if self.global_attn_every_n_layers < 1:
            raise BertforgeError(f"global_attn_every_n_layers must be >= 1, got {self.global_attn_every_n_layers}")
        if self.norm_position == "pre" and self.share_layers != "none":
            raise BertforgeError("cross-layer sharing is for post-norm encoders; use share_layers='none'")
        if self.causal and self.model_type not in CAUSAL_ENCODERS:
            raise BertforgeError(f"causal (left-to-right) attention is for {', '.join(CAUSAL_ENCODERS)} encoders "
                                 f"(transformers' is_decoder), not {self.model_type}")
        config_long.normalise(self)
        self.relative_attention_terms = tuple(self.relative_attention_terms)
        if not set(self.relative_attention_terms) <= set(RELATIVE_TERMS):
            raise BertforgeError(f"unknown relative attention terms {list(self.relative_attention_terms)} "
                                 f"(expected some of {', '.join(RELATIVE_TERMS)})")
        if self.position_embedding_type == "disentangled" and self.position_buckets > 0:
            reach = self.max_relative_positions if self.max_relative_positions > 0 else self.max_position_embeddings
            if self.position_buckets < 2 or reach <= self.position_buckets // 2 + 1:
                raise BertforgeError(f"position_buckets {self.position_buckets} needs max_relative_positions above "
                                     f"{self.position_buckets // 2 + 1} (got {reach})")
        # Every config must fit its family's Hugging Face layout: the structural switches a family's checkpoint
        # cannot express stay at the family's value (ModernBERT's layout has its bias and window settings).
        fam = self.family
        fixed = {"norm_position": fam.norm_position, "position_embedding_type": fam.position_embedding_type,
                 "gated_mlp": fam.mlp == GATED_MLP}
        switchable = dict(attention_bias=fam.bias, mlp_bias=fam.bias, norm_bias=fam.bias, head_bias=fam.bias,
                          decoder_bias=True, local_attention=fam.local_attention)
        fixed.update({name: value for name, value in switchable.items() if name not in fam.switches})
        for name, value in fixed.items():
            if getattr(self, name) != value:
                raise BertforgeError(f"a {self.model_type} model cannot have {name}={getattr(self, name)!r} (its "
                                     f"checkpoint layout has {value!r}); the modern switches are model_type "
                                     f"{' or '.join(repr(n) for n, f in FAMILIES.items() if f.switches)}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def layer_types(self) -> list[str]:
        """Per layer "full_attention" or "sliding_attention" (see `families.modernbert.layer_types`)."""
        return layer_types(self.num_hidden_layers, self.global_attn_every_n_layers, self.local_attention)

    @property
    def learned_positions(self) -> bool:
        """A learned table of absolute positions, so inputs are at most max_position_embeddings - offset long."""
        return self.position_embedding_type == "absolute" and not self.family.relative_positions

    @property
    def position_offset(self) -> int:
        """RoBERTa counts positions from padding_idx + 1 (so position 0..padding_idx are never used by tokens)."""
        return self.pad_token_id + 1 if self.family.positions_after_padding else 0

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    # ---- Hugging Face config.json: each family's schema lives in its file in bertforge.families -------------
    def to_hf_dict(self, architectures: list[str] | None = None) -> dict[str, Any]:
        d = self.family.write_config(self)
        if self.stack == ENCODER:  # bertforge's own switches ride along in an encoder's config.json
            d["tie_word_embeddings"] = True
            d["bertforge"] = {"share_layers": self.share_layers, "use_pooler": self.use_pooler}
            if self.heads_per_layer is not None:
                d["bertforge"]["heads_per_layer"] = list(self.heads_per_layer)
        if architectures:
            d["architectures"] = architectures
        d.update(self.extra)
        return d

    @classmethod
    def kept(cls, fam, d: dict[str, Any]) -> dict[str, Any]:
        kept = super().kept(fam, d)
        if fam.keeps_token_ids:  # special-token ids no ModelConfig field holds
            kept.update({k: d[k] for k in TOKEN_IDS if d.get(k) is not None})
        return kept

    # ---- the check against the weights (config.hf.check_against_weights) ----------------------------------------
    def positive_fields(self) -> tuple[str, ...]:
        return ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings")

    def size_fields(self) -> tuple[str, ...]:
        return ("hidden_size", "intermediate_size")

    def check_shapes(self, shapes: dict[str, tuple[int, ...]], refuse: Callable[[str, str], None]) -> None:
        """The word and position tables' shapes, and as many layers as the file holds (fewer would load with the
        rest silently dropped)."""
        factorised = self.family.factorised and self.embedding_size
        width = self.embedding_size if factorised else self.hidden_size
        for name, shape in shapes.items():
            if _WORDS.search(name) and len(shape) == 2:
                if shape[0] != self.vocab_size:
                    refuse("vocab_size", f"{shape[0]} word embeddings ({name})")
                if shape[1] != width:
                    refuse("embedding_size" if factorised else "hidden_size", f"width {shape[1]} ({name})")
            if _POSITIONS.search(name) and len(shape) == 2 and shape[0] != self.max_position_embeddings:
                refuse("max_position_embeddings", f"{shape[0]} positions ({name})")
            if _TOKEN_TYPES.search(name) and len(shape) == 2 and shape[0] != self.type_vocab_size:
                refuse("type_vocab_size", f"{shape[0]} token types ({name})")
        counts = layer_counts(shapes, _LAYER_INDEX)
        if self.share_layers == "none" and counts and self.num_hidden_layers not in counts.values():
            prefix, count = max(counts.items(), key=lambda kv: kv[1])
            refuse("num_hidden_layers", f"{count} layers ({prefix}.0 .. {prefix}.{count - 1})")


# A learned table's name in any family's file: word / position / token-type embeddings, and the index of a layer.
_WORDS = re.compile(r"(^|\.)(word_embeddings?|wte|tok_embeddings)\.weight$")
_POSITIONS = re.compile(r"(^|\.)(position_embeddings|wpe)\.weight$")
_TOKEN_TYPES = re.compile(r"(^|\.)token_type_embeddings\.weight$")
_LAYER_INDEX = re.compile(r"^(.*?(?:^|\.)(?:layer|layers|h))\.(\d+)\.")


# name -> (family, size, overrides): "FAMILY-SIZE" for every size of the families whose presets the sizes are
# (BERT's), then each family's published shapes (its file's `presets`; the ones with overrides are shapes that are
# no BERT size).
_FAMILIES = of_stack(ENCODER, DECODER)
PRESETS: dict[str, tuple[str, str, dict[str, Any]]] = {
    **{f"{SIZE_PREFIX}{size}": (SIZES_FAMILY, size, {}) for size in SIZES},
    **{name: (fam.model_type, size, overrides) for fam in _FAMILIES.values()
       for name, (size, overrides) in fam.presets.items()},
}


def compose(family: str, size: str, **overrides: Any) -> ModelConfig:
    """Size x family (+ overrides): the size's shape with everything the family fixes."""
    if family not in _FAMILIES:
        raise BertforgeError(f"unknown model family {family!r} (choose from {', '.join(_FAMILIES)})")
    if size not in SIZES:
        raise BertforgeError(f"unknown model size {size!r} (choose from {', '.join(SIZES)})")
    return ModelConfig(**{**_FAMILIES[family].settings(), **SIZES[size].settings(_FAMILIES[family]), **overrides})


def preset(name: str, **overrides: Any) -> ModelConfig:
    """A named shape (bert-tiny ... bert-large, roberta-base, albert-*, distilbert-base, electra-*, modernbert-*) with
    overrides."""
    if name not in PRESETS:
        raise BertforgeError(f"unknown model size {name!r} (choose from {', '.join(PRESETS)})")
    family, size, fixed = PRESETS[name]
    return compose(family, size, **{**fixed, **overrides})
