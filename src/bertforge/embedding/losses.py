"""Training objectives for bi-encoders (Sentence-BERT, Reimers & Gurevych 2019, and common practice).

Every loss is an `nn.Module` called as `loss(embeddings, labels)` where `embeddings` is a list with one [B, D]
tensor per text column (anchor, positive, ...), so the same training wrapper drives all of them.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.model.heads import task_loss
from bertforge.labels import NLI3_IDS

# One NLI label order for the whole toolkit (HF's MNLI/SNLI: entailment=0, neutral=1, contradiction=2), so an integer
# label means the same thing to `bertforge finetune` and to `bertforge embed train`.
NLI_LABELS = NLI3_IDS
ENTAILMENT = NLI3_IDS["entailment"]


class SoftmaxLoss(nn.Module):
    """Classifier over (u, v, |u - v|) with cross-entropy: SBERT's NLI objective (labels are class ids)."""

    columns = 2

    def __init__(self, dim: int, num_labels: int = 3):
        super().__init__()
        self.classifier = nn.Linear(3 * dim, num_labels)

    def logits(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.cat([u, v, (u - v).abs()], dim=-1))

    def forward(self, embeddings: Sequence[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        u, v = embeddings
        return task_loss(self.logits(u, v), labels)


class CosineSimilarityLoss(nn.Module):
    """MSE between cos(u, v) and a gold score already scaled to [0, 1] (STS scores / 5)."""

    columns = 2

    def forward(self, embeddings: Sequence[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        u, v = embeddings
        return F.mse_loss(F.cosine_similarity(u, v, dim=-1), labels.to(u.dtype))


class TripletLoss(nn.Module):
    """max(0, ||a - p|| - ||a - n|| + margin) with Euclidean distance, averaged over the batch."""

    columns = 3

    def __init__(self, margin: float = 1.0):
        super().__init__()
        self.margin = margin

    def forward(self, embeddings: Sequence[torch.Tensor], labels: torch.Tensor | None = None) -> torch.Tensor:
        a, p, n = embeddings
        return F.relu(F.pairwise_distance(a, p, eps=0) - F.pairwise_distance(a, n, eps=0) + self.margin).mean()


class MultipleNegativesRankingLoss(nn.Module):
    """In-batch negatives: anchor i must pick positive i among all positives (and hard negatives) of the batch.

    Cross-entropy over scale * cos(anchor_i, candidate_j); columns after the second are extra hard negatives.
    """

    columns = 2  # at least; more columns are hard negatives

    def __init__(self, scale: float = 20.0):
        super().__init__()
        self.scale = scale

    def forward(self, embeddings: Sequence[torch.Tensor], labels: torch.Tensor | None = None) -> torch.Tensor:
        anchors = F.normalize(embeddings[0], dim=-1)
        candidates = F.normalize(torch.cat(list(embeddings[1:]), dim=0), dim=-1)
        scores = self.scale * anchors @ candidates.T  # [B, B * (columns - 1)]
        return F.cross_entropy(scores, torch.arange(len(anchors), device=scores.device))


LOSSES = {"softmax": SoftmaxLoss, "cosine": CosineSimilarityLoss, "triplet": TripletLoss,
          "mnrl": MultipleNegativesRankingLoss}


def make_loss(name: str, dim: int, num_labels: int = 3) -> nn.Module:
    if name not in LOSSES:
        raise BertforgeError(f"unknown loss {name!r} (expected {', '.join(LOSSES)})")
    return SoftmaxLoss(dim, num_labels) if name == "softmax" else LOSSES[name]()
