"""A family's config.json schema (`Family.schema`): the dict both ways, the fields it keeps, and what each of its
fields must be (`checks`), so a family's schema is one place: its file. `config.checks.check_fields` runs every
family's checks on a raw config.json before the family reads it (a name means the same in every schema that has it,
so the checks merge into one table): "layer_norm_eps": "abc", a dropout of 7 or a pad_token_id past the
vocabulary is one line naming the file and the field, not a traceback from deep inside torch.

The upper bounds lie far beyond every published model (the largest vocabularies hold about 256k entries, the widest
models are 25k wide, the deepest have a few hundred layers) and stop an absurd value before it allocates memory:
`type_vocab_size` 1e9 at width 128 asks for 512 GB.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from bertforge.errors import BertforgeError


@dataclass(frozen=True)
class Field:
    """What a config.json field must be."""

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

LAYERS = Field("int", 1, MAX_LAYERS, nullable=False)
SOME_LAYERS = Field("int", 1, MAX_LAYERS)
HEADS = Field("int", 1, MAX_HEADS, nullable=False)
WIDTH = Field("int", 1, MAX_WIDTH, nullable=False)
SOME_WIDTH = Field("int", 1, MAX_WIDTH)
FFN = Field("int", 1, MAX_FFN, nullable=False)
RATE = Field("number", 0, 1)
EPS = Field("number", 0, 1, nullable=False, open_low=True)
INIT = Field("number", 0, 10)
THETA = Field("number", 0, 1e12, open_low=True)
TOKEN = Field("int", 0, MAX_VOCAB)
SWITCH = Field("bool")
TEXT = Field("text")
VOCAB = Field("int", 1, MAX_VOCAB, nullable=False)
POSITIONS = Field("int", 1, MAX_POSITIONS, nullable=False)
# the special-token ids a config.json may hold, in the order they are checked against vocab_size
TOKEN_ID_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id", "unk_token_id",
                   "mask_token_id", "decoder_start_token_id", "forced_bos_token_id", "forced_eos_token_id")


def checks(*groups: tuple[tuple[str, ...], Field], base: dict[str, Field] | None = None) -> dict[str, Field]:
    """A schema's checks from (names, what each must be) groups, added to `base`'s."""
    return {**(base or {}), **{name: spec for names, spec in groups for name in names}}


# BertConfig's fields, which every encoder schema extends, and the fields transformers' PretrainedConfig has in every
# schema (token ids, tie_word_embeddings).
BERT_CHECKS = checks(
    (("num_hidden_layers",), LAYERS), (("num_attention_heads",), HEADS), (("hidden_size",), WIDTH),
    (("embedding_size",), SOME_WIDTH), (("intermediate_size",), FFN), (("vocab_size",), VOCAB),
    (("max_position_embeddings",), POSITIONS), (("type_vocab_size",), Field("int", 0, MAX_TYPE_VOCAB)),
    (("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"), RATE),
    (("layer_norm_eps",), EPS), (("initializer_range",), INIT), (TOKEN_ID_FIELDS, TOKEN),
    (("is_decoder", "tie_word_embeddings"), SWITCH), (("model_type", "hidden_act"), TEXT))


def common_fields(cfg: Any) -> dict[str, Any]:
    """The config.json fields every encoder schema shares under the same names."""
    return dict(vocab_size=cfg.vocab_size, initializer_range=cfg.initializer_range, pad_token_id=cfg.pad_token_id,
                max_position_embeddings=cfg.max_position_embeddings)


def bert_write_config(cfg: Any) -> dict[str, Any]:
    """`cfg` (a ModelConfig) in BertConfig's schema, which RoBERTa, ALBERT, ELECTRA, Longformer and BigBird extend."""
    d = dict(model_type=cfg.model_type, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
             num_attention_heads=cfg.num_attention_heads, intermediate_size=cfg.intermediate_size,
             hidden_act=cfg.hidden_act, hidden_dropout_prob=cfg.hidden_dropout_prob,
             attention_probs_dropout_prob=cfg.attention_probs_dropout_prob, type_vocab_size=cfg.type_vocab_size,
             layer_norm_eps=cfg.layer_norm_eps, position_embedding_type="absolute", **common_fields(cfg))
    if cfg.family.factorised:
        d["embedding_size"] = cfg.embedding_size
    if cfg.causal:
        d["is_decoder"] = True
    return d


