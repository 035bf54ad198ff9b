"""Distillation and compression. `student_from_teacher`: DistilBERT's initialisation from a BERT teacher."""
from bertforge.distill.init import student_from_teacher

__all__ = ["student_from_teacher"]
