"""What one member of the BERT family fixes, as data: `Family`, one type for the encoders, the GPT-2 decoder and the
encoder-decoders (`stack` says which it builds). Each family file in this package builds one as `FAMILY`.

A family row holds every fact that differs between families, named for what it does:
  - what it builds (`stack`) and its Hugging Face class names (`hf_prefix`, `head_classes`);
  - the settings it fixes (vocabulary, special ids, activation, dropout, the structural switches) and its published
    shapes (`presets`);
  - how its heads are laid out (the MLM head's activation, the pooler and its activation, the task heads
    transformers shares) and how it trains replaced-token detection (its layout, the generator's shape);
  - its `config.json` schema, both ways (`write_config`: a config -> the dict; `read_config`: the dict -> the config's
    keyword arguments), and the special-token ids the file records;
  - its tensor names (`weight_rules`: regex rules from bertforge's canonical names to the family's; those of another
    layout it reads, `alternative_weight_rules`), plus the tensors it stores fused (`fused_weights`) or transposed
    (`transposed_weights`);
  - the pretraining recipes that build it (`recipes`: their papers' settings) and, when its tokenizer is a layout of
    its own (GPT-2's, T5's, DeBERTa's, XLM-R's), that layout (`tokenizer`).

This module imports nothing of bertforge but its errors, so every layer may read the families.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from bertforge.errors import BertforgeError

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "silu", "swish")
# What a family builds (`Family.stack`): a bidirectional encoder (model.Encoder, or XLNet's two-stream one), a
# left-to-right decoder (model.DecoderLM, GPT-2's layout) or an encoder-decoder (model.Seq2SeqLM).
ENCODER, DECODER, ENCODER_DECODER = "encoder", "decoder", "encoder-decoder"
STACKS = (ENCODER, DECODER, ENCODER_DECODER)
# Sparse long attention (`Family.sparse_attention`, computed in `bertforge.model.sparse`).
SLIDING_WINDOW = "sliding-window"  # a window per layer plus global tokens of the caller's choice (Longformer)
BLOCK_SPARSE = "block-sparse"      # blocks: a window, the first and last block global, random blocks (BigBird)
# The heads a family's checkpoints may carry (`Family.head_classes` keys): masked LM, masked LM + sentence relation,
# a left-to-right LM on the encoder (BERT's "LTR" arm), replaced-token detection, and the family's own language
# model head (GPT-2's causal LM, XLNet's permutation LM, T5's / BART's conditional generation).
HEADS = ("mlm", "pretraining", "ltr", "rtd", "lm")
# The fine-tuning heads (`bertforge.tasks.models`), and how a sequence classifier reads the encoder
# (`Family.sequence_head`): BERT's pooler + a linear layer, RoBERTa's classification head on the first token, or a
# pooler the head owns (pretrained or not, stored beside the encoder as `pooler.`: DeBERTa's ContextPooler).
TASK_HEADS = ("classify", "regress", "tag", "qa", "choice")
POOLER, FIRST_TOKEN, OWN_POOLER = "pooler", "first-token", "own-pooler"
SEQUENCE_HEADS = (POOLER, FIRST_TOKEN, OWN_POOLER)
# Replaced-token detection's generator (`Family.rtd_generator`): a quarter of the discriminator's width with the same
# embedding size (ELECTRA's; needs factorised embeddings), or the same width and half the layers (DeBERTa-v3's).
NARROW_GENERATOR, SHALLOW_GENERATOR = "narrow", "shallow"
# Initialisation of the encoder-decoders (`Family.init`): every matrix N(0, initializer_range) (BART), or each
# matrix at 1/sqrt(fan-in) times initializer_factor, Mesh TensorFlow's (T5).
NORMAL_INIT, FAN_IN_INIT = "normal", "fan-in"
# The canonical encoder: its attribute in every model with heads, and the first part of its tensor names
# (`bert.encoder.layer.N...`); the family rules translate from these names.
CANONICAL_ENCODER = "bert"
# The canonical name of an encoder layer (`bert.encoder.layer.N.`), the start of most weight rules.
LAYER = r"bert\.encoder\.layer\.(\d+)\."
# The canonical name of a linear map of the sentence vector a family's checkpoints carry (`Family.projection_field`).
PROJECTION = "projection"
# config.json special-token ids no ModelConfig field holds (kept in `extra` for the families that write them).
TOKEN_IDS = ("bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id")

Rules = tuple[tuple[str, str], ...]


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


def bert_read_config(fam: "Family", d: dict[str, Any], source: str, ours: dict[str, Any]) -> dict[str, Any]:
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


def token_id(d: dict[str, Any], key: str, default: int) -> int:
    """A config.json token id; transformers allows a list of eos ids, bertforge stops at one."""
    value = d.get(key, default)
    if isinstance(value, list):
        if len(value) != 1:
            raise BertforgeError(f"{key} {value}: bertforge generation stops at one token id")
        value = value[0]
    return default if value is None else int(value)


@dataclass(frozen=True)
class TokenizerLayout:
    """A tokenizer kind: the `tokenizers` model it trains, its special tokens and how it frames a text. The plain
    kinds (wordpiece, bpe, unigram) are `bertforge.tokenization`'s; a family whose tokenizer is a layout of its own
    (GPT-2's, T5's) declares it as `Family.tokenizer`, and the kind is then named after the family."""

    model: str                          # the tokenizers model and trainer: "wordpiece" | "bpe" | "unigram"
    specials: dict[str, str | None]     # role (pad, unk, cls, sep, mask) -> token; trained ones get ids in this order
    frame: str                          # how texts are framed: "cls-sep" ([CLS] A [SEP] B [SEP], types 0 / 1),
    #                                     "double-sep" (<s> A </s></s> B </s>), "eos" (A </s> B </s>), "none"
    hf_class: str                       # tokenizer_config.json's tokenizer_class
    special_map: tuple[tuple[str, str], ...]  # special_tokens_map.json: (entry, role), in the file's order
    config: dict[str, Any] = field(default_factory=dict)  # the rest of tokenizer_config.json
    marker: str | None = None           # a token only this layout's files hold (how a loaded file is recognised)
    normalise: bool = True              # False: the text reaches the model untouched (T5)
    cased: bool = False                 # never lower-cased
    sentinels: int = 0                  # span-corruption sentinels <extra_id_K> added after the pieces (T5)
    keeps_spaces: bool = False          # shards keep the spaces between sentences (a causal LM writes them: GPT-2)
    mask_lstrip: bool = False           # <mask> takes the space before it (RoBERTa)
    # the roles whose tokens take the ids after the pieces (the mask token last: DeBERTa's, XLM-R's); the other
    # special tokens come first, in `specials` order
    after_pieces: tuple[str, ...] = ()
    # whitespace runs and line breaks become one space, then NFC, no trailing space, "▁" before every word and no
    # other split (DeBERTa-v2's SentencePiece normaliser; else ALBERT's, or none with normalise=False)
    collapses_whitespace: bool = False
    keep_accents: bool = False          # tokenizer_config.json says keep_accents (= not lower-cased), as ALBERT's

    def special_order(self) -> tuple[list[str], list[str]]:
        """The special tokens in id order: (those before the pieces, those after them, `after_pieces`')."""
        last = [self.specials[role] for role in self.after_pieces]
        first = [t for t in dict.fromkeys(self.specials.values()) if t is not None and t not in last]
        return first, last


@dataclass(frozen=True)
class Family:
    """What one member of the BERT family fixes (see the module docstring); the defaults are BERT's."""

    model_type: str
    hf_prefix: str       # HF class names: f"{hf_prefix}Model", f"{hf_prefix}ForSequenceClassification", ...
    weight_prefix: str   # the body's name inside HF checkpoints with a head: "bert", "roberta", "transformer", ...
    stack: str = ENCODER  # what it builds: ENCODER, DECODER or ENCODER_DECODER
    # The heads its checkpoints carry, as transformers names the class of each (a key of HEADS -> class name).
    head_classes: dict[str, str] = field(default_factory=dict, compare=False)
    # ---- config.json, both ways: write_config(cfg) -> dict; read_config(family, dict, source, bertforge block) ->
    # the config's keyword arguments (raises KeyError for a missing required field: the caller names it)
    write_config: Callable[[Any], dict[str, Any]] = field(default=bert_write_config, compare=False, repr=False)
    read_config: Callable[["Family", dict[str, Any], str, dict[str, Any]], dict[str, Any]] = field(
        default=bert_read_config, compare=False, repr=False)
    # A strict schema (the encoder-decoders'): its field names (others are refused; empty: not checked) and the
    # values of the fields bertforge computes only one way.
    config_fields: frozenset[str] = frozenset()
    fixed_fields: dict[str, Any] = field(default_factory=dict, compare=False)
    keeps_token_ids: bool = False        # config.json's bos/eos/cls/sep ids are read back into `extra`
    kept_fields: tuple[str, ...] = ()    # config.json fields of its own kept in `extra` and written back (DPR's)
    # config.json fields set from the tokenizer when a model is made for it: field -> tokenizer role
    token_ids_from_tokenizer: dict[str, str] = field(default_factory=dict, compare=False)
    # ---- tensor names: (canonical pattern, family replacement) rules; `first_rule_only`: the first match wins (no
    # match keeps the canonical name), else every rule applies in turn (BART)
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
    # ---- checkpoints that wrap another family's network under names of their own (DPR's question and context
    # encoders hold a BertModel): `wraps` is that family (a model read from them trains and saves as it);
    # `architecture` the bare model's class when it is not f"{hf_prefix}Model"; `alternative_architecture` the class
    # whose layout `alternative_weight_rules` is (then written too, when a writer asks for it)
    wraps: str | None = None
    architecture: str | None = None
    alternative_architecture: str | None = None
    # ---- the sentence vector its checkpoints define (`bertforge embed` on a plain folder of the family): the
    # pooling (None: mean pooling) and the config.json field giving the width of a linear map after it, stored as
    # the canonical `PROJECTION` tensors (0 or absent: none; DPR's [CLS] vector and `projection_dim`)
    sentence_pooling: str | None = None
    projection_field: str | None = None
    # ---- published shapes: name -> (a size of config/sizes.py, overrides); `families.SIZES_FAMILY`'s are also
    # the sizes themselves, f"{model_type}-{size}"
    presets: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict, compare=False)
    # ---- settings (transformers' defaults for the family)
    vocab_size: int = 30522
    type_vocab_size: int = 2
    pad_token_id: int = 0
    bos_token_id: int | None = None      # encoder-decoders: the id a prompt starts with (None: none)
    eos_token_id: int | None = None      # encoder-decoders: the id generation stops at
    max_position_embeddings: int = 512
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    dropout: float = 0.1                 # hidden and attention-probability dropout
    sublayer_dropout: float | None = None  # encoder-decoders: attention and activation dropout (None: `dropout`)
    embedding_size: int | None = None    # None: the hidden size (no factorisation)
    share_layers: str = "none"
    use_pooler: bool = True
    # ---- structure
    factorised: bool = False             # may have embedding_size != hidden_size (a projection E -> H)
    positions_after_padding: bool = False  # position ids start at pad_token_id + 1 (RoBERTa)
    position_offset: int = 0             # encoder-decoders: rows of the position table before position 0 (BART: 2)
    relative_positions: bool = False     # no learned position table: relative positions (XLNet, T5)
    two_stream: bool = False             # XLNet's two-stream relative encoder (model.xlnet), which trains the
    #                                      permutation LM; not model.Encoder
    causal_encoder: bool = False         # transformers' is_decoder=True on this encoder: a causal mask
    norm_position: str = "post"
    rms_norm: bool = False               # RMSNorm (no mean, no bias) instead of LayerNorm (T5)
    position_embedding_type: str = "absolute"
    gated_mlp: bool = False
    gated_mlp_switch: bool = False       # the layout can say a gated FFN per model (T5 v1.1's gated-gelu)
    bias: bool = True                    # attention, MLP, norm and MLM-transform biases
    bias_switches: bool = False          # the checkpoint layout can say each bias and the window (ModernBERT)
    scaled_attention: bool = True        # scores divided by sqrt(head_dim) (T5: not; its init absorbs it)
    own_head_width: bool = False         # encoder-decoders: a head width of its own (T5's d_kv), not d_model / heads
    # settings its config.json stores once for both stacks: (a, b) pairs that must be equal (T5Config)
    one_value_for: tuple[tuple[str, str], ...] = ()
    local_attention: int | None = None
    global_attn_every_n_layers: int = 1
    rope_theta: float = 10000.0          # global layers
    local_rope_theta: float = 10000.0    # sliding-window layers
    initializer_cutoff_factor: float | None = None  # truncated-normal init at +-factor std
    sparse_attention: str | None = None  # SLIDING_WINDOW, BLOCK_SPARSE, or None: full attention
    # A gated MLP has two input matrices: 2/3 of the size's intermediate width keeps the parameter count and the
    # FLOPs of the ungated MLP (Shazeer 2020), so a size means the same compute in every family.
    intermediate_scale: float = 1.0
    # ---- heads
    mlm_head_act: str | None = None      # the MLM transform's activation (None: hidden_act; RoBERTa's is erf GELU)
    masked_lm_pooler: bool = False       # its *ForMaskedLM checkpoints carry the pooler (BigBird)
    # how a sequence classifier (and a multiple-choice head) reads the encoder: POOLER, FIRST_TOKEN or OWN_POOLER
    sequence_head: str = POOLER
    pooler_act: str = "tanh"             # the pooler's activation (DeBERTa's ContextPooler: GELU)
    hf_task_heads: tuple[str, ...] = TASK_HEADS  # task heads whose transformers class has bertforge's layout
    single_segment: bool = False         # a pair is one segment: type id 0 throughout, the separator between them
    # replaced-token detection: "rtd" in `head_classes` trains it in the family's own layout (else in
    # `families.RTD_HOST`'s); `rtd_generator` is the generator's shape
    rtd_generator: str = NARROW_GENERATOR
    # ---- the encoder-decoders' output and generation
    init: str = NORMAL_INIT              # NORMAL_INIT or FAN_IN_INIT
    rescales_output: bool = False        # hidden * d_model**-0.5 before the tied projection (T5)
    final_logits_bias: bool = False      # a bias buffer on the logits (BART)
    embedding_padding_idx: bool = False  # the shared embedding's padding row gets no gradient (BART)
    decoder_starts_with: str = "pad"     # the token the decoder starts from: "pad" (T5) or "eos" (BART)
    prompt_starts_with_bos: bool = False  # a prompt is "<s> text </s>" (BART), else "text </s>"
    forces_eos: bool = False             # generation ends on a forced eos (BART's forced_eos_token_id)
    # ---- what other bertforge verbs do with it
    finetune_lr: float = 3e-5            # `finetune`'s default peak learning rate
    distils_to: str | None = None        # the family of its DistilBERT-style student (`distill general`)
    long_variant: str | None = None      # the long-attention family `longify` turns it into
    # ---- pretraining recipes (`bertforge pretrain --recipe NAME`): Recipe fields without model_type, as plain data
    recipes: tuple[dict[str, Any], ...] = field(default=(), compare=False)
    tokenizer: TokenizerLayout | None = field(default=None, compare=False)  # its own tokenizer kind, if any

    def __post_init__(self) -> None:
        if self.stack not in STACKS:
            raise BertforgeError(f"family {self.model_type}: unknown stack {self.stack!r}")
        unknown = set(self.head_classes) - set(HEADS)
        if unknown:
            raise BertforgeError(f"family {self.model_type}: unknown heads {sorted(unknown)}")
        if self.sequence_head not in SEQUENCE_HEADS:
            raise BertforgeError(f"family {self.model_type}: unknown sequence head {self.sequence_head!r}")
        if self.rtd_generator not in (NARROW_GENERATOR, SHALLOW_GENERATOR):
            raise BertforgeError(f"family {self.model_type}: unknown generator shape {self.rtd_generator!r}")

    @property
    def base_architecture(self) -> str:
        """The `architectures` entry of a bare model's config.json, e.g. "BertModel"; an encoder-decoder's is its
        language model."""
        if self.architecture is not None:
            return self.architecture
        return self.head_classes["lm"] if self.stack == ENCODER_DECODER else f"{self.hf_prefix}Model"

    def task_architecture(self, kind: str, bertforge_name: str) -> str:
        """The `architectures` entry of a task model of `kind`: transformers' class where it has bertforge's
        layout, else the bertforge-only name (load those with bertforge: transformers would put a random head
        in place of the trained one)."""
        suffix = {"classify": "ForSequenceClassification", "regress": "ForSequenceClassification",
                  "tag": "ForTokenClassification", "qa": "ForQuestionAnswering", "choice": "ForMultipleChoice"}
        return self.hf_prefix + suffix[kind] if kind in self.hf_task_heads else "Bertforge" + bertforge_name

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

    def seq2seq_settings(self) -> dict[str, Any]:
        """The Seq2SeqConfig keyword arguments an encoder-decoder family fixes (a size supplies the shape)."""
        sub = self.dropout if self.sublayer_dropout is None else self.sublayer_dropout
        return dict(model_type=self.model_type, vocab_size=self.vocab_size, activation=self.hidden_act,
                    dropout=self.dropout, attention_dropout=sub, activation_dropout=sub,
                    layer_norm_eps=self.layer_norm_eps, max_position_embeddings=self.max_position_embeddings,
                    pad_token_id=self.pad_token_id, eos_token_id=self.eos_token_id, bos_token_id=self.bos_token_id,
                    decoder_start_token_id=self.eos_token_id if self.decoder_starts_with == "eos"
                    else self.pad_token_id,
                    forced_eos_token_id=self.eos_token_id if self.forces_eos else None)

    def intermediate(self, size_intermediate: int) -> int:
        """The MLP width this family uses for a size (gated MLPs: scaled, rounded to a multiple of 64)."""
        if self.intermediate_scale == 1.0:
            return size_intermediate
        return max(64, int(round(size_intermediate * self.intermediate_scale / 64)) * 64)

    def token_ids(self, tokenizer: Any) -> dict[str, int]:
        """The config.json token ids this family records, from `tokenizer` (its `<role>_token_id`s)."""
        ids = {key: getattr(tokenizer, f"{role}_token_id") for key, role in self.token_ids_from_tokenizer.items()}
        return {key: value for key, value in ids.items() if value is not None}
