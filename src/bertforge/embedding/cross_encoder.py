"""Cross-encoder: score a (query, passage) pair jointly; used to re-rank a bi-encoder's top-k.

It is the fine-tuning `SequenceClassifier` (same layout, initialisation and loss) plus a tokenizer and the
re-ranking API. For BERT that is Hugging Face's BertForSequenceClassification (encoder `bert`, `classifier` on the
pooled [CLS] output), so its checkpoints load in transformers and the other way round. With num_labels = 1 the
logit is the relevance score (higher = more relevant; no sigmoid, which would not change the order) and the
training loss is MSE. Re-ranking (`relevance`) also takes a 2-label model (many published rerankers, or a
classifier given by mistake): its positive-class logit (label 1) is the score; other label counts are refused.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from bertforge.model.checkpoint import load_pretrained
from bertforge.config import ModelConfig
from bertforge.config.positions import fit_length
from bertforge.errors import BertforgeError
from bertforge.families import ENCODER
from bertforge.model.folder import ModelFolder
from bertforge.tasks.models import SequenceClassifier, encoder_config, save_task_model
from bertforge.tokenization import Tokenizer
from bertforge.device import INFERENCE_PRECISIONS, autocast, check_precision


class CrossEncoder(SequenceClassifier):
    def __init__(self, cfg: ModelConfig, tokenizer: Tokenizer | None = None, num_labels: int = 1,
                 max_length: int = 512):
        kind = "regress" if num_labels == 1 else "classify"
        super().__init__(encoder_config(cfg, kind), num_labels, regression=kind == "regress")
        self.tokenizer = tokenizer
        self.max_length = fit_length(max_length, cfg)
        self.source = "the cross-encoder"  # what errors call it: its folder, once loaded from one

    def check_relevance(self) -> None:
        """A relevance score needs 1 label (the score) or 2 (the positive class's logit): others in one line."""
        if self.num_labels not in (1, 2):
            raise BertforgeError(f"{self.source} has {self.num_labels} labels: a re-ranker gives one relevance "
                                 "score (1 label) or a no/yes pair (2 labels, label 1 the relevant class)")

    def relevance(self, queries: Sequence[str], passages: Sequence[str], batch_size: int = 32,
                  precision: str = "fp32") -> np.ndarray:
        """One relevance score per pair [N]: the logit of a 1-label model, the label-1 logit of a 2-label one."""
        self.check_relevance()
        scores = self.predict(queries, passages, batch_size, precision)
        return scores if self.num_labels == 1 else scores[:, 1]

    @torch.inference_mode()
    def predict(self, queries: Sequence[str], passages: Sequence[str], batch_size: int = 32,
                precision: str = "fp32") -> np.ndarray:
        """Scores [N] (num_labels = 1) or logits [N, num_labels] for the pairs (queries[i], passages[i]), on the
        model's device; precision fp32, or bf16 / fp16 autocast (fp16 on a GPU only)."""
        if self.tokenizer is None:
            raise BertforgeError("this cross-encoder has no tokenizer")
        if len(queries) != len(passages):
            raise BertforgeError(f"{len(queries)} queries for {len(passages)} passages")
        device = next(self.parameters()).device
        check_precision(precision, device, allowed=INFERENCE_PRECISIONS)
        self.eval()
        outs = []
        for s in range(0, len(queries), batch_size):
            batch = self.tokenizer(list(queries[s:s + batch_size]), pairs=list(passages[s:s + batch_size]),
                                   max_length=self.max_length, padding="longest", truncation=True)
            with autocast(device, precision):
                logits = self(**{k: v.to(device, non_blocking=True) for k, v in batch.items()})["logits"]
            outs.append(logits.float().cpu())
        logits = torch.cat(outs) if outs else torch.zeros(0, self.num_labels)
        return (logits.squeeze(-1) if self.num_labels == 1 else logits).numpy()

    @classmethod
    def from_pretrained(cls, path: "str | Path | ModelFolder", revision: str | None = None) -> "CrossEncoder":
        folder = ModelFolder.open(path, revision=revision)
        cfg = folder.config_for(ENCODER, verb="a cross-encoder")
        num_labels = int(cfg.extra.get("num_labels") or len(folder.labels or []) or 1)
        model = cls(cfg, folder.tokenizer(), num_labels)
        load_pretrained(model, folder.path, require=("classifier.",))
        model.source = str(path if isinstance(path, (str, Path)) else folder.path)
        return model.eval()

    def save_pretrained(self, path: str | Path) -> Path:
        """The fine-tuned-model layout (`bertforge predict` reads it too) with id2label LABEL_0..LABEL_{n-1}."""
        labels = [f"LABEL_{i}" for i in range(self.num_labels)]
        return save_task_model(self, path, labels, {"name": "cross-encoder", "max_seq_len": self.max_length},
                               tokenizer=self.tokenizer)
