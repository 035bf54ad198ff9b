"""What one member of the BERT family fixes, as data: `Family` (the encoders and the GPT-2 decoder) and
`Seq2SeqFamily` (the encoder-decoders). Each family file in this package builds one of them as `FAMILY`.

A family row holds four kinds of fact:
  - its Hugging Face class names (`hf_prefix`) and the encoder's name inside checkpoints with heads;
  - the `ModelConfig` settings it fixes (vocabulary, special ids, activation, dropout, the structural switches);
  - its `config.json` schema, both ways (`write_config`: a config -> the dict; `read_config`: the dict -> the
    `ModelConfig` keyword arguments);
  - its tensor names (`weight_rules`: regex rules from bertforge's canonical BERT names to the family's), plus the
    tensors it stores fused (`fused_weights`) or transposed (`transposed_weights`).

This module imports nothing of bertforge but its errors, so every layer may read the families.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from bertforge.errors import BertforgeError

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "silu", "swish")
# The canonical name of an encoder layer (`bert.encoder.layer.N.`), the start of most weight rules.
LAYER = r"bert\.encoder\.layer\.(\d+)\."
# config.json special-token ids no ModelConfig field holds (kept in `extra` for the families that write them).
TOKEN_IDS = ("bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id")

Rules = tuple[tuple[str, str], ...]


def common_fields(cfg: Any) -> dict[str, Any]:
    """The config.json fields every encoder schema shares under the same names."""
    return dict(vocab_size=cfg.vocab_size, initializer_range=cfg.initializer_range, pad_token_id=cfg.pad_token_id,
                max_position_embeddings=cfg.max_position_embeddings)


def bert_config_json(cfg: Any) -> dict[str, Any]:
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


def bert_settings(fam: "Family", d: dict[str, Any], source: str, ours: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig keyword arguments from a BertConfig-schema dict `d` (`ours`: the file's "bertforge" block).
    Raises KeyError for a missing required field (the caller names it)."""
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


@dataclass(frozen=True)
class TokenizerLayout:
    """A family's SentencePiece (Unigram) tokenizer as transformers' own tokenizer class rebuilds it on load: the
    special tokens, their ids (`first` at ids 0, 1, ..., then the pieces, then `last`), how a pair is joined and the
    normaliser / pre-tokenizer / decoder (`pipeline(backend, lowercase)`). Saved under `tokenizer_class`, so
    transformers' AutoTokenizer picks the same class and encodes alike."""

    tokenizer_class: str                 # tokenizer_config.json's class, e.g. "XLMRobertaTokenizer"
    roles: dict[str, str]                # pad / unk / cls / sep / mask -> token
    first: tuple[str, ...]               # the special tokens at ids 0, 1, ... in this order
    last: tuple[str, ...]                # the special tokens after the pieces (the mask token)
    pair: str                            # "segments": CLS A SEP B SEP, types 0 / 1; "double_separator": CLS A SEP
                                         # SEP B SEP, all type 0
    pipeline: Callable[[Any, bool], None] = field(compare=False, repr=False)
    cased: bool = False                  # the class never lower-cases (no do_lower_case to save)


