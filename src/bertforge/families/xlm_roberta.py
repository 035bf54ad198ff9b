"""XLM-RoBERTa (Conneau et al. 2020): RoBERTa's encoder and training recipe over 100 languages, with a
SentencePiece unigram vocabulary of 250,002 (<s> = 0, <pad> = 1, </s> = 2, <unk> = 3, the pieces, <mask> last).
Its checkpoints are RoBERTa's layout under `roberta.` with XLMRoberta class names, so everything but the names and
the tokenizer is RoBERTa's row."""
import dataclasses

from bertforge.families.roberta import FAMILY as ROBERTA

FAMILY = dataclasses.replace(
    ROBERTA, model_type="xlm-roberta", hf_prefix="XLMRoberta", vocab_size=250002,
    presets={"xlm-roberta-base": ("base", {}), "xlm-roberta-large": ("large", {})})
