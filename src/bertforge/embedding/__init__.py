"""Sentence embeddings: a sentence-transformers-style bi-encoder, losses, fast encoding, evaluation and search.

Its names are imported on first use: importing the package must not load torch."""

__all__ = ["Dense", "Normalize", "Pooling", "SentenceEncoder", "Transformer"]


def __getattr__(name: str):
    if name in __all__:
        from bertforge.embedding import modules

        return getattr(modules, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
