"""Model configuration: one dataclass for every member of the family, plus named presets.

BERT, RoBERTa, ALBERT, DistilBERT and ELECTRA are the same encoder with different switches:
  - `embedding_size` != hidden_size  -> factorised embeddings projected to H (ALBERT, ELECTRA)
  - `share_layers`                   -> cross-layer parameter sharing (ALBERT)
  - `type_vocab_size` = 0            -> no token-type embeddings (DistilBERT)
  - `use_pooler` = False             -> no [CLS] pooler (DistilBERT, ELECTRA)
  - `model_type` = "roberta"         -> position ids counted from padding_idx + 1
`to_hf_dict` / `from_hf_dict` translate to and from each family's Hugging Face `config.json` schema.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError

MODEL_TYPES = ("bert", "roberta", "albert", "distilbert", "electra")
SHARE_MODES = ("none", "all", "attention", "ffn")
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "silu", "swish")


@dataclass
class ModelConfig:
    model_type: str = "bert"
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    embedding_size: int | None = None  # None -> hidden_size (no factorisation)
    share_layers: str = "none"
    use_pooler: bool = True
    # Task metadata carried through config.json (id2label etc.); not used by the encoder itself.
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise BertforgeError(f"unknown model_type {self.model_type!r} (expected one of {', '.join(MODEL_TYPES)})")
        if self.share_layers not in SHARE_MODES:
            raise BertforgeError(f"unknown share_layers {self.share_layers!r} (expected one of {', '.join(SHARE_MODES)})")
        if self.hidden_size % self.num_attention_heads:
            raise BertforgeError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {self.num_attention_heads}")
        if self.hidden_act.lower() not in ACTIVATIONS:
            raise BertforgeError(f"unsupported hidden_act {self.hidden_act!r} (expected one of {', '.join(ACTIVATIONS)})")
        if self.embedding_size is None:
            self.embedding_size = self.hidden_size
        if self.model_type in ("bert", "roberta", "distilbert") and self.embedding_size != self.hidden_size:
            raise BertforgeError(f"{self.model_type} cannot have embedding_size != hidden_size; use albert or electra")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def position_offset(self) -> int:
        """RoBERTa counts positions from padding_idx + 1 (so position 0..padding_idx are never used by tokens)."""
        return self.pad_token_id + 1 if self.model_type == "roberta" else 0

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    # ---- Hugging Face config.json -------------------------------------------------------------------------
    def to_hf_dict(self, architectures: list[str] | None = None) -> dict[str, Any]:
        common = dict(vocab_size=self.vocab_size, initializer_range=self.initializer_range,
                      pad_token_id=self.pad_token_id, max_position_embeddings=self.max_position_embeddings)
        if self.model_type == "distilbert":
            d: dict[str, Any] = dict(
                model_type="distilbert", dim=self.hidden_size, n_layers=self.num_hidden_layers,
                n_heads=self.num_attention_heads, hidden_dim=self.intermediate_size, activation=self.hidden_act,
                dropout=self.hidden_dropout_prob, attention_dropout=self.attention_probs_dropout_prob,
                sinusoidal_pos_embds=False, tie_weights_=True, **common)
        else:
            d = dict(
                model_type=self.model_type, hidden_size=self.hidden_size, num_hidden_layers=self.num_hidden_layers,
                num_attention_heads=self.num_attention_heads, intermediate_size=self.intermediate_size,
                hidden_act=self.hidden_act, hidden_dropout_prob=self.hidden_dropout_prob,
                attention_probs_dropout_prob=self.attention_probs_dropout_prob,
                type_vocab_size=self.type_vocab_size, layer_norm_eps=self.layer_norm_eps,
                position_embedding_type="absolute", **common)
            if self.model_type in ("albert", "electra"):
                d["embedding_size"] = self.embedding_size
            if self.model_type == "albert":
                d["num_hidden_groups"] = 1 if self.share_layers == "all" else self.num_hidden_layers
                d["inner_group_num"] = 1
            if self.model_type == "roberta":
                d.update(bos_token_id=0, eos_token_id=2)
        d["tie_word_embeddings"] = True
        d["bertforge"] = {"share_layers": self.share_layers, "use_pooler": self.use_pooler}
        if architectures:
            d["architectures"] = architectures
        d.update(self.extra)
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], source: str = "config.json") -> "ModelConfig":
        model_type = d.get("model_type")
        if model_type not in MODEL_TYPES:
            raise BertforgeError(f"{source}: unknown model_type {model_type!r} "
                                 f"(bertforge reads {', '.join(MODEL_TYPES)})")
        ours = d.get("bertforge", {})
        known_extra = ("id2label", "label2id", "problem_type", "num_labels", "architectures",
                       "classifier_dropout", "bertforge_task")
        extra = {k: d[k] for k in known_extra if k in d and k != "architectures"}
        try:
            if model_type == "distilbert":
                return cls(model_type="distilbert", vocab_size=d["vocab_size"], hidden_size=d["dim"],
                           num_hidden_layers=d["n_layers"], num_attention_heads=d["n_heads"],
                           intermediate_size=d["hidden_dim"], hidden_act=d.get("activation", "gelu"),
                           hidden_dropout_prob=d.get("dropout", 0.1),
                           attention_probs_dropout_prob=d.get("attention_dropout", 0.1),
                           max_position_embeddings=d.get("max_position_embeddings", 512), type_vocab_size=0,
                           initializer_range=d.get("initializer_range", 0.02), layer_norm_eps=1e-12,
                           pad_token_id=d.get("pad_token_id", 0), use_pooler=False, extra=extra)
            share = ours.get("share_layers", "none")
            if model_type == "albert":
                groups = d.get("num_hidden_groups", 1)
                if d.get("inner_group_num", 1) != 1 or groups not in (1, d["num_hidden_layers"]):
                    raise BertforgeError(f"{source}: ALBERT with num_hidden_groups={groups}, "
                                         f"inner_group_num={d.get('inner_group_num')} is not supported")
                if groups == 1:
                    share = "all"
            return cls(model_type=model_type, vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
                       num_hidden_layers=d["num_hidden_layers"], num_attention_heads=d["num_attention_heads"],
                       intermediate_size=d["intermediate_size"], hidden_act=d.get("hidden_act", "gelu"),
                       hidden_dropout_prob=d.get("hidden_dropout_prob", 0.1),
                       attention_probs_dropout_prob=d.get("attention_probs_dropout_prob", 0.1),
                       max_position_embeddings=d.get("max_position_embeddings", 512),
                       type_vocab_size=d.get("type_vocab_size", 2),
                       initializer_range=d.get("initializer_range", 0.02),
                       layer_norm_eps=d.get("layer_norm_eps", 1e-12), pad_token_id=d.get("pad_token_id") or 0,
                       embedding_size=d.get("embedding_size") if model_type in ("albert", "electra") else None,
                       share_layers=share,
                       use_pooler=ours.get("use_pooler", model_type != "electra"), extra=extra)
        except KeyError as err:
            raise BertforgeError(f"{source}: missing field {err.args[0]!r} for model_type {model_type!r}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise BertforgeError(f"{path}: no such file (a model directory needs config.json)")
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise BertforgeError(f"{path}: not valid JSON ({err})") from None
        return cls.from_hf_dict(d, source=str(path))


def _bert(layers: int, hidden: int, heads: int) -> dict[str, Any]:
    return dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, intermediate_size=4 * hidden)


# Shapes from the BERT paper and Turc et al. 2019 ("Well-Read Students Learn Better") for the compact ones.
PRESETS: dict[str, dict[str, Any]] = {
    "bert-tiny": _bert(2, 128, 2),
    "bert-mini": _bert(4, 256, 4),
    "bert-small": _bert(4, 512, 8),
    "bert-medium": _bert(8, 512, 8),
    "bert-base": _bert(12, 768, 12),
    "bert-large": _bert(24, 1024, 16),
    "roberta-base": dict(_bert(12, 768, 12), model_type="roberta", vocab_size=50265, pad_token_id=1,
                         max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5),
    "albert-base": dict(_bert(12, 768, 12), model_type="albert", embedding_size=128, share_layers="all",
                        vocab_size=30000, hidden_act="gelu_new", hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0),
    "albert-large": dict(_bert(24, 1024, 16), model_type="albert", embedding_size=128, share_layers="all",
                         vocab_size=30000, hidden_act="gelu_new", hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0),
    "distilbert-base": dict(_bert(6, 768, 12), model_type="distilbert", type_vocab_size=0, use_pooler=False),
    "electra-small": dict(_bert(12, 256, 4), model_type="electra", embedding_size=128, use_pooler=False),
    "electra-base": dict(_bert(12, 768, 12), model_type="electra", use_pooler=False),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """A named shape (bert-tiny ... bert-large, albert-*, distilbert-base, electra-*) with overrides."""
    if name not in PRESETS:
        raise BertforgeError(f"unknown model size {name!r} (choose from {', '.join(PRESETS)})")
    return ModelConfig(**{**PRESETS[name], **overrides})
