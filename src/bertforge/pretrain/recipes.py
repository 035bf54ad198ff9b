"""Pretraining recipes: named presets whose every ablation arm is one field (one CLI flag) away.

A `Recipe` fixes the objective, masking, input format, static vs dynamic masks, tokenizer kind and model family;
model size, sequence length, batch size and duration are separate. `resolve(name, **overrides)` applies flags.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from bertforge.config import ModelConfig, preset
from bertforge.errors import BertforgeError
from bertforge.pretrain.objectives import OBJECTIVES

MASKINGS = ("token", "whole_word", "span")
INPUT_FORMATS = ("segment-pair", "sentence-pair", "full-sentences", "doc-sentences")
SIZES = ("bert-tiny", "bert-mini", "bert-small", "bert-medium", "bert-base", "bert-large")


@dataclass(frozen=True)
class Recipe:
    name: str
    objective: str             # one of objectives.OBJECTIVES
    masking: str               # token | whole_word | span
    dynamic: bool              # re-mask every epoch (RoBERTa) vs masks fixed at preparation (BERT, dupe_factor)
    input_format: str          # segment-pair | sentence-pair | full-sentences | doc-sentences
    tokenizer_kind: str        # wordpiece | bpe | unigram
    model_type: str            # bert | roberta | albert | electra
    dupe_factor: int = 1       # static masking: how many differently-masked copies of the data
    mask_prob: float = 0.15
    embedding_size: int | None = None  # ALBERT's factorised E
    share_layers: str = "none"
    lr: float = 1e-3           # for the small default models; bert-base-sized runs want ~1e-4

    def with_(self, **changes) -> "Recipe":
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def validate(self) -> "Recipe":
        if self.objective not in OBJECTIVES:
            raise BertforgeError(f"--objective: unknown {self.objective!r} (choose from {', '.join(OBJECTIVES)})")
        if self.masking not in MASKINGS:
            raise BertforgeError(f"--masking: unknown {self.masking!r} (choose from {', '.join(MASKINGS)})")
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
        """Encoder config: the size's shape, this recipe's family switches, positions enough for seq_len."""
        if size not in SIZES:
            raise BertforgeError(f"--size: unknown {size!r} (choose from {', '.join(SIZES)})")
        extra: dict = dict(vocab_size=vocab_size, pad_token_id=pad_token_id, model_type=self.model_type,
                           max_position_embeddings=max(512, seq_len))
        if self.model_type == "roberta":
            extra.update(max_position_embeddings=max(512, seq_len) + pad_token_id + 1, type_vocab_size=1,
                         layer_norm_eps=1e-5)
        if self.model_type == "albert":
            extra.update(embedding_size=self.embedding_size or 128, share_layers=self.share_layers,
                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        if self.model_type == "electra":
            extra.update(use_pooler=False, embedding_size=self.embedding_size)
        return preset(size, **extra)


RECIPES: dict[str, Recipe] = {
    # Devlin et al. 2019: MLM + NSP on segment pairs, masks fixed at preparation time (dupe_factor copies).
    "bert": Recipe("bert", "mlm+nsp", "token", dynamic=False, input_format="segment-pair",
                   tokenizer_kind="wordpiece", model_type="bert", dupe_factor=5),
    # Liu et al. 2019: no NSP, dynamic masking, contiguous full sentences, byte-level BPE.
    "roberta": Recipe("roberta", "mlm", "token", dynamic=True, input_format="full-sentences",
                      tokenizer_kind="bpe", model_type="roberta"),
    # Lan et al. 2020: sentence-order prediction, factorised embeddings (E=128), all layers shared, unigram.
    "albert": Recipe("albert", "mlm+sop", "token", dynamic=False, input_format="segment-pair",
                     tokenizer_kind="unigram", model_type="albert", dupe_factor=5, embedding_size=128,
                     share_layers="all"),
    # Joshi et al. 2020: span masking + span-boundary objective, single segments, no NSP.
    "spanbert": Recipe("spanbert", "span+sbo", "span", dynamic=True, input_format="full-sentences",
                       tokenizer_kind="wordpiece", model_type="bert"),
    # Clark et al. 2020: replaced-token detection with a 1/4-size generator.
    "electra": Recipe("electra", "electra", "token", dynamic=True, input_format="full-sentences",
                      tokenizer_kind="wordpiece", model_type="electra", lr=2e-3),
}


def resolve(name: str, **overrides) -> Recipe:
    """The named recipe with flag overrides (None = keep the recipe's value), validated."""
    if name not in RECIPES:
        raise BertforgeError(f"--recipe: unknown {name!r} (choose from {', '.join(RECIPES)})")
    recipe = RECIPES[name].with_(**overrides)
    if overrides.get("objective") == "span+sbo" and overrides.get("masking") is None:
        recipe = recipe.with_(masking="span")
    return recipe.validate()
