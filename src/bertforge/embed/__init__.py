"""Sentence embeddings: a sentence-transformers-style bi-encoder, losses, fast encoding, evaluation and search."""
from bertforge.embed.modules import Dense, Normalize, Pooling, SentenceEncoder, Transformer

__all__ = ["Dense", "Normalize", "Pooling", "SentenceEncoder", "Transformer"]
