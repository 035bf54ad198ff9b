"""The encoder-decoders' configuration: one `Seq2SeqConfig` for T5 (Raffel et al. 2020) and BART (Lewis et al. 2020).

`bertforge.model.Seq2SeqLM` is one encoder-decoder; what differs between the two families is a handful of
structural switches, fields of each family (`families/t5.py`, `families/bart.py`) that the model reads:

    Family field          T5                                  BART
    rms_norm              RMSNorm (no mean, no bias)          LayerNorm
    norm_position         pre (x + f(norm(x)); a final norm)  post (norm(x + f(x)))
    relative_positions    bucketed relative bias, computed    learned absolute table, offset 2 (position_offset),
                          in layer 0 and shared by the rest   + layernorm_embedding
    bias                  none (no Linear bias)               every Linear
    scaled_attention      none (q k^T, the init absorbs it)   1/sqrt(head_dim)
    rescales_output /     tied, hidden * d_model**-0.5        tied, + final_logits_bias
      final_logits_bias
    decoder_starts_with   pad (0)                             eos (2)
    init                  fan-in (Mesh TensorFlow's)          normal (init_std)

Shapes come from the one size table (`config.sizes.SIZES`): `compose_seq2seq("t5", "tiny")` has tiny's
layers (in the encoder and in the decoder), width, heads and FFN width; `seq2seq_preset("t5-small")` and
`seq2seq_preset("bart-base")` are the published shapes. `to_hf_dict` / `from_hf_dict` translate to and from
transformers' `T5Config` / `BartConfig`; a field bertforge does not know, or a value it cannot compute, is refused
with one line naming the field.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from bertforge.config.hf import HFConfig, layer_counts
from bertforge.config.sizes import SIZES
from bertforge.families import ACTIVATIONS, DEFAULT_ENCODER_DECODER, ENCODER_DECODER, of_stack
from bertforge.families.family import PLAIN_MLP
from bertforge.errors import BertforgeError

_FAMILIES = of_stack(ENCODER_DECODER)


@dataclass
class Seq2SeqConfig(HFConfig):
    stacks: ClassVar[tuple[str, ...]] = (ENCODER_DECODER,)
    kept_fields: ClassVar[tuple[str, ...]] = ("id2label", "label2id", "problem_type", "task_specific_params",
                                              "bertforge", "bertforge_task")
    what: ClassVar[str] = "an encoder-decoder"

    model_type: str = DEFAULT_ENCODER_DECODER
    vocab_size: int = 32128
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    d_kv: int | None = None                # per-head width; None: d_model // heads (T5 may differ, BART may not)
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    activation: str = "relu"               # T5: feed_forward_proj's activation; BART: activation_function
    gated_ffn: bool = False                # T5 v1.1 "gated-gelu": act(x wi_0) * (x wi_1)
    dropout: float = 0.1
    attention_dropout: float = 0.1         # T5 has one rate (dropout_rate) for all three
    activation_dropout: float = 0.1
    layer_norm_eps: float = 1e-6
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    max_position_embeddings: int = 512     # BART: the position table; T5: the longest prompt read (n_positions)
    scale_embedding: bool = False          # BART: token embeddings * sqrt(d_model)
    scale_decoder_outputs: bool = True     # T5: hidden * d_model**-0.5 before the tied output (v1.1: False)
    initializer_range: float = 0.02        # BART's init_std
    initializer_factor: float = 1.0        # T5's init scale (1.0 = the paper's)
    pad_token_id: int = 0
    eos_token_id: int = 1
    bos_token_id: int | None = None
    decoder_start_token_id: int = 0
    forced_bos_token_id: int | None = None  # BART generation: the first / last token forced (HF's processors)
    forced_eos_token_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.model_type not in _FAMILIES:
            raise BertforgeError(f"unknown encoder-decoder model_type {self.model_type!r} "
                                 f"(expected one of {', '.join(_FAMILIES)})")
        if self.activation.lower() not in ACTIVATIONS:
            raise BertforgeError(f"unsupported activation {self.activation!r} "
                                 f"(expected one of {', '.join(ACTIVATIONS)})")
        for side in ("encoder", "decoder"):
            heads = getattr(self, f"{side}_attention_heads")
            if self.d_kv is None and self.d_model % heads:
                raise BertforgeError(f"d_model {self.d_model} is not a multiple of {side}_attention_heads {heads}")
            if getattr(self, f"{side}_layers") < 1:
                raise BertforgeError(f"{side}_layers must be at least 1")
        fam = self.family
        if self.d_kv is None or not fam.own_head_width:  # d_model // heads, per stack (head_dim_for)
            self.d_kv = self.d_model // self.encoder_attention_heads
        for a, b in fam.one_value_for:  # settings the family's config.json stores once: no checkpoint has two
            if getattr(self, a) != getattr(self, b):
                raise BertforgeError(f"a {self.model_type} model has one {a} and {b} ({getattr(self, a)} != "
                                     f"{getattr(self, b)}): its config.json cannot store two")
        if self.gated_ffn and fam.mlp == PLAIN_MLP:
            raise BertforgeError(f"a {self.model_type} model cannot have gated_ffn=True (its config.json has no "
                                 "gated FFN)")

    @property
    def is_encoder_decoder(self) -> bool:
        return True

    def head_dim_for(self, n_heads: int) -> int:
        """The per-head width of a stack with n_heads heads: d_kv where the family has a width of its own (T5),
        else d_model // n_heads (BART)."""
        return int(self.d_kv) if self.family.own_head_width else self.d_model // n_heads

    @property
    def hidden_size(self) -> int:
        return self.d_model

    def replace(self, **changes: Any) -> "Seq2SeqConfig":
        return dataclasses.replace(self, **changes)

    # ---- Hugging Face config.json ------------------------------------------------------------------------------
    def to_hf_dict(self, architectures: list[str] | None = None) -> dict[str, Any]:
        d = self.family.write_config(self)
        d.update(pad_token_id=self.pad_token_id, eos_token_id=self.eos_token_id,
                 decoder_start_token_id=self.decoder_start_token_id)
        d.update(architectures=architectures or [self.family.base_architecture], is_encoder_decoder=True,
                 tie_word_embeddings=True)
        d.update(self.extra)
        return d

    # ---- the check against the weights (config.hf.check_against_weights) ----------------------------------------
    def positive_fields(self) -> tuple[str, ...]:
        return (*self.size_fields(), "encoder_layers", "decoder_layers", "encoder_attention_heads",
                "decoder_attention_heads")

    def size_fields(self) -> tuple[str, ...]:
        sizes = ("vocab_size", "d_model", "encoder_ffn_dim", "decoder_ffn_dim")
        # a learned position table's length (BART's); relative positions have none
        return sizes if self.family.relative_positions else (*sizes, "max_position_embeddings")

    def check_shapes(self, shapes: dict[str, tuple[int, ...]], refuse: Callable[[str, str], None]) -> None:
        for stack, count in layer_counts(shapes, _STACK_LAYER).items():
            if count != getattr(self, f"{stack}_layers"):
                refuse(f"{stack}_layers", f"{count} {stack} layers")


