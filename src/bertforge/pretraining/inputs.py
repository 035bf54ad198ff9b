"""What a pretraining model is fed: the recipe's example builder, masking (or StructBERT's trigram shuffling, or
XLNet's factorisation orders) and static/dynamic masks over sharded corpora; the fixed held-out batches; and the
checks that a model can take the recipe's batches at all."""
from __future__ import annotations

from typing import Any, Callable

import torch

from bertforge.config import ModelConfig
from bertforge.data import LMCollator, Masker, PermutationSampler, PretrainingDataset, WordShuffle
from bertforge.errors import BertforgeError
from bertforge.families import DECODER
from bertforge.pretraining.recipes import LEFT_TO_RIGHT, PLM
from bertforge.pretraining.recipes import Recipe

PAIR_FORMATS = ("segment-pair", "sentence-pair")
HELDOUT_SEED = 12345  # held-out masks: the same task for every evaluation and every ablation arm

BUILDER_FOR = {  # (input format, sentence task) -> bertforge.data example builder
    ("segment-pair", "nsp"): "segment_pair", ("sentence-pair", "nsp"): "sentence_pair",
    ("segment-pair", "sop"): "sop", ("segment-pair", "sso"): "sentence_structure",
    ("segment-pair", None): "segment_pair", ("sentence-pair", None): "sentence_pair",
    ("full-sentences", None): "full_sentences", ("doc-sentences", None): "doc_sentences",
}


def builder_name(recipe: Recipe) -> str:
    key = (recipe.input_format, recipe.sentence_task)
    if key not in BUILDER_FOR:
        raise BertforgeError(f"--input-format {recipe.input_format} cannot make {recipe.sentence_task.upper()} "
                             f"examples (SOP and SSO need segment-pair)")
    return BUILDER_FOR[key]


def make_dataset(corpus, recipe: Recipe, seq_len: int, seed: int, static: bool | None = None,
                 dupe_factor: int | None = None) -> PretrainingDataset:
    """PretrainingDataset over `corpus` with the recipe's builder, masking mode and static/dynamic choice (a causal
    LM's: no masking; `collator_for` gives it its collator)."""
    if recipe.objective in LEFT_TO_RIGHT:
        return PretrainingDataset(corpus, builder_name(recipe), masker=None, seq_len=seq_len, masking="dynamic",
                                  seed=seed)
    static = (not recipe.dynamic) if static is None else static
    return PretrainingDataset(corpus, builder_name(recipe), make_masker(corpus, recipe), seq_len=seq_len,
                              masking="static" if static else "dynamic",
                              dupe_factor=(dupe_factor or recipe.dupe_factor) if static else 1, seed=seed)


def make_masker(corpus, recipe: Recipe):
    """What corrupts each example: MLM masking, + trigram shuffling (StructBERT's word-structural objective), or
    XLNet's factorisation orders instead of masks."""
    if recipe.objective == PLM:
        return PermutationSampler(corpus.vocab_size, corpus.special_ids, k=recipe.plm_k)
    masker = Masker(corpus.vocab_size, corpus.mask_id, corpus.special_ids, mlm_probability=recipe.mask_prob,
                    mode=recipe.masking)
    return WordShuffle(masker) if recipe.objective in ("mlm+wso", "structbert") else masker


def heldout_batches(corpus, recipe: Recipe, seq_len: int, batch_size: int, n_batches: int,
                    one_segment: bool = False) -> list[dict]:
    """Up to `n_batches` collated held-out batches, masked once with a fixed seed (static)."""
    ds = make_dataset(corpus, recipe, seq_len, seed=HELDOUT_SEED, static=True, dupe_factor=1)
    collate = collator_for(ds, recipe, one_segment)
    n = min(len(ds), n_batches * batch_size)
    return [collate([ds[i] for i in range(s, min(s + batch_size, n))]) for s in range(0, n, batch_size)]


def collator_for(ds: PretrainingDataset, recipe: Recipe, one_segment: bool = False) -> Callable[[list], dict]:
    """How the recipe's batches are made from `ds`'s examples (masking them when the masks are dynamic)."""
    if recipe.objective in LEFT_TO_RIGHT:
        return LMCollator(ds.corpus.pad_id)
    return SingleSegmentCollator(ds.collator()) if one_segment else ds.collator()


def single_segment(cfg: ModelConfig, recipe: Recipe) -> bool:
    """Pair inputs fed to an encoder whose family makes a pair one segment (`Family.single_segment`: RoBERTa's and
    XLM-R's type_vocab_size 1, ModernBERT's and DeBERTa-v3's none) use one segment id for both segments, as those
    models do; the separator between them still marks the boundary."""
    return recipe.input_format in PAIR_FORMATS and cfg.type_vocab_size < 2 and cfg.family.single_segment


def check_model_fits_recipe(cfg: ModelConfig, recipe: Recipe, source: str) -> None:
    """One clear line, before any training, for a model that cannot take the recipe's batches."""
    if (recipe.objective == PLM) != (cfg.family.streams == 2):
        raise BertforgeError(f"{source}: a {cfg.model_type} model cannot train --objective {recipe.objective} "
                             f"(XLNet models train the permutation LM, {PLM}, and only they do)")
    if (recipe.objective == "clm") != (cfg.stack == DECODER):
        raise BertforgeError(f"{source}: a {cfg.model_type} model cannot train --objective {recipe.objective} "
                             f"(a decoder trains the causal LM of --recipe gpt, an encoder the others)")
    if recipe.sentence_task is not None and not cfg.use_pooler:
        raise BertforgeError(f"{source}: a {cfg.model_type} model without a pooler cannot train "
                             f"{recipe.sentence_task.upper()} (use --objective mlm)")
    if recipe.input_format in PAIR_FORMATS and cfg.type_vocab_size < 2 and not single_segment(cfg, recipe):
        raise BertforgeError(f"{source}: --input-format {recipe.input_format} needs 2 token types, the "
                             f"{cfg.model_type} model has type_vocab_size {cfg.type_vocab_size} "
                             f"(use --input-format full-sentences or doc-sentences)")


class SingleSegmentCollator:
    """Wraps a collator so every token_type_id is 0 (see `single_segment`); set_epoch etc. pass through."""

    def __init__(self, collate: Callable[[list], dict]):
        self.collate = collate

    def __call__(self, items: list) -> dict:
        batch = self.collate(items)
        if "token_type_ids" in batch:
            batch["token_type_ids"] = torch.zeros_like(batch["token_type_ids"])
        return batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self.collate, name)
