"""Tokenizers through Hugging Face `tokenizers`: the one `Tokenizer` (`tokenizer.py`; kinds wordpiece, bpe,
unigram, gpt2, t5), their pipelines (`pipelines.py`) and deterministic training from texts (`train.py`).

`from bertforge.tokenization import Tokenizer` is the public import.
"""
from bertforge.tokenization.tokenizer import Tokenizer

__all__ = ["Tokenizer"]
