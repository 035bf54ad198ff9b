"""The encoder-decoders' configuration: one `Seq2SeqConfig` for T5 (Raffel et al. 2020) and BART (Lewis et al. 2020).

`bertforge.model.Seq2SeqLM` is one encoder-decoder; what differs between the two families is a handful of
structural switches, fixed per family (`families/t5.py`, `families/bart.py`) and read by the model as config
properties:

    switch             T5                                  BART
    norm               RMSNorm (no mean, no bias)          LayerNorm
    norm_position      pre (x + f(norm(x)); a final norm)  post (norm(x + f(x)))
    positions          bucketed relative bias, computed    learned absolute table, offset 2,
                       in layer 0 and shared by the rest   + layernorm_embedding
    bias               none (no Linear bias)               every Linear
    attention_scale    none (q k^T, the init absorbs it)   1/sqrt(head_dim)
    output             tied, hidden * d_model**-0.5        tied, + final_logits_bias
    decoder start      pad (0)                             eos (2)

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
from pathlib import Path
from typing import Any

from bertforge.config.checks import check_fields
from bertforge.config.sizes import SIZES
from bertforge.families import ACTIVATIONS, SEQ2SEQ_FAMILIES, SEQ2SEQ_TYPES, Seq2SeqFamily
from bertforge.errors import BertforgeError
from bertforge.io.read import read_json, safetensors_shapes


@dataclass
class Seq2SeqConfig:
    model_type: str = "t5"
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
        if self.model_type not in SEQ2SEQ_FAMILIES:
            raise BertforgeError(f"unknown encoder-decoder model_type {self.model_type!r} "
                                 f"(expected one of {', '.join(SEQ2SEQ_TYPES)})")
        if self.activation.lower() not in ACTIVATIONS:
            raise BertforgeError(f"unsupported activation {self.activation!r} "
                                 f"(expected one of {', '.join(ACTIVATIONS)})")
        for side in ("encoder", "decoder"):
            heads = getattr(self, f"{side}_attention_heads")
            if self.d_kv is None and self.d_model % heads:
                raise BertforgeError(f"d_model {self.d_model} is not a multiple of {side}_attention_heads {heads}")
            if getattr(self, f"{side}_layers") < 1:
                raise BertforgeError(f"{side}_layers must be at least 1")
        if self.d_kv is None or self.model_type == "bart":  # BART: d_model // heads, per stack (head_dim_for)
            self.d_kv = self.d_model // self.encoder_attention_heads
        if self.model_type == "t5":
            # T5Config has one head count, one FFN width and one dropout rate: anything else has no checkpoint.
            for a, b in (("encoder_attention_heads", "decoder_attention_heads"),
                         ("encoder_ffn_dim", "decoder_ffn_dim"), ("dropout", "attention_dropout"),
                         ("dropout", "activation_dropout")):
                if getattr(self, a) != getattr(self, b):
                    raise BertforgeError(f"a t5 model has one {a} and {b} ({getattr(self, a)} != "
                                         f"{getattr(self, b)}): T5Config cannot store two")
        else:
            if self.gated_ffn:
                raise BertforgeError("a bart model cannot have gated_ffn=True (BartConfig has no gated FFN)")

    # ---- the family's switches (what Seq2SeqLM reads) ------------------------------------------------------------
    @property
    def family(self) -> Seq2SeqFamily:
        return SEQ2SEQ_FAMILIES[self.model_type]

    @property
    def is_encoder_decoder(self) -> bool:
        return True

    @property
    def is_decoder(self) -> bool:
        """Not a decoder-only model (the GPT-2 layout's flag in `ModelConfig`)."""
        return False

    def head_dim_for(self, n_heads: int) -> int:
        """The per-head width of a stack with n_heads heads: T5's d_kv, BART's d_model // n_heads."""
        return int(self.d_kv) if self.model_type == "t5" else self.d_model // n_heads

    @property
    def hidden_size(self) -> int:
        return self.d_model

    def replace(self, **changes: Any) -> "Seq2SeqConfig":
        return dataclasses.replace(self, **changes)

    # ---- Hugging Face config.json ------------------------------------------------------------------------------
    def to_hf_dict(self) -> dict[str, Any]:
        d = self.family.write_config(self)
        d.update(pad_token_id=self.pad_token_id, eos_token_id=self.eos_token_id,
                 decoder_start_token_id=self.decoder_start_token_id)
        d.update(architectures=[self.family.architecture], is_encoder_decoder=True, tie_word_embeddings=True)
        d.update(self.extra)
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], source: str = "config.json") -> "Seq2SeqConfig":
        check_fields(d, source)  # every field's type and range (config.checks), before the family reads them
        model_type = d.get("model_type")
        if model_type not in SEQ2SEQ_FAMILIES:
            raise BertforgeError(f"{source}: model_type {model_type!r} is not an encoder-decoder bertforge reads "
                                 f"({', '.join(SEQ2SEQ_TYPES)})")
        fam = SEQ2SEQ_FAMILIES[model_type]
        for key in d:
            if key not in fam.config_fields and key not in _GENERIC_FIELDS:
                raise BertforgeError(f"{source}: unknown {model_type} config field {key!r}")
        fixed = dict(_GENERIC_FIXED, **fam.fixed_fields)
        for key, ok in fixed.items():
            if key in d and d[key] != ok:
                raise BertforgeError(f"{source}: {model_type} with {key}={d[key]!r} is not supported "
                                     f"(bertforge computes {key}={ok!r})")
        extra = {k: d[k] for k in _KEPT if k in d}
        try:
            return fam.read_config(cls, d, extra)
        except KeyError as err:
            raise BertforgeError(f"{source}: missing field {err.args[0]!r} for model_type {model_type!r}") from None
        except BertforgeError as err:
            raise BertforgeError(f"{source}: {err}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> "Seq2SeqConfig":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        cfg = cls.from_hf_dict(read_json(path), source=str(path))
        check_against_weights(cfg, path.parent / "model.safetensors", str(path))
        return cfg


_STACK_LAYER = re.compile(r"(?:^|\.)(encoder|decoder)\.(?:block|layers)\.(\d+)\.")


def check_against_weights(cfg: Seq2SeqConfig, weights: Path, source: str) -> None:
    """Refuse, from the safetensors header alone and before anything is allocated, a config.json whose layer
    counts the weights do not have, or whose sizes exceed every tensor's (a vocabulary of 1e10 would otherwise be
    allocated first). A smaller wrong size is left to loading, which names the tensor and both shapes."""
    sizes = ["vocab_size", "d_model", "encoder_ffn_dim", "decoder_ffn_dim"]
    if not cfg.family.relative_positions:
        sizes.append("max_position_embeddings")  # BART's position table; T5 has none
    for name in (*sizes, "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads"):
        if getattr(cfg, name) < 1:
            raise BertforgeError(f"{source}: {name} must be at least 1, got {getattr(cfg, name)}")
    if not weights.is_file():
        return
    shapes = safetensors_shapes(weights)
    largest = max((n for shape in shapes.values() for n in shape), default=0)
    for name in sizes:
        if largest and getattr(cfg, name) > largest:
            raise BertforgeError(f"{source}: {name} is {getattr(cfg, name)} but {weights.name} holds no tensor with "
                                 f"a dimension of {getattr(cfg, name)} (the largest is {largest})")
    found: dict[str, set[int]] = {}
    for key in shapes:
        if m := _STACK_LAYER.search(key):
            found.setdefault(m.group(1), set()).add(int(m.group(2)))
    for stack, indices in found.items():
        if max(indices) + 1 != getattr(cfg, f"{stack}_layers"):
            raise BertforgeError(f"{source}: {stack}_layers is {getattr(cfg, f'{stack}_layers')} but {weights.name} "
                                 f"holds {max(indices) + 1} {stack} layers")


# config.json fields any PretrainedConfig dump holds (read and dropped: they describe the run or generation
# defaults, not the network); each family's own fields and fixed values are in its file.
_GENERIC_FIELDS = {"architectures", "transformers_version", "dtype", "torch_dtype", "_name_or_path", "use_cache",
                   "is_encoder_decoder", "is_decoder", "return_dict", "output_hidden_states", "output_attentions",
                   "output_past", "torchscript", "chunk_size_feed_forward", "id2label", "label2id", "num_labels",
                   "problem_type", "task_specific_params", "tokenizer_class", "prefix", "gradient_checkpointing",
                   "finetuning_task", "bertforge", "bertforge_task",
                   # generation defaults of transformers 4 dumps (generation reads its own flags)
                   "max_length", "min_length", "num_beams", "no_repeat_ngram_size", "length_penalty",
                   "early_stopping", "do_sample", "temperature", "top_k", "top_p", "repetition_penalty",
                   "num_return_sequences", "bad_words_ids", "diversity_penalty", "num_beam_groups"}
_GENERIC_FIXED = {"is_encoder_decoder": True, "is_decoder": False}
_KEPT = ("id2label", "label2id", "problem_type", "task_specific_params", "bertforge", "bertforge_task")


# ---- composing from the shared sizes -----------------------------------------------------------------------------
# name -> (family, size, overrides): each family's published shapes (its file's `presets`)
SEQ2SEQ_PRESETS: dict[str, tuple[str, str, dict[str, Any]]] = {
    name: (fam.model_type, size, overrides) for fam in SEQ2SEQ_FAMILIES.values()
    for name, (size, overrides) in fam.presets.items()}


def compose_seq2seq(family: str, size: str, **overrides: Any) -> Seq2SeqConfig:
    """Family x size (+ overrides): the size's layers in both stacks, its width, heads and FFN width."""
    if family not in SEQ2SEQ_FAMILIES:
        raise BertforgeError(f"unknown encoder-decoder family {family!r} (choose from {', '.join(SEQ2SEQ_TYPES)})")
    if size not in SIZES:
        raise BertforgeError(f"unknown model size {size!r} (choose from {', '.join(SIZES)})")
    fam, s = SEQ2SEQ_FAMILIES[family], SIZES[size]
    drop = fam.dropout
    sub = drop if fam.sublayer_dropout is None else fam.sublayer_dropout
    settings = dict(model_type=family, vocab_size=fam.vocab_size, d_model=s.hidden, encoder_layers=s.layers,
                    decoder_layers=s.layers, encoder_attention_heads=s.heads, decoder_attention_heads=s.heads,
                    encoder_ffn_dim=s.intermediate, decoder_ffn_dim=s.intermediate, activation=fam.activation,
                    dropout=drop, attention_dropout=sub, activation_dropout=sub, layer_norm_eps=fam.layer_norm_eps,
                    max_position_embeddings=fam.max_position_embeddings, pad_token_id=fam.pad_token_id,
                    eos_token_id=fam.eos_token_id, bos_token_id=fam.bos_token_id,
                    decoder_start_token_id=fam.decoder_start_token_id,
                    forced_eos_token_id=fam.eos_token_id if fam.forced_eos else None)
    return Seq2SeqConfig(**{**settings, **overrides})


def seq2seq_preset(name: str, **overrides: Any) -> Seq2SeqConfig:
    """A named shape: t5-small, t5-base, t5-large, t5-v1_1-base, bart-base, bart-large (+ overrides); or
    "FAMILY-SIZE" with any shared size (t5-tiny, bart-mini, ...)."""
    if name in SEQ2SEQ_PRESETS:
        family, size, fixed = SEQ2SEQ_PRESETS[name]
        return compose_seq2seq(family, size, **{**fixed, **overrides})
    family, _, size = name.partition("-")
    if family in SEQ2SEQ_FAMILIES and size in SIZES:
        return compose_seq2seq(family, size, **overrides)
    raise BertforgeError(f"unknown encoder-decoder preset {name!r} (choose from {', '.join(SEQ2SEQ_PRESETS)}, "
                         f"or t5-SIZE / bart-SIZE with SIZE one of {', '.join(SIZES)})")


def is_seq2seq_dir(path: str | Path) -> bool:
    """Whether a checkpoint directory's config.json is a T5 / BART one (read without judging the rest)."""
    cfg = Path(path) / "config.json"
    return cfg.is_file() and read_json(cfg).get("model_type") in SEQ2SEQ_FAMILIES
