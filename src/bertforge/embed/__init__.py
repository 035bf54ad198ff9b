"""Sentence embeddings: a sentence-transformers-style bi-encoder, losses, fast encoding, evaluation and search.

Its names are imported on first use: `bertforge.embed` is also the public `embed` function's name, and importing
the package (as `from bertforge import embed` does) must not load torch."""

__all__ = ["Dense", "Normalize", "Pooling", "SentenceEncoder", "Transformer"]


def __getattr__(name: str):
    if name in __all__:
        from bertforge.embed import modules

        return getattr(modules, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