def bert_read_config(fam: Any, d: dict[str, Any], source: str, ours: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig keyword arguments from a BertConfig-schema dict `d` (`fam`: the Family; `ours`: the file's
    "bertforge" block). Raises KeyError for a missing required field (the caller names it)."""
    return dict(model_type=fam.model_type, vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
                num_hidden_layers=d["num_hidden_layers"], num_attention_heads=d["num_attention_heads"],
                intermediate_size=d["intermediate_size"], hidden_act=d.get("hidden_act", "gelu"),
                hidden_dropout_prob=d.get("hidden_dropout_prob", 0.1),
                attention_probs_dropout_prob=d.get("attention_probs_dropout_prob", 0.1),
                max_position_embeddings=d.get("max_position_embeddings", 512),
                type_vocab_size=d.get("type_vocab_size", 2), initializer_range=d.get("initializer_range", 0.02),
                layer_norm_eps=d.get("layer_norm_eps", 1e-12), pad_token_id=d.get("pad_token_id") or 0,
                embedding_size=d.get("embedding_size") if fam.factorised else None,
                share_layers=ours.get("share_layers", "none"), use_pooler=ours.get("use_pooler", fam.use_pooler),
                heads_per_layer=ours.get("heads_per_layer"),
                causal=bool(d.get("is_decoder", False)) and fam.causal_encoder)


def refuse_unsupported(source: str, family: str, d: dict[str, Any], supported: dict[str, Any]) -> None:
    """One line for a config.json switch bertforge does not compute (compared as booleans)."""
    for key, ok in supported.items():
        if key in d and bool(d[key]) != ok:
            raise BertforgeError(f"{source}: {family} with {key}={d[key]} is not supported")


def token_id(d: dict[str, Any], key: str, default: int) -> int:
    """A config.json token id; transformers allows a list of eos ids, bertforge stops at one."""
    value = d.get(key, default)
    if isinstance(value, list):
        if len(value) != 1:
            raise BertforgeError(f"{key} {value}: bertforge generation stops at one token id")
        value = value[0]
    return default if value is None else int(value)


@dataclass(frozen=True)
class ConfigSchema:
    # config.json, both ways: write_config(cfg) -> dict; read_config(family, dict, source, bertforge block) -> the
    # config's keyword arguments (raises KeyError for a missing required field: the caller names it)
    write_config: Callable[[Any], dict[str, Any]] = field(default=bert_write_config, compare=False, repr=False)
    read_config: Callable[[Any, dict[str, Any], str, dict[str, Any]], dict[str, Any]] = field(
        default=bert_read_config, compare=False, repr=False)
    # what each field must be (checked on the raw dict before `read_config`)
    checks: dict[str, Field] = field(default_factory=lambda: dict(BERT_CHECKS), compare=False, repr=False)
    # A strict schema (the encoder-decoders'): its field names (others are refused; empty: not checked) and the
    # values of the fields bertforge computes only one way.
    config_fields: frozenset[str] = frozenset()
    fixed_fields: dict[str, Any] = field(default_factory=dict, compare=False)
    keeps_token_ids: bool = False        # config.json's bos/eos/cls/sep ids are read back into `extra`
    kept_fields: tuple[str, ...] = ()    # config.json fields of its own kept in `extra` and written back (DPR's)
    # config.json fields set from the tokenizer when a model is made for it: field -> tokenizer role
    token_ids_from_tokenizer: dict[str, str] = field(default_factory=dict, compare=False)
    # settings its config.json stores once for both stacks: (a, b) pairs that must be equal (T5Config)
    one_value_for: tuple[tuple[str, str], ...] = ()
    # ModelConfig switches the layout can set per model (ModernBERT's biases and window); the others stay at the
    # family's values
    switches: frozenset[str] = frozenset()
