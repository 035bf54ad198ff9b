"""bertforge: the BERT family end to end (pretrain, fine-tune, embed, search) with HF-compatible checkpoints."""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["Encoder", "ModelConfig", "Tokenizer", "preset"]


def __getattr__(name: str):
    # Lazy, so `import bertforge` (and the CLI's start-up) does not pay for torch until a model is needed.
    if name == "Encoder":
        from bertforge.model import Encoder
        return Encoder
    if name in ("ModelConfig", "preset"):
        from bertforge import config
        return getattr(config, name)
    if name == "Tokenizer":
        from bertforge.tokenization import Tokenizer
        return Tokenizer
    raise AttributeError(f"module 'bertforge' has no attribute {name!r}")
