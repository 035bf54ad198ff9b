"""XLM-RoBERTa (Conneau et al. 2020): RoBERTa's encoder and training recipe over 100 languages, with a
SentencePiece unigram vocabulary of 250,002 (<s> = 0, <pad> = 1, </s> = 2, <unk> = 3, the pieces, <mask> last;
pairs as <s> A </s></s> B </s>, one segment). Its checkpoints are RoBERTa's layout under `roberta.` with
XLMRoberta class names, so everything but the names and the tokenizer is RoBERTa's row."""
import dataclasses
from typing import Any

from tokenizers import decoders, pre_tokenizers

from bertforge.families.family import TokenizerLayout
from bertforge.families.roberta import FAMILY as ROBERTA


def _tokenizer_pipeline(backend: Any, lowercase: bool) -> None:
    """transformers' XLMRobertaTokenizer (without a SentencePiece character map): split on whitespace, "▁" before
    every word; always cased."""
    backend.normalizer = None
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")])
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")


TOKENIZER = TokenizerLayout(
    tokenizer_class="XLMRobertaTokenizer",
    roles={"pad": "<pad>", "unk": "<unk>", "cls": "<s>", "sep": "</s>", "mask": "<mask>"},
    first=("<s>", "<pad>", "</s>", "<unk>"), last=("<mask>",), pair="double_separator",
    pipeline=_tokenizer_pipeline, cased=True)

FAMILY = dataclasses.replace(
    ROBERTA, model_type="xlm-roberta", hf_prefix="XLMRoberta", vocab_size=250002, tokenizer=TOKENIZER,
    presets={"xlm-roberta-base": ("base", {}), "xlm-roberta-large": ("large", {})})
