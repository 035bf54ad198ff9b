"""What a config.json may hold: one table of fields for every family, checked before anything is built.

`FIELDS` names every config.json field a family's schema reads (BERT's names, GPT-2's, XLNet's, DistilBERT's,
ModernBERT's, DeBERTa's, T5's, BART's) with what it must be: a whole number in a range, a number in a range, true or
false, text (or texts). A name means the same in every schema that has it (a dropout rate is a rate everywhere), so one table serves
every family. `check_fields(d, source)` runs on the raw dict, before the family reads it: "layer_norm_eps": "abc",
a dropout of 7 or a pad_token_id past the vocabulary is one line naming the file and the field, not a traceback
from deep inside torch.

The upper bounds lie far beyond every published model (the largest vocabularies hold about 256k entries, the widest
models are 25k wide, the deepest have a few hundred layers) and stop an absurd value before it allocates memory:
`type_vocab_size` 1e9 at width 128 asks for 512 GB. Sizes the weights file holds are compared with it as well
(`config.hf.check_against_weights`) before a model is built.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bertforge.errors import BertforgeError


@dataclass(frozen=True)
class Field:
    kind: str                 # "int" | "number" | "bool" | "text" | "window" (an int, or a list of ints per layer)
    #                           | "texts" (a text, or a list of texts)
    low: float | None = None
    high: float | None = None
    nullable: bool = True     # null is allowed (the family's default applies)
    open_low: bool = False    # the low end itself is excluded (an epsilon of 0)


MAX_LAYERS = 1024
MAX_HEADS = 4096
MAX_WIDTH = 65536
MAX_FFN = 262144
MAX_VOCAB = 1 << 24
MAX_POSITIONS = 1 << 20
MAX_TYPE_VOCAB = 1024

_LAYERS = Field("int", 1, MAX_LAYERS, nullable=False)
_HEADS = Field("int", 1, MAX_HEADS, nullable=False)
_WIDTH = Field("int", 1, MAX_WIDTH, nullable=False)
_FFN = Field("int", 1, MAX_FFN, nullable=False)
_RATE = Field("number", 0, 1)
_EPS = Field("number", 0, 1, nullable=False, open_low=True)
_TOKEN = Field("int", 0, MAX_VOCAB)
_SWITCH = Field("bool")
_TEXT = Field("text")


def _table(*groups: tuple[tuple[str, ...], Field]) -> dict[str, Field]:
    return {name: spec for names, spec in groups for name in names}


FIELDS: dict[str, Field] = _table(
    (("num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers", "decoder_layers"), _LAYERS),
    (("num_decoder_layers", "num_hidden_groups", "inner_group_num"), Field("int", 1, MAX_LAYERS)),
    (("num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads",
      "decoder_attention_heads"), _HEADS),
    (("hidden_size", "n_embd", "d_model", "dim"), _WIDTH),
    (("embedding_size", "d_kv", "d_head", "attention_head_size", "pooler_hidden_size"), Field("int", 1, MAX_WIDTH)),
    (("intermediate_size", "d_ff", "d_inner", "hidden_dim", "encoder_ffn_dim", "decoder_ffn_dim"), _FFN),
    (("n_inner",), Field("int", 1, MAX_FFN)),
    (("vocab_size",), Field("int", 1, MAX_VOCAB, nullable=False)),
    (("max_position_embeddings", "n_positions"), Field("int", 1, MAX_POSITIONS, nullable=False)),
    (("type_vocab_size",), Field("int", 0, MAX_TYPE_VOCAB)),
    (("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout", "activation_dropout",
      "dropout_rate", "resid_pdrop", "embd_pdrop", "attn_pdrop", "mlp_dropout", "embedding_dropout",
      "classifier_dropout", "qa_dropout", "seq_classif_dropout", "summary_first_dropout", "pooler_dropout"), _RATE),
    (("layer_norm_eps", "layer_norm_epsilon", "norm_eps"), _EPS),
    (("initializer_range", "init_std", "initializer_factor"), Field("number", 0, 10)),
    (("initializer_cutoff_factor",), Field("number", 0, 100, open_low=True)),
    (("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id", "unk_token_id",
      "mask_token_id", "decoder_start_token_id", "forced_bos_token_id", "forced_eos_token_id"), _TOKEN),
    (("rope_theta", "global_rope_theta", "local_rope_theta"), Field("number", 0, 1e12, open_low=True)),
    (("local_attention",), Field("int", 2, MAX_POSITIONS)),
    (("global_attn_every_n_layers",), Field("int", 1, MAX_LAYERS)),
    (("clamp_len",), Field("int", -1, MAX_POSITIONS)),
    (("mem_len",), Field("int", 0, MAX_POSITIONS)),
    (("relative_attention_num_buckets",), Field("int", 1, MAX_HEADS)),
    (("relative_attention_max_distance",), Field("int", 1, MAX_POSITIONS)),
    # DeBERTa's disentangled attention: log buckets and the longest distance told apart (<= 0: none / the
    # positions), its terms ("c2p|p2c" or a list), the relative table's norm ("layer_norm" or "none")
    (("position_buckets", "max_relative_positions"), Field("int", -1, MAX_POSITIONS)),
    (("pos_att_type",), Field("texts")),
    (("conv_kernel_size",), Field("int", 0, MAX_POSITIONS)),
    (("attention_window",), Field("window", 2, MAX_POSITIONS)),
    (("block_size",), Field("int", 1, MAX_HEADS)),
    # DPR's towers: the width of the linear map of the [CLS] vector (0: none)
    (("projection_dim",), Field("int", 0, MAX_WIDTH)),
    (("num_random_blocks",), Field("int", 0, 64)),
    (("tie_word_embeddings", "scale_embedding", "scale_decoder_outputs", "is_decoder", "norm_bias", "mlp_bias",
      "attention_bias", "decoder_bias", "classifier_bias", "relative_attention", "position_biased_input",
      "share_att_key", "legacy"), _SWITCH),
    (("model_type", "hidden_act", "activation_function", "hidden_activation", "ff_activation", "feed_forward_proj",
      "classifier_activation", "attention_type", "attn_type", "pooler_hidden_act", "norm_rel_ebd", "conv_act"),
     _TEXT),
)
TOKEN_ID_FIELDS = tuple(name for name, spec in FIELDS.items() if spec is _TOKEN)


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

