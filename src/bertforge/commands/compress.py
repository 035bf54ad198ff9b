"""`bertforge quantize` and `bertforge export`: dynamic int8 and ONNX."""
from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    pass
