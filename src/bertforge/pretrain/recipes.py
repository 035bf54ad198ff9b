"""Pretraining recipes: named presets whose every ablation arm is one field (one CLI flag) away.

A `Recipe` fixes the objective, masking, input format, static vs dynamic masks, tokenizer kind and model family;
model size, sequence length, batch size and duration are separate. `resolve(name, **overrides)` applies flags.
Family settings (activation, dropout, positions, ...) come from `bertforge.families.FAMILIES`, shapes and default
learning rates from `bertforge.config.SIZES`; a recipe only names the knobs that are ablation arms.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from bertforge.config.sizes import SIZES
from bertforge.config import CAUSAL_ENCODERS, ModelConfig, compose
from bertforge.families import FAMILIES
from bertforge.families import SEQ2SEQ_FAMILIES
from bertforge.families.deberta_v2 import FAMILY as DEBERTA_V2
from bertforge.errors import BertforgeError
from bertforge.pretrain.objectives import (EMBEDDING_SHARING, LEFT_TO_RIGHT, OBJECTIVES, SENTENCE_OBJECTIVES,
                                           trains_rtd_as_itself)
from bertforge.pretrain.seq2seq import SEQ2SEQ_OBJECTIVES
from bertforge.training.optim import SCHEDULES

MASKINGS = ("token", "whole_word", "span")
INPUT_FORMATS = ("segment-pair", "sentence-pair", "full-sentences", "doc-sentences")
SIZE_NAMES = tuple(f"bert-{size}" for size in SIZES)  # --size names the BERT shape: bert-tiny ... bert-large


@dataclass(frozen=True)
class Recipe:
    name: str
    objective: str             # one of objectives.OBJECTIVES
    masking: str               # token | whole_word | span
    dynamic: bool              # re-mask every epoch (RoBERTa) vs masks fixed at preparation (BERT, dupe_factor)
    input_format: str          # segment-pair | sentence-pair | full-sentences | doc-sentences
    tokenizer_kind: str        # wordpiece | bpe | unigram
    model_type: str            # the family: a key of bertforge.families.FAMILIES
    dupe_factor: int = 1       # static masking: how many differently-masked copies of the data
    mask_prob: float = 0.15
    embedding_size: int | None = None  # factorised E (ALBERT, ELECTRA); None: the family's
    share_layers: str | None = None    # cross-layer sharing; None: the family's
    lr_scale: float = 1.0      # x the size's default learning rate (ELECTRA trains at twice BERT's rate)
    plm_k: int = 6             # XLNet: predict the last 1/K of each factorisation order (K = 6, Yang et al. 2019)
    schedule: str = "linear"   # linear: warm-up + linear decay (BERT); wsd: warm-up, stable, 1-sqrt decay
    span_mean: float = 3.0     # T5: mean noise span length; BART: the Poisson mean of its span lengths
    embedding_sharing: str = "shared"  # RTD: what generator and discriminator share (none | shared | gdes)

    def with_(self, **changes) -> "Recipe":
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def validate(self) -> "Recipe":
        if self.model_type not in FAMILIES and self.model_type not in SEQ2SEQ_FAMILIES:
            raise BertforgeError(f"--family: unknown {self.model_type!r} (choose from "
                                 f"{', '.join([*FAMILIES, *SEQ2SEQ_FAMILIES])})")
        if self.embedding_sharing not in EMBEDDING_SHARING:
            raise BertforgeError(f"--embedding-sharing: unknown {self.embedding_sharing!r} "
                                 f"(choose from {', '.join(EMBEDDING_SHARING)})")
        if self.objective not in OBJECTIVES + tuple(SEQ2SEQ_OBJECTIVES):
            raise BertforgeError(f"--objective: unknown {self.objective!r} "
                                 f"(choose from {', '.join(OBJECTIVES + tuple(SEQ2SEQ_OBJECTIVES))})")
        if self.masking not in MASKINGS:
            raise BertforgeError(f"--masking: unknown {self.masking!r} (choose from {', '.join(MASKINGS)})")
        if not 0.0 < self.mask_prob < 1.0:
            raise BertforgeError(f"--mask-prob: must be between 0 and 1, got {self.mask_prob}")
        if self.schedule not in SCHEDULES:
            raise BertforgeError(f"--schedule: unknown {self.schedule!r} (choose from {', '.join(SCHEDULES)})")
        if self.input_format not in INPUT_FORMATS:
            raise BertforgeError(f"--input-format: unknown {self.input_format!r} "
                                 f"(choose from {', '.join(INPUT_FORMATS)})")
        if (self.objective in SEQ2SEQ_OBJECTIVES) != (self.model_type in SEQ2SEQ_FAMILIES):
            raise BertforgeError(f"--objective {self.objective} with a {self.model_type} model: the denoising "
                                 f"objectives ({', '.join(SEQ2SEQ_OBJECTIVES)}) train the encoder-decoders "
                                 f"(--recipe t5, bart), and only they do")
        if self.model_type in SEQ2SEQ_FAMILIES:
            # the example shape is the noise's (data.seq2seq): t5 packs across documents, bart keeps to one
            want = {"t5": "span-corruption", "bart": "denoising"}[self.model_type]
            if self.objective != want:
                raise BertforgeError(f"--objective {self.objective}: a {self.model_type} model trains {want}")
            if self.span_mean < 1.0:
                raise BertforgeError(f"the mean noise span length must be at least 1, got {self.span_mean}")
            return self
        if self.objective in SENTENCE_OBJECTIVES and self.input_format not in ("segment-pair", "sentence-pair"):
            raise BertforgeError(f"--objective {self.objective} needs sentence pairs: use --input-format "
                                 f"segment-pair{'' if self.sentence_task == 'sso' else ' or sentence-pair'} "
                                 f"(got {self.input_format})")
        if self.sentence_task == "sso" and self.input_format != "segment-pair":
            raise BertforgeError(f"--objective {self.objective} needs --input-format segment-pair (next / previous "
                                 f"segments of one document; got {self.input_format})")
        if self.objective == "span+sbo" and self.masking != "span":
            raise BertforgeError("--objective span+sbo needs --masking span (the SBO head predicts span tokens)")
        if self.objective in SENTENCE_OBJECTIVES and self.model_type not in ("bert", "albert"):
            raise BertforgeError(f"--objective {self.objective}: a {self.model_type} model has no pooler for "
                                 f"the sentence head; use a bert or albert recipe")
        if (self.objective == "plm") != (self.model_type == "xlnet"):
            raise BertforgeError(f"--objective {self.objective} with a {self.model_type} model: permutation LM "
                                 f"(plm) is what an XLNet model trains, and all it trains; use --recipe xlnet")
        if self.objective == "plm" and self.masking != "token":
            raise BertforgeError(f"--masking {self.masking} does not apply to --objective plm (XLNet predicts the "
                                 f"last 1/K of a factorisation order, set by --plm-k)")
        if self.plm_k < 1:
            raise BertforgeError(f"--plm-k must be at least 1, got {self.plm_k}")
        if (self.objective == "clm") != FAMILIES[self.model_type].decoder:
            raise BertforgeError(f"--objective {self.objective} with a {self.model_type} model: the causal LM "
                                 f"objective (clm) and the decoder (--recipe gpt) go together")
        if self.objective == "ltr" and self.model_type not in CAUSAL_ENCODERS:
            raise BertforgeError(f"--objective ltr (a left-to-right encoder) needs a {', '.join(CAUSAL_ENCODERS)} "
                                 f"model, not {self.model_type}")
        if self.objective in LEFT_TO_RIGHT and self.input_format not in ("full-sentences", "doc-sentences"):
            raise BertforgeError(f"--objective {self.objective} reads single packed sequences: use --input-format "
                                 f"full-sentences or doc-sentences (got {self.input_format})")
        return self

    @property
    def tokenizer_layout(self):
        """The family's own SentencePiece layout (`Family.tokenizer`: DeBERTa-v3's, XLM-R's) when the recipe trains
        a unigram tokenizer for such a family, else None (the kind's own layout)."""
        family = FAMILIES.get(self.model_type)
        return family.tokenizer if family is not None and self.tokenizer_kind == "unigram" else None

    @property
    def sentence_task(self) -> str | None:
        """What `sentence_label` means in the batches: "nsp", "sop", "sso" (StructBERT) or None."""
        return {"mlm+nsp": "nsp", "mlm+sop": "sop", "mlm+sso": "sso", "structbert": "sso"}.get(self.objective)

    def model_config(self, size: str, vocab_size: int, pad_token_id: int, seq_len: int) -> ModelConfig:
        """Model config: the size's shape x the recipe's family, the tokenizer's vocabulary and padding id, this
        recipe's ablation knobs, and positions enough for seq_len (encoders: at least the 512 of the published
        models, for fine-tuning on longer inputs; a decoder's context is what it trained on, as GPT-2's is)."""
        if self.model_type in SEQ2SEQ_FAMILIES:
            raise BertforgeError(f"--recipe {self.name}: an encoder-decoder's config is pretrain.seq2seq.model_config")
        knobs = {k: v for k, v in (("embedding_size", self.embedding_size), ("share_layers", self.share_layers))
                 if v is not None}
        cfg = compose(self.model_type, shape_name(size), vocab_size=vocab_size, pad_token_id=pad_token_id, **knobs)
        if cfg.is_decoder:
            return cfg.replace(max_position_embeddings=seq_len)
        return cfg.replace(max_position_embeddings=max(512, seq_len) + cfg.position_offset)

    def default_lr(self, size: str) -> float:
        """Peak learning rate when --lr is not given: the size's (see config.Size) times the recipe's scale."""
        return SIZES[shape_name(size)].pretrain_lr * self.lr_scale


def shape_name(size: str) -> str:
    """"bert-base" (a --size choice) -> "base" (a key of config.SIZES)."""
    if size not in SIZE_NAMES:
        raise BertforgeError(f"--size: unknown {size!r} (choose from {', '.join(SIZE_NAMES)})")
    return size.removeprefix("bert-")


def size_of(cfg: ModelConfig) -> str:
    """The --size name whose shape best describes cfg (a --init-from checkpoint): the smallest size at least as
    wide and as deep, else the largest. Its defaults are the conservative choice for a model between sizes."""
    by_cost = sorted(SIZES.items(), key=lambda kv: kv[1].layers * kv[1].hidden ** 2)  # the table is not in order
    for name, shape in by_cost:
        layers = getattr(cfg, "num_hidden_layers", None) or max(cfg.encoder_layers, cfg.decoder_layers)  # (T5 / BART)
        if shape.hidden >= cfg.hidden_size and shape.layers >= layers:
            return f"bert-{name}"
    return f"bert-{by_cost[-1][0]}"


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
    # He et al. 2023 (DeBERTa-v3): ELECTRA's replaced-token detection on a DeBERTa encoder (relative attention, no
    # absolute positions), a generator of the same width and half the depth, gradient-disentangled embedding
    # sharing, a SentencePiece (Unigram) vocabulary in DeBERTa's layout; ELECTRA's rate and RTD weight (50).
    "deberta-v3": Recipe("deberta-v3", "electra", "token", dynamic=True, input_format="full-sentences",
                         tokenizer_kind="unigram", model_type=DEBERTA_V2.model_type, lr_scale=2.0,
                         embedding_sharing="gdes"),
    # Wang et al. 2020: BERT's setup with NSP replaced by the three-way sentence-structural task and the
    # word-structural one (5% of trigrams shuffled) added to MLM.
    "structbert": Recipe("structbert", "structbert", "token", dynamic=False, input_format="segment-pair",
                         tokenizer_kind="wordpiece", model_type="bert", dupe_factor=5),
    # Yang et al. 2019: permutation LM with two-stream relative attention, the last 1/6 of each order predicted,
    # dynamic orders over contiguous text, SentencePiece (Unigram).
    "xlnet": Recipe("xlnet", "plm", "token", dynamic=True, input_format="full-sentences",
                    tokenizer_kind="unigram", model_type="xlnet"),
    # Radford et al. 2019: a left-to-right LM on contiguous text packed to the context length, documents separated
    # by <|endoftext|>, byte-level BPE. (masking and dynamic are unused: nothing is masked.)
    "gpt": Recipe("gpt", "clm", "token", dynamic=True, input_format="full-sentences", tokenizer_kind="gpt2",
                  model_type="gpt2"),
    # Warner et al. 2024 (ModernBERT): MLM only, no NSP, 30% masking, dynamic masks, rows packed with contiguous
    # text so no row carries padding (ModernBERT unpads; full-sentences rows are full by construction), BPE, the
    # modernbert family (pre-norm, RoPE, GeGLU, no biases, local/global attention), the warm-up / stable /
    # 1-sqrt-decay schedule. Pre-norm stays stable at rates that make post-LN BERT collapse (see `lr_scale`).
    "modern": Recipe("modern", "mlm", "token", dynamic=True, input_format="full-sentences", tokenizer_kind="bpe",
                     model_type="modernbert", mask_prob=0.3, lr_scale=2.0, schedule="wsd"),
    # Raffel et al. 2020: span corruption (15% noise in spans of mean length 3, each span one sentinel; the target
    # is the sentinels and the spans), text packed across documents, SentencePiece Unigram with 100 sentinels.
    "t5": Recipe("t5", "span-corruption", "token", dynamic=True, input_format="full-sentences", tokenizer_kind="t5",
                 model_type="t5", mask_prob=0.15, span_mean=3.0),
    # Lewis et al. 2020: text infilling (30% of the tokens in Poisson(3) spans, each span one <mask>) after
    # sentence permutation, the target the original text; GPT-2's byte-level BPE with RoBERTa's specials.
    "bart": Recipe("bart", "denoising", "token", dynamic=True, input_format="doc-sentences", tokenizer_kind="bpe",
                   model_type="bart", mask_prob=0.3, span_mean=3.0),
}


def resolve(name: str, **overrides) -> Recipe:
    """The named recipe with flag overrides (None = keep the recipe's value), validated. `model_type` (--family)
    swaps the recipe's family for another whose model can take its objective."""
    if name not in RECIPES:
        raise BertforgeError(f"--recipe: unknown {name!r} (choose from {', '.join(RECIPES)})")
    recipe = RECIPES[name].with_(**overrides)
    if overrides.get("embedding_sharing") is not None and recipe.objective != "electra":
        raise BertforgeError(f"--embedding-sharing is what replaced-token detection's generator and discriminator "
                             f"share; --recipe {name} trains {recipe.objective}")
    family = overrides.get("model_type")
    if family in FAMILIES and recipe.objective == "electra" and not trains_rtd_as_itself(FAMILIES[family]):
        able = ", ".join(name for name, fam in FAMILIES.items() if trains_rtd_as_itself(fam))
        raise BertforgeError(f"--family {family}: replaced-token detection trains ELECTRA's layout or a family "
                             f"whose positions are no learned table ({able}), not a {family} model")
    if overrides.get("objective") == "span+sbo" and overrides.get("masking") is None:
        recipe = recipe.with_(masking="span")
    return recipe.validate()
