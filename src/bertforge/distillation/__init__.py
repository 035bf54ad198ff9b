"""Distillation and compression. `student_from_teacher`: DistilBERT's initialisation from a BERT teacher.

Imported on first use: importing the package must not load torch."""

__all__ = ["student_from_teacher"]


def __getattr__(name: str):
    if name in __all__:
        from bertforge.distillation import init

        return getattr(init, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
