"""Pretraining recipes: named presets whose every ablation arm is one field (one CLI flag) away.

A `Recipe` fixes the objective, masking, input format, static vs dynamic masks, tokenizer kind and model family;
model size, sequence length, batch size and duration are separate. `resolve(name, **overrides)` applies flags.
Family settings (activation, dropout, positions, ...) come from `bertforge.config.FAMILIES`, shapes and default
learning rates from `bertforge.config.SIZES`; a recipe only names the knobs that are ablation arms.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from bertforge.config import SIZES as SHAPES
from bertforge.config import ModelConfig, compose
from bertforge.errors import BertforgeError
from bertforge.pretrain.objectives import OBJECTIVES
from bertforge.training.optim import SCHEDULES

MASKINGS = ("token", "whole_word", "span")
INPUT_FORMATS = ("segment-pair", "sentence-pair", "full-sentences", "doc-sentences")
SIZES = tuple(f"bert-{size}" for size in SHAPES)  # --size names the BERT shape: bert-tiny ... bert-large


@dataclass(frozen=True)
class Recipe:
    name: str
    objective: str             # one of objectives.OBJECTIVES
    masking: str               # token | whole_word | span
    dynamic: bool              # re-mask every epoch (RoBERTa) vs masks fixed at preparation (BERT, dupe_factor)
    input_format: str          # segment-pair | sentence-pair | full-sentences | doc-sentences
    tokenizer_kind: str        # wordpiece | bpe | unigram
    model_type: str            # the family: a key of bertforge.config.FAMILIES
    dupe_factor: int = 1       # static masking: how many differently-masked copies of the data
    mask_prob: float = 0.15
    embedding_size: int | None = None  # factorised E (ALBERT, ELECTRA); None: the family's
    share_layers: str | None = None    # cross-layer sharing; None: the family's
    lr_scale: float = 1.0      # x the size's default learning rate (ELECTRA trains at twice BERT's rate)
    schedule: str = "linear"   # linear: warm-up + linear decay (BERT); wsd: warm-up, stable, 1-sqrt decay

    def with_(self, **changes) -> "Recipe":
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def validate(self) -> "Recipe":
        if self.objective not in OBJECTIVES:
            raise BertforgeError(f"--objective: unknown {self.objective!r} (choose from {', '.join(OBJECTIVES)})")
        if self.masking not in MASKINGS:
            raise BertforgeError(f"--masking: unknown {self.masking!r} (choose from {', '.join(MASKINGS)})")
        if not 0.0 < self.mask_prob < 1.0:
            raise BertforgeError(f"--mask-prob: must be between 0 and 1, got {self.mask_prob}")
        if self.schedule not in SCHEDULES:
            raise BertforgeError(f"--schedule: unknown {self.schedule!r} (choose from {', '.join(SCHEDULES)})")
        if self.input_format not in INPUT_FORMATS:
            raise BertforgeError(f"--input-format: unknown {self.input_format!r} "
                                 f"(choose from {', '.join(INPUT_FORMATS)})")
        if self.objective in ("mlm+nsp", "mlm+sop") and self.input_format not in ("segment-pair", "sentence-pair"):
            raise BertforgeError(f"--objective {self.objective} needs sentence pairs: use --input-format "
                                 f"segment-pair or sentence-pair (got {self.input_format})")
        if self.objective == "span+sbo" and self.masking != "span":
            raise BertforgeError("--objective span+sbo needs --masking span (the SBO head predicts span tokens)")
        if self.objective in ("mlm+nsp", "mlm+sop") and self.model_type not in ("bert", "albert"):
            raise BertforgeError(f"--objective {self.objective}: a {self.model_type} model has no pooler for "
                                 f"the sentence head; use a bert or albert recipe")
        return self

    @property
    def sentence_task(self) -> str | None:
        """What `sentence_label` means in the batches: "nsp", "sop" or None."""
        return {"mlm+nsp": "nsp", "mlm+sop": "sop"}.get(self.objective)

    def model_config(self, size: str, vocab_size: int, pad_token_id: int, seq_len: int) -> ModelConfig:
        """Encoder config: the size's shape x the recipe's family, the tokenizer's vocabulary and padding id, this
        recipe's ablation knobs, and positions enough for seq_len (at least the 512 of the published models)."""
        knobs = {k: v for k, v in (("embedding_size", self.embedding_size), ("share_layers", self.share_layers))
                 if v is not None}
        cfg = compose(self.model_type, shape_name(size), vocab_size=vocab_size, pad_token_id=pad_token_id, **knobs)
        return cfg.replace(max_position_embeddings=max(512, seq_len) + cfg.position_offset)

    def default_lr(self, size: str) -> float:
        """Peak learning rate when --lr is not given: the size's (see config.Size) times the recipe's scale."""
        return SHAPES[shape_name(size)].pretrain_lr * self.lr_scale