@dataclass(frozen=True)
class Family:
    """What one member of the BERT family fixes: its Hugging Face names, its ModelConfig settings, its config.json
    schema and its tensor names."""

    model_type: str
    hf_prefix: str       # HF class names: f"{hf_prefix}Model", f"{hf_prefix}ForMaskedLM", ...
    weight_prefix: str   # the encoder's name inside HF checkpoints with a head: "bert.", "roberta.", ...
    # config.json, both ways: write_config(cfg) -> dict; read_config(family, dict, source, bertforge block) -> kwargs
    write_config: Callable[[Any], dict[str, Any]] = field(default=bert_config_json, compare=False, repr=False)
    read_config: Callable[["Family", dict[str, Any], str, dict[str, Any]], dict[str, Any]] = field(
        default=bert_settings, compare=False, repr=False)
    # Tensor names: (canonical pattern, family replacement), the first match wins; no match keeps the canonical name.
    weight_rules: Rules = ()
    # Canonical tensors stored as slices of one fused tensor: (pattern, group naming the part, the parts in order).
    fused_weights: tuple[str, int, tuple[str, ...]] | None = None
    transposed_weights: str | None = None  # a pattern of weights stored [in, out] (GPT-2's Conv1D)
    presets: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict, compare=False)  # name -> size, overrides
    # ModelConfig settings (the defaults are BERT's, as in Hugging Face's BertConfig)
    vocab_size: int = 30522
    type_vocab_size: int = 2
    pad_token_id: int = 0
    max_position_embeddings: int = 512
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    dropout: float = 0.1                 # hidden and attention-probability dropout
    embedding_size: int | None = None    # None: the hidden size (no factorisation)
    share_layers: str = "none"
    use_pooler: bool = True
    # structure
    factorised: bool = False             # may have embedding_size != hidden_size (a projection E -> H)
    positions_after_padding: bool = False  # position ids start at pad_token_id + 1 (RoBERTa)
    relative_positions: bool = False       # no position table and no length limit (XLNet)
    decoder: bool = False                # a left-to-right decoder (model.decoder), not an encoder
    causal_encoder: bool = False         # transformers' is_decoder=True on this encoder: a causal mask
    shared_layers_as_one: bool = False   # all-shared layers are stored once, as layer 0 (ALBERT's one group)
    keeps_token_ids: bool = False        # config.json's bos/eos/cls/sep ids are read back into `extra`
    # the modern switches (BERT's values; see config/model.py)
    norm_position: str = "post"
    position_embedding_type: str = "absolute"
    gated_mlp: bool = False
    bias: bool = True                    # attention, MLP, norm and MLM-transform biases
    bias_switches: bool = False          # the checkpoint layout can say each bias and the window (ModernBERT)
    local_attention: int | None = None
    global_attn_every_n_layers: int = 1
    rope_theta: float = 10000.0          # global layers
    local_rope_theta: float = 10000.0    # sliding-window layers
    initializer_cutoff_factor: float | None = None  # truncated-normal init at +-factor std
    # Sparse long attention (`bertforge.model.sparse`): "longformer" (sliding window + global tokens) or "big_bird"
    # (block-sparse window + global + random blocks); None: full attention.
    sparse: str | None = None
    # What transformers' classes of the family put on the encoder, and how its inputs look:
    lm_head_activation: str | None = None  # the MLM transform's activation (None: hidden_act)
    # sequence classification and multiple choice: "pooler" (the encoder's pooler, then a linear layer),
    # "first_token_mlp" (dense-tanh-out_proj on the first token, no pooler: RobertaClassificationHead) or
    # "own_pooler" (a pooler the head always has, pretrained or not, stored beside the encoder: ContextPooler)
    classifier_head: str = "pooler"
    pooler_activation: str = "tanh"
    one_segment: bool = False            # pair inputs share one token type; the separator alone marks the boundary
    # Names another layout of the family's files gives the same tensors (read, never written).
    alternative_weight_rules: Rules = ()
    tokenizer: TokenizerLayout | None = None  # the family's own SentencePiece layout (None: the kind's)
    # A gated MLP has two input matrices: 2/3 of the size's intermediate width keeps the parameter count and the
    # FLOPs of the ungated MLP (Shazeer 2020), so a size means the same compute in every family.
    intermediate_scale: float = 1.0

    @property
    def base_architecture(self) -> str:
        """The `architectures` entry of a bare encoder's config.json, e.g. "BertModel"."""
        return f"{self.hf_prefix}Model"

    def settings(self) -> dict[str, Any]:
        """The ModelConfig keyword arguments this family fixes (a size supplies the shape)."""
        return dict(model_type=self.model_type, vocab_size=self.vocab_size, type_vocab_size=self.type_vocab_size,
                    pad_token_id=self.pad_token_id, max_position_embeddings=self.max_position_embeddings,
                    layer_norm_eps=self.layer_norm_eps, hidden_act=self.hidden_act,
                    hidden_dropout_prob=self.dropout, attention_probs_dropout_prob=self.dropout,
                    embedding_size=self.embedding_size, share_layers=self.share_layers, use_pooler=self.use_pooler,
                    norm_position=self.norm_position, position_embedding_type=self.position_embedding_type,
                    gated_mlp=self.gated_mlp, attention_bias=self.bias, mlp_bias=self.bias, norm_bias=self.bias,
                    head_bias=self.bias, local_attention=self.local_attention,
                    global_attn_every_n_layers=self.global_attn_every_n_layers, rope_theta=self.rope_theta,
                    local_rope_theta=self.local_rope_theta, initializer_cutoff_factor=self.initializer_cutoff_factor)

    def intermediate(self, size_intermediate: int) -> int:
        """The MLP width this family uses for a size (gated MLPs: scaled, rounded to a multiple of 64)."""
        if self.intermediate_scale == 1.0:
            return size_intermediate
        return max(64, int(round(size_intermediate * self.intermediate_scale / 64)) * 64)

    def config_json(self, cfg: Any) -> dict[str, Any]:
        """`cfg` in this family's config.json schema (without the fields every family adds)."""
        return self.write_config(cfg)

    def config_settings(self, d: dict[str, Any], source: str, ours: dict[str, Any]) -> dict[str, Any]:
        """ModelConfig keyword arguments from this family's config.json dict (`ours`: its "bertforge" block)."""
        return self.read_config(self, d, source, ours)


