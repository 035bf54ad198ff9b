"""The public Python API: one function (or class) per command-line verb, taking models as folders, Hugging Face
Hub ids or loaded objects and data as paths or in memory, returning results as objects. `bertforge.commands`
parses flags into these calls and prints their results; `bertforge` re-exports them (docs/api.md).

Its modules import no torch until a function runs, so `import bertforge` and the command line start fast.
"""
from bertforge.api.analysis import attention_maps, explain, head_importance, head_statistics, probe
from bertforge.api.compression import distill, export, prune, quantize
from bertforge.api.embeddings import (embed, evaluate_sentence_encoder, load_sentence_encoder,
                                      train_sentence_encoder)
from bertforge.api.index import Index
from bertforge.api.inputs import read_texts
from bertforge.api.models import TextStream, fill_mask, generate, info, longify
from bertforge.api.open_qa import evaluate_open_qa
from bertforge.api.pretraining import prepare, pretrain, train_tokenizer
from bertforge.api.results import (DistillResult, ExportResult, FinetuneResult, PretrainResult, PruneResult,
                                   QuantizeResult, SentenceEncoderResult, TrainResult)
from bertforge.api.serving import create_app, serve
from bertforge.api.retrieval import export_dpr, train_retriever
from bertforge.api.tasks import evaluate, finetune, predict
from bertforge.api.reading import ask
from bertforge.api.ablation import ablate

__all__ = ["DistillResult", "ExportResult", "FinetuneResult", "Index", "PretrainResult", "PruneResult",
           "QuantizeResult", "SentenceEncoderResult", "TextStream", "TrainResult", "attention_maps", "create_app", "distill", "embed",
           "evaluate", "evaluate_sentence_encoder", "explain", "export", "fill_mask", "finetune", "generate",
           "head_importance", "head_statistics", "info", "load_sentence_encoder", "longify", "predict", "prepare",
           "pretrain", "probe", "prune", "quantize", "read_texts", "serve", "train_sentence_encoder",
           "train_tokenizer", "evaluate_open_qa", "ask", "export_dpr", "train_retriever"]
__all__ += ["ablate"]
