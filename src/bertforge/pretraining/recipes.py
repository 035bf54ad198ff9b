"""Pretraining recipes: named presets whose every ablation arm is one field (one CLI flag) away.

A `Recipe` fixes the objective, masking, input format, static vs dynamic masks, tokenizer kind and model family;
model size, sequence length, batch size and duration are separate. `resolve(name, **overrides)` applies flags.
Each recipe is declared, as its paper's settings, by the family file it builds (`Family.recipes`); `RECIPES`
collects them. Family settings (activation, dropout, positions, ...) come from `bertforge.families.FAMILIES`,
shapes and default learning rates from `bertforge.config.SIZES`; a recipe only names the knobs that are ablation
arms.

The names each knob takes (objectives, maskings, input formats, sizes) are defined here and import no torch: the
command line's parser offers them as choices, and `bertforge pretrain --help` should not wait for torch.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from bertforge.config.sizes import SIZES
from bertforge.config import CAUSAL_ENCODERS, ModelConfig, compose
from bertforge.families import DECODER, DEFAULT_RECIPE, ENCODER_DECODER, FAMILIES, RTD_OBJECTIVE, SIZE_PREFIX
from bertforge.errors import BertforgeError
from bertforge.training.config import SCHEDULES

# objectives.build_objective builds each of these; pretraining.seq2seq trains the encoder-decoders' own
PLM = "plm"  # XLNet's permutation language modelling
ICT = "ict"  # the Inverse Cloze Task: a retriever's towers (pretraining.ict), not an objective module
REALM = "realm"  # retrieval-augmented MLM: a reader and a retriever's towers trained together (pretraining.realm)
OBJECTIVES = ("mlm", "mlm+nsp", "mlm+sop", "span+sbo", RTD_OBJECTIVE, "mlm+wso", "mlm+sso", "structbert", PLM,
              "clm", "ltr", ICT, REALM)
LEFT_TO_RIGHT = ("clm", "ltr")  # unmasked packed rows, next-token targets
SENTENCE_OBJECTIVES = ("mlm+nsp", "mlm+sop", "mlm+sso", "structbert")
# the encoder-decoders' objectives (pretraining.seq2seq maps each to its noise in data.seq2seq)
SEQ2SEQ_OBJECTIVES = ("span-corruption", "denoising")
# what replaced-token detection's generator and discriminator share (`--embedding-sharing`): nothing, the embedding
# module (ELECTRA's), or the tables as stop_gradient(generator's) + the discriminator's own (DeBERTa-v3's GDES)
EMBEDDING_SHARING = ("none", "shared", "gdes")
MASKINGS = ("token", "whole_word", "span")
INPUT_FORMATS = ("segment-pair", "sentence-pair", "full-sentences", "doc-sentences")
SIZE_NAMES = tuple(f"{SIZE_PREFIX}{size}" for size in SIZES)  # --size names the shape: bert-tiny ... bert-large


@dataclass(frozen=True)
class Recipe:
    name: str
    objective: str             # one of OBJECTIVES or SEQ2SEQ_OBJECTIVES
    masking: str               # token | whole_word | span
    dynamic: bool              # re-mask every epoch (RoBERTa) vs masks fixed at preparation (BERT, dupe_factor)
    input_format: str          # segment-pair | sentence-pair | full-sentences | doc-sentences
    tokenizer_kind: str        # wordpiece | bpe | unigram, or a family's own layout (gpt2, t5, deberta-v2, ...)
    model_type: str            # the family: a key of bertforge.families.FAMILIES (`--family`)
    dupe_factor: int = 1       # static masking: how many differently-masked copies of the data
    mask_prob: float = 0.15
    embedding_size: int | None = None  # factorised E (ALBERT, ELECTRA); None: the family's
    share_layers: str | None = None    # cross-layer sharing; None: the family's
    lr_scale: float = 1.0      # x the size's default learning rate (ELECTRA trains at twice BERT's rate)
    plm_k: int = 6             # XLNet: predict the last 1/K of each factorisation order (K = 6, Yang et al. 2019)
    schedule: str = "linear"   # linear: warm-up + linear decay (BERT); wsd: warm-up, stable, 1-sqrt decay
    span_mean: float = 3.0     # T5: mean noise span length; BART: the Poisson mean of its span lengths
    embedding_sharing: str = "shared"  # replaced-token detection: one of EMBEDDING_SHARING

    def with_(self, **changes) -> "Recipe":
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def validate(self) -> "Recipe":
        if self.model_type not in FAMILIES:
            raise BertforgeError(f"--family: unknown {self.model_type!r} (choose from {', '.join(FAMILIES)})")
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
        fam = FAMILIES[self.model_type]
        if (self.objective in SEQ2SEQ_OBJECTIVES) != (fam.stack == ENCODER_DECODER):
            raise BertforgeError(f"--objective {self.objective} with a {self.model_type} model: the denoising "
                                 f"objectives ({', '.join(SEQ2SEQ_OBJECTIVES)}) train the encoder-decoders "
                                 f"(--recipe {', '.join(_recipes_of(ENCODER_DECODER))}), and only they do")
        if fam.stack == ENCODER_DECODER:
            # the example shape is the noise's (data.seq2seq): span corruption packs across documents, BART's
            # infilling keeps to one; a family trains the objective of its own recipe
            want = fam.recipes[0]["objective"]
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
        if self.objective in SENTENCE_OBJECTIVES and "pretraining" not in fam.head_classes:
            with_pooler = [name for name, f in FAMILIES.items() if "pretraining" in f.head_classes]
            raise BertforgeError(f"--objective {self.objective}: a {self.model_type} model has no pooler for "
                                 f"the sentence head; use a {' or '.join(with_pooler)} recipe")
        if (self.objective == PLM) != (fam.streams == 2):
            raise BertforgeError(f"--objective {self.objective} with a {self.model_type} model: permutation LM "
                                 f"({PLM}) is what an XLNet model trains, and all it trains; use --recipe "
                                 f"{', '.join(name for name, r in RECIPES.items() if r.objective == PLM)}")
        if self.objective == PLM and self.masking != "token":
            raise BertforgeError(f"--masking {self.masking} does not apply to --objective plm (XLNet predicts the "
                                 f"last 1/K of a factorisation order, set by --plm-k)")
        if self.plm_k < 1:
            raise BertforgeError(f"--plm-k must be at least 1, got {self.plm_k}")
        if (self.objective == "clm") != (fam.stack == DECODER):
            raise BertforgeError(f"--objective {self.objective} with a {self.model_type} model: the causal LM "
                                 f"objective (clm) and the decoder (--recipe {', '.join(_recipes_of(DECODER))}) go "
                                 "together")
        if self.objective == "ltr" and self.model_type not in CAUSAL_ENCODERS:
            raise BertforgeError(f"--objective ltr (a left-to-right encoder) needs a {', '.join(CAUSAL_ENCODERS)} "
                                 f"model, not {self.model_type}")
        if self.objective in LEFT_TO_RIGHT and self.input_format not in ("full-sentences", "doc-sentences"):
            raise BertforgeError(f"--objective {self.objective} reads single packed sequences: use --input-format "
                                 f"full-sentences or doc-sentences (got {self.input_format})")
        return self

    @property
    def sentence_task(self) -> str | None:
        """What `sentence_label` means in the batches: "nsp", "sop", "sso" (StructBERT) or None."""
        return {"mlm+nsp": "nsp", "mlm+sop": "sop", "mlm+sso": "sso", "structbert": "sso"}.get(self.objective)

    def model_config(self, size: str, vocab_size: int, pad_token_id: int, seq_len: int) -> ModelConfig:
        """Model config: the size's shape x the recipe's family, the tokenizer's vocabulary and padding id, this
        recipe's ablation knobs, and positions enough for seq_len (encoders: at least the 512 of the published
        models, for fine-tuning on longer inputs; a decoder's context is what it trained on, as GPT-2's is)."""
        if FAMILIES[self.model_type].stack == ENCODER_DECODER:
            raise BertforgeError(f"--recipe {self.name}: an encoder-decoder's config is pretraining.seq2seq.model_config")
        knobs = {k: v for k, v in (("embedding_size", self.embedding_size), ("share_layers", self.share_layers))
                 if v is not None}
        cfg = compose(self.model_type, shape_name(size), vocab_size=vocab_size, pad_token_id=pad_token_id, **knobs)
        if cfg.stack == DECODER:
            return cfg.replace(max_position_embeddings=seq_len)
        return cfg.replace(max_position_embeddings=max(512, seq_len) + cfg.position_offset)

    def default_lr(self, size: str) -> float:
        """Peak learning rate when --lr is not given: the size's (see config.Size) times the recipe's scale."""
        return SIZES[shape_name(size)].pretrain_lr * self.lr_scale


def shape_name(size: str) -> str:
    """"bert-base" (a --size choice) -> "base" (a key of config.SIZES)."""
    if size not in SIZE_NAMES:
        raise BertforgeError(f"--size: unknown {size!r} (choose from {', '.join(SIZE_NAMES)})")
    return size.removeprefix(SIZE_PREFIX)


def size_of(cfg: ModelConfig) -> str:
    """The --size name whose shape best describes cfg (a --init-from checkpoint): the smallest size at least as
    wide and as deep, else the largest. Its defaults are the conservative choice for a model between sizes."""
    by_cost = sorted(SIZES.items(), key=lambda kv: kv[1].layers * kv[1].hidden ** 2)  # the table is not in order
    for name, shape in by_cost:
        layers = getattr(cfg, "num_hidden_layers", None) or max(cfg.encoder_layers, cfg.decoder_layers)  # (T5 / BART)
        if shape.hidden >= cfg.hidden_size and shape.layers >= layers:
            return f"{SIZE_PREFIX}{name}"
    return f"{SIZE_PREFIX}{by_cost[-1][0]}"


# Every family file's recipes (its papers' settings, `Family.recipes`), by name; the family is the file's.
RECIPES: dict[str, Recipe] = {recipe["name"]: Recipe(**recipe, model_type=fam.model_type)
                              for fam in FAMILIES.values() for recipe in fam.recipes}
DEFAULT = DEFAULT_RECIPE  # the recipe `bertforge pretrain` runs without --recipe


def _recipes_of(stack: str) -> list[str]:
    """The recipes that build a family of `stack`."""
    return [name for name, r in RECIPES.items() if FAMILIES[r.model_type].stack == stack]


def resolve(name: str, **overrides) -> Recipe:
    """The named recipe with flag overrides (None = keep the recipe's value), validated. `model_type` (--family)
    puts the recipe on another family whose model can take its objective; a family with a tokenizer layout of its
    own (XLM-R's, DeBERTa's) then gets its tokenizer trained in that layout where the recipe's is of the same kind."""
    if name not in RECIPES:
        raise BertforgeError(f"--recipe: unknown {name!r} (choose from {', '.join(RECIPES)})")
    recipe = RECIPES[name].with_(**overrides)
    if overrides.get("embedding_sharing") is not None and recipe.objective != RTD_OBJECTIVE:
        raise BertforgeError(f"--embedding-sharing is what replaced-token detection's generator and discriminator "
                             f"share; --recipe {name} trains {recipe.objective}")
    family = FAMILIES.get(overrides.get("model_type"))
    if family is not None:
        if recipe.objective == RTD_OBJECTIVE and "rtd" not in family.head_classes:
            able = ", ".join(n for n, fam in FAMILIES.items() if "rtd" in fam.head_classes)
            raise BertforgeError(f"--family {family.model_type}: replaced-token detection trains in a family's own "
                                 f"layout ({able}), not a {family.model_type} model")
        if family.tokenizer is not None and family.tokenizer.model == recipe.tokenizer_kind:
            recipe = recipe.with_(tokenizer_kind=family.model_type)
    if overrides.get("objective") == "span+sbo" and overrides.get("masking") is None:
        recipe = recipe.with_(masking="span")
    return recipe.validate()