@dataclass(frozen=True)
class Seq2SeqFamily:
    """What one encoder-decoder fixes: its structure switches (read by `bertforge.model.Seq2SeqLM` as
    `Seq2SeqConfig` properties), its defaults, its config.json schema and its tensor names."""

    model_type: str
    architecture: str                # the config.json `architectures` entry (the HF class with the LM head)
    # structure (see config/seq2seq.py)
    norm: str                        # "rms" | "layer"
    norm_position: str               # "pre" | "post"
    positions: str                   # "relative" | "learned"
    bias: bool
    attention_scale: bool            # scores divided by sqrt(head_dim)
    position_offset: int = 0         # BART's learned table starts 2 rows in (fairseq's padding_idx + 1)
    # defaults (transformers' T5Config / BartConfig)
    vocab_size: int = 32128
    pad_token_id: int = 0
    eos_token_id: int = 1
    bos_token_id: int | None = None
    decoder_start_token_id: int = 0
    forced_eos: bool = False         # generation ends on a forced eos (BART's forced_eos_token_id)
    activation: str = "relu"
    layer_norm_eps: float = 1e-6
    dropout: float = 0.1
    sublayer_dropout: float | None = None  # attention and activation dropout (None: `dropout`)
    max_position_embeddings: int = 512
    # config.json: write_config(cfg) -> dict; read_config(config class, dict, extra) -> a config. `config_fields`
    # are the schema's own field names; `fixed_fields` values bertforge cannot compute otherwise.
    write_config: Callable[[Any], dict[str, Any]] | None = field(default=None, compare=False, repr=False)
    read_config: Callable[[Any, dict[str, Any], dict[str, Any]], Any] | None = field(
        default=None, compare=False, repr=False)
    config_fields: frozenset[str] = frozenset()
    fixed_fields: dict[str, Any] = field(default_factory=dict, compare=False)
    # Tensor names: (pattern, replacement) rules from bertforge's names to transformers'; `first_rule_only`: stop
    # at the first rule that matches (T5), else apply every rule in turn (BART).
    weight_rules: Rules = ()
    first_rule_only: bool = True
    presets: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict, compare=False)  # name -> size, overrides

    @property
    def rms_norm(self) -> bool:
        return self.norm == "rms"

    @property
    def pre_norm(self) -> bool:
        return self.norm_position == "pre"

    @property
    def relative_positions(self) -> bool:
        return self.positions == "relative"


def token_id(d: dict[str, Any], key: str, default: int) -> int:
    """A config.json token id; transformers allows a list of eos ids, bertforge stops at one."""
    value = d.get(key, default)
    if isinstance(value, list):
        if len(value) != 1:
            raise BertforgeError(f"{key} {value}: bertforge generation stops at one token id")
        value = value[0]
    return default if value is None else int(value)
