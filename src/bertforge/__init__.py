"""bertforge: the BERT family end to end (pretrain, fine-tune, embed, search) with HF-compatible checkpoints.

    import bertforge

    vectors = bertforge.embed("sentence-transformers/all-MiniLM-L6-v2", ["A man plays a guitar.", "A cat sleeps."])
    result = bertforge.finetune("path/to/bert", "train.csv", task="classify", out="runs/clf")
    bertforge.predict(result.out, [{"text": "a gripping film"}])

One function (or class) per command-line verb (`bertforge.api`, listed in docs/api.md), and the core classes. Every
name is imported on first use, so `import bertforge` (and the command line's start) loads no torch.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# The public API's names (bertforge.api.__all__; a test keeps the two the same) and the core classes' modules.
_API = ("DistillResult", "ExportResult", "FinetuneResult", "Index", "PretrainResult", "PruneResult", "QuantizeResult",
        "SentenceEncoderResult", "TextStream", "TrainResult", "attention_maps", "create_app", "distill", "embed",
        "evaluate", "evaluate_sentence_encoder", "explain", "export", "fill_mask", "finetune", "generate",
        "head_importance", "head_statistics", "info", "load_sentence_encoder", "longify", "predict", "prepare",
        "pretrain", "probe", "prune", "quantize", "read_texts", "serve", "train_sentence_encoder", "train_tokenizer",
        "evaluate_open_qa", "ask", "export_dpr", "train_retriever",
        "ablate")
_CORE = {"Encoder": "bertforge.model", "ModelConfig": "bertforge.config", "preset": "bertforge.config",
         "Tokenizer": "bertforge.tokenization", "SentenceEncoder": "bertforge.embedding"}
__all__ = sorted((*_API, *_CORE, "ArgumentError"))

def __getattr__(name: str):
    # Lazy, so `import bertforge` (and the CLI's start-up) does not pay for torch until a model is needed.
    if name in _API:
        return getattr(importlib.import_module("bertforge.api"), name)
    if name in _CORE:
        return getattr(importlib.import_module(_CORE[name]), name)
    if name == "ArgumentError":  # what a public function raises for a wrong argument (docs/api.md)
        return getattr(importlib.import_module("bertforge.errors"), name)
    raise AttributeError(f"module 'bertforge' has no attribute {name!r}")
