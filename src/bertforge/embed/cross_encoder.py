"""Cross-encoder: score a (query, passage) pair jointly; used to re-rank a bi-encoder's top-k.

The layout is Hugging Face's BertForSequenceClassification (encoder `bert`, `classifier` on the pooled [CLS]
output), so its checkpoints load in transformers and the other way round. With num_labels = 1 the logit is the
relevance score (higher = more relevant; no sigmoid, which would not change the order).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertforge.checkpoint import load_pretrained, save_pretrained
from bertforge.config import ModelConfig
from bertforge.errors import BertforgeError
from bertforge.model import Encoder
from bertforge.tokenization import Tokenizer


# Families whose *ForSequenceClassification puts `classifier` straight on the pooled output.
_ARCH = {"bert": "BertForSequenceClassification", "albert": "AlbertForSequenceClassification"}


class CrossEncoder(nn.Module):
    def __init__(self, cfg: ModelConfig, tokenizer: Tokenizer | None = None, num_labels: int = 1,
                 max_length: int = 512):
        super().__init__()
        if cfg.model_type not in _ARCH or not cfg.use_pooler:
            raise BertforgeError(f"a cross-encoder needs a BERT or ALBERT encoder with a pooler, "
                                 f"not {cfg.model_type!r}")
        self.config = cfg
        self.bert = Encoder(cfg)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.classifier = nn.Linear(cfg.hidden_size, num_labels)
        self.classifier.weight.data.normal_(0.0, cfg.initializer_range)
        self.classifier.bias.data.zero_()
        self.num_labels = num_labels
        self.tokenizer = tokenizer
        self.max_length = min(max_length, cfg.max_position_embeddings - cfg.position_offset)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> dict:
        pooled = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).pooler_output
        logits = self.classifier(self.dropout(pooled))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = (F.mse_loss(logits.squeeze(-1), labels.float()) if self.num_labels == 1
                           else F.cross_entropy(logits, labels.long()))
        return out

    @torch.inference_mode()
    def predict(self, queries: Sequence[str], passages: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Scores [N] (num_labels = 1) or logits [N, num_labels] for the pairs (queries[i], passages[i])."""
        if self.tokenizer is None:
            raise BertforgeError("this cross-encoder has no tokenizer")
        if len(queries) != len(passages):
            raise BertforgeError(f"{len(queries)} queries for {len(passages)} passages")
        self.eval()
        outs = []
        for s in range(0, len(queries), batch_size):
            batch = self.tokenizer(list(queries[s:s + batch_size]), pairs=list(passages[s:s + batch_size]),
                                   max_length=self.max_length, padding="longest", truncation=True)
            outs.append(self(**batch)["logits"].float())
        logits = torch.cat(outs) if outs else torch.zeros(0, self.num_labels)
        return (logits.squeeze(-1) if self.num_labels == 1 else logits).numpy()

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "CrossEncoder":
        path = Path(path)
        cfg = ModelConfig.from_file(path)
        num_labels = int(cfg.extra.get("num_labels") or len(cfg.extra.get("id2label") or {}) or 1)
        model = cls(cfg, Tokenizer.from_pretrained(path), num_labels)
        load_pretrained(model, path, require=("classifier.",))
        return model.eval()

    def save_pretrained(self, path: str | Path) -> Path:
        labels = {str(i): f"LABEL_{i}" for i in range(self.num_labels)}
        return save_pretrained(self, path, self.config, architecture=_ARCH[self.config.model_type],
                               tokenizer=self.tokenizer,
                               extra_config={"id2label": labels, "label2id": {v: int(k) for k, v in labels.items()}})