def shape_name(size: str) -> str:
    """"bert-base" (a --size choice) -> "base" (a key of config.SIZES)."""
    if size not in SIZES:
        raise BertforgeError(f"--size: unknown {size!r} (choose from {', '.join(SIZES)})")
    return size.removeprefix("bert-")


def size_of(cfg: ModelConfig) -> str:
    """The --size name whose shape best describes cfg (a --init-from checkpoint): the smallest size at least as
    wide and as deep, else the largest. Its defaults are the conservative choice for a model between sizes."""
    for name, shape in SHAPES.items():
        if shape.hidden >= cfg.hidden_size and shape.layers >= cfg.num_hidden_layers:
            return f"bert-{name}"
    return SIZES[-1]


RECIPES: dict[str, Recipe] = {
    # Devlin et al. 2019: MLM + NSP on segment pairs, masks fixed at preparation time (dupe_factor copies).
    "bert": Recipe("bert", "mlm+nsp", "token", dynamic=False, input_format="segment-pair",
                   tokenizer_kind="wordpiece", model_type="bert", dupe_factor=5),
    # Liu et al. 2019: no NSP, dynamic masking, contiguous full sentences, byte-level BPE.
    "roberta": Recipe("roberta", "mlm", "token", dynamic=True, input_format="full-sentences",
                      tokenizer_kind="bpe", model_type="roberta"),
    # Lan et al. 2020: sentence-order prediction, factorised embeddings (E=128), all layers shared, unigram.
    "albert": Recipe("albert", "mlm+sop", "token", dynamic=False, input_format="segment-pair",
                     tokenizer_kind="unigram", model_type="albert", dupe_factor=5),
    # Joshi et al. 2020: span masking + span-boundary objective, single segments, no NSP.
    "spanbert": Recipe("spanbert", "span+sbo", "span", dynamic=True, input_format="full-sentences",
                       tokenizer_kind="wordpiece", model_type="bert"),
    # Clark et al. 2020: replaced-token detection with a 1/4-size generator; twice BERT's learning rate
    # (2e-4 for ELECTRA-Base/Large vs BERT's 1e-4, Table 6).
    "electra": Recipe("electra", "electra", "token", dynamic=True, input_format="full-sentences",
                      tokenizer_kind="wordpiece", model_type="electra", lr_scale=2.0),
    # Warner et al. 2024 (ModernBERT): MLM only, no NSP, 30% masking, dynamic masks, rows packed with contiguous
    # text so no row carries padding (ModernBERT unpads; full-sentences rows are full by construction), BPE, the
    # modernbert family (pre-norm, RoPE, GeGLU, no biases, local/global attention), the warm-up / stable /
    # 1-sqrt-decay schedule. Pre-norm stays stable at rates that make post-LN BERT collapse (see `lr_scale`).
    "modern": Recipe("modern", "mlm", "token", dynamic=True, input_format="full-sentences", tokenizer_kind="bpe",
                     model_type="modernbert", mask_prob=0.3, lr_scale=2.0, schedule="wsd"),
}


def resolve(name: str, **overrides) -> Recipe:
    """The named recipe with flag overrides (None = keep the recipe's value), validated."""
    if name not in RECIPES:
        raise BertforgeError(f"--recipe: unknown {name!r} (choose from {', '.join(RECIPES)})")
    recipe = RECIPES[name].with_(**overrides)
    if overrides.get("objective") == "span+sbo" and overrides.get("masking") is None:
        recipe = recipe.with_(masking="span")
    return recipe.validate()
