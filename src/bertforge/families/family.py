"""What one member of the BERT family fixes, as data: `Family`, one type for the encoders, the GPT-2 decoder and the
encoder-decoders (`stack` says which it builds). Each family file in this package builds one as `FAMILY`.

A family's record is its identity (model_type, Hugging Face class names, what it builds, the heads its checkpoints
carry, its published shapes, its pretraining recipes, its tokenizer layouts) and one part per concern, each a small
record of its own in `families/record/`:
  - `checkpoint` (`CheckpointLayout`): its tensor names (rules from bertforge's canonical names), fused or
    transposed tensors, what a bare body holds, the wrapped family and the sentence vector its files define;
  - `schema` (`ConfigSchema`): its `config.json` both ways, the checks of its fields, the fields it keeps;
  - `defaults` (`Defaults`): the settings it fixes (transformers' defaults for it);
  - `structure` (`StackTraits`): what the shared model code builds for it (positions, norms, MLP, attention);
  - `heads` (`Heads`): the MLM head, the sequence head, the task heads transformers shares, the RTD generator;
  - `seq2seq` (`Seq2SeqTraits`): the encoder-decoders' output and generation;
  - `verbs` (`VerbDefaults`): what other verbs do with it (finetune's rate, distill's student, longify's target).
A field of a part reads as `fam.heads.sequence_head` or, unambiguously, `fam.sequence_head`.

This module imports nothing of bertforge but its errors and the parts, so every layer may read the families.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.families.record.heads import (FIRST_TOKEN, NARROW_GENERATOR, OWN_POOLER, POOLER, SEQUENCE_HEADS,
                                             SHALLOW_GENERATOR, TASK_HEADS, Heads)
from bertforge.families.record.layout import CheckpointLayout, Rules
from bertforge.families.record.schema import (ConfigSchema, Field, bert_read_config, bert_write_config, checks,
                                              common_fields, refuse_unsupported, token_id)
from bertforge.families.record.seq2seq import FAN_IN_INIT, NORMAL_INIT, Seq2SeqTraits
from bertforge.families.record.tokenizer import TokenizerLayout
from bertforge.families.record.traits import (BLOCK_SPARSE, EITHER_MLP, GATED_MLP, MLP_KINDS, PLAIN_MLP,
                                              SLIDING_WINDOW, Defaults, StackTraits)
from bertforge.families.record.verbs import VerbDefaults

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "silu", "swish")
# What a family builds (`Family.stack`): a bidirectional encoder (model.Encoder, or XLNet's two-stream one), a
# left-to-right decoder (model.DecoderLM, GPT-2's layout) or an encoder-decoder (model.Seq2SeqLM).
ENCODER, DECODER, ENCODER_DECODER = "encoder", "decoder", "encoder-decoder"
STACKS = (ENCODER, DECODER, ENCODER_DECODER)
# The heads a family's checkpoints may carry (`Family.head_classes` keys): masked LM, masked LM + sentence relation,
# a left-to-right LM on the encoder (BERT's "LTR" arm), replaced-token detection, and the family's own language
# model head (GPT-2's causal LM, XLNet's permutation LM, T5's / BART's conditional generation).
HEADS = ("mlm", "pretraining", "ltr", "rtd", "lm")
# The canonical encoder: its attribute in every model with heads, and the first part of its tensor names
# (`bert.encoder.layer.N...`); the family rules translate from these names.
CANONICAL_ENCODER = "bert"
# The canonical name of an encoder layer (`bert.encoder.layer.N.`), the start of most weight rules.
LAYER = r"bert\.encoder\.layer\.(\d+)\."
# The canonical name of a linear map of the sentence vector a family's checkpoints carry (`projection_field`).
PROJECTION = "projection"
# config.json special-token ids no ModelConfig field holds (kept in `extra` for the families that write them).
TOKEN_IDS = ("bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id")
# The parts of a record, in the order a field name is looked up in them (`Family.__getattr__`).
PARTS = ("checkpoint", "schema", "defaults", "structure", "heads", "seq2seq", "verbs")


@dataclass(frozen=True)
class Family:
    """What one member of the BERT family fixes (see the module docstring); the defaults are BERT's."""

    model_type: str
    hf_prefix: str       # HF class names: f"{hf_prefix}Model", f"{hf_prefix}ForSequenceClassification", ...
    weight_prefix: str   # the body's name inside HF checkpoints with a head: "bert", "roberta", "transformer", ...
    stack: str = ENCODER  # what it builds: ENCODER, DECODER or ENCODER_DECODER
    # The heads its checkpoints carry, as transformers names the class of each (a key of HEADS -> class name).
    head_classes: dict[str, str] = field(default_factory=dict, compare=False)
    # published shapes: name -> (a size of config/sizes.py, overrides); `families.SIZES_FAMILY`'s are also the sizes
    # themselves, f"{model_type}-{size}"
    presets: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict, compare=False)
    # the pretraining recipes that build it (`bertforge pretrain --recipe NAME`): Recipe fields without model_type
    recipes: tuple[dict[str, Any], ...] = field(default=(), compare=False)
    tokenizer: TokenizerLayout | None = field(default=None, compare=False)  # its own tokenizer kind, if any
    # the plain tokenizer kinds its paper introduced ("wordpiece": BERT's, ...): kind -> layout
    plain_tokenizers: dict[str, TokenizerLayout] = field(default_factory=dict, compare=False)
    checkpoint: CheckpointLayout = CheckpointLayout()
    schema: ConfigSchema = ConfigSchema()
    defaults: Defaults = Defaults()
    structure: StackTraits = StackTraits()
    heads: Heads = Heads()
    seq2seq: Seq2SeqTraits = Seq2SeqTraits()
    verbs: VerbDefaults = VerbDefaults()

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
        if self.mlp not in MLP_KINDS:
            raise BertforgeError(f"family {self.model_type}: unknown MLP {self.mlp!r}")

    def __getattr__(self, name: str) -> Any:
        """A part's field by its name alone (`fam.sequence_head` is `fam.heads.sequence_head`)."""
        if name.startswith("__") or name in PARTS:
            raise AttributeError(name)
        for part in PARTS:
            value = getattr(self.__dict__.get(part), name, _MISSING)
            if value is not _MISSING:
                return value
        raise AttributeError(f"Family has no field {name!r}")

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
                    gated_mlp=self.mlp == GATED_MLP, attention_bias=self.bias, mlp_bias=self.bias, norm_bias=self.bias,
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


_MISSING = object()


def part_fields() -> dict[str, str]:
    """Each part's field name -> its part (a name is in one part only)."""
    return {f.name: part for part in PARTS for f in dataclasses.fields(Family.__dataclass_fields__[part].default)}
