"""Pretraining data: corpus reading, memory-mapped token shards, example builders, masking, dataset.

torch is imported only by `bertforge.data.dataset` (loaded on first use of PretrainingDataset / collate), so that
corpus preparation and its worker processes stay light.
"""
from bertforge.data.corpus import Document, find_files, iter_documents, iter_texts, split_sentences
from bertforge.data.examples import BUILDERS, ExampleBuilder, ExamplePlan, make_builder
from bertforge.data.masking import IGNORE_INDEX, Masker, mask_rng
from bertforge.data.permutation import PermutationSampler
from bertforge.data.shards import ShardedCorpus, prepare_corpus
from bertforge.data.structure import WordShuffle

_LAZY = {"PretrainingDataset", "Collator", "LMCollator", "collate"}

__all__ = ["Document", "find_files", "iter_documents", "iter_texts", "split_sentences", "BUILDERS",
           "ExampleBuilder", "ExamplePlan", "make_builder", "IGNORE_INDEX", "Masker", "mask_rng", "PermutationSampler",
           "ShardedCorpus", "WordShuffle", "prepare_corpus", *sorted(_LAZY)]


def __getattr__(name: str):
    if name in _LAZY:
        from bertforge.data import dataset

        return getattr(dataset, name)
    raise AttributeError(f"module 'bertforge.data' has no attribute {name!r}")