_STACK_LAYER = re.compile(r"(?:^|\.)(encoder|decoder)\.(?:block|layers)\.(\d+)\.")


# ---- composing from the shared sizes -----------------------------------------------------------------------------
# name -> (family, size, overrides): each family's published shapes (its file's `presets`)
SEQ2SEQ_PRESETS: dict[str, tuple[str, str, dict[str, Any]]] = {
    name: (fam.model_type, size, overrides) for fam in _FAMILIES.values()
    for name, (size, overrides) in fam.presets.items()}


def compose_seq2seq(family: str, size: str, **overrides: Any) -> Seq2SeqConfig:
    """Family x size (+ overrides): the size's layers in both stacks, its width, heads and FFN width."""
    if family not in _FAMILIES:
        raise BertforgeError(f"unknown encoder-decoder family {family!r} (choose from {', '.join(_FAMILIES)})")
    if size not in SIZES:
        raise BertforgeError(f"unknown model size {size!r} (choose from {', '.join(SIZES)})")
    s = SIZES[size]
    shape = dict(d_model=s.hidden, encoder_layers=s.layers, decoder_layers=s.layers, encoder_attention_heads=s.heads,
                 decoder_attention_heads=s.heads, encoder_ffn_dim=s.intermediate, decoder_ffn_dim=s.intermediate)
    return Seq2SeqConfig(**{**_FAMILIES[family].seq2seq_settings(), **shape, **overrides})


def seq2seq_preset(name: str, **overrides: Any) -> Seq2SeqConfig:
    """A named shape: t5-small, t5-base, t5-large, t5-v1_1-base, bart-base, bart-large (+ overrides); or
    "FAMILY-SIZE" with any shared size (t5-tiny, bart-mini, ...)."""
    if name in SEQ2SEQ_PRESETS:
        family, size, fixed = SEQ2SEQ_PRESETS[name]
        return compose_seq2seq(family, size, **{**fixed, **overrides})
    family, _, size = name.partition("-")
    if family in _FAMILIES and size in SIZES:
        return compose_seq2seq(family, size, **overrides)
    raise BertforgeError(f"unknown encoder-decoder preset {name!r} (choose from {', '.join(SEQ2SEQ_PRESETS)}, "
                         f"or FAMILY-SIZE with FAMILY one of {', '.join(_FAMILIES)} and SIZE one of "
                         f"{', '.join(SIZES)})")
