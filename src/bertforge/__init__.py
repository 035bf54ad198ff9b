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
import sys
import types

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
         "Tokenizer": "bertforge.tokenization", "SentenceEncoder": "bertforge.embed"}
__all__ = sorted((*_API, *_CORE, "ArgumentError"))

# Four verbs share their name with the package that implements them. Such a package, once imported, is also its
# verb: `bertforge.embed(model, texts)` calls `bertforge.api.embed`, and `bertforge.embed.SentenceEncoder` (and
# every import of the package and its modules) stays what it was.
_VERB_PACKAGES = ("embed", "distill", "pretrain", "serve")


class _VerbPackage(types.ModuleType):
    """A sub-package that is also callable: calling it runs the public API's function of the same name."""

    def __call__(self, *args, **kwargs):
        return getattr(importlib.import_module("bertforge.api"), self.__name__.rpartition(".")[2])(*args, **kwargs)


class _Bertforge(types.ModuleType):
    """This package's module: a verb's sub-package becomes a `_VerbPackage` as the import system sets it here."""

    def __setattr__(self, name: str, value) -> None:
        if name in _VERB_PACKAGES and type(value) is types.ModuleType:
            value.__class__ = _VerbPackage
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Bertforge


def __getattr__(name: str):
    # Lazy, so `import bertforge` (and the CLI's start-up) does not pay for torch until a model is needed.
    if name in _VERB_PACKAGES:  # its package imports nothing heavy; made a _VerbPackage as it is set here
        return importlib.import_module(f"{__name__}.{name}")
    if name in _API:
        return getattr(importlib.import_module("bertforge.api"), name)
    if name in _CORE:
        return getattr(importlib.import_module(_CORE[name]), name)
    if name == "ArgumentError":  # what a public function raises for a wrong argument (docs/api.md)
        return getattr(importlib.import_module("bertforge.errors"), name)
    raise AttributeError(f"module 'bertforge' has no attribute {name!r}")
