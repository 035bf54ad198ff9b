"""Small data: the frozen-head method and the near-chance check.

`--method frozen-head` fits a logistic regression (L2, scikit-learn's C=1 objective, full-batch L-BFGS in torch:
deterministic, no pickle) on the frozen pooled sentence embeddings of the training rows (the mean over real tokens
for a sentence-transformers model) and writes it as the classifier of an ordinary sequence-classification folder:
`predict` / `evaluate` read it like any fine-tuned model, and it is exactly what they compute (the encoder is the
pretrained one, the head is the regression's weights). With 64-1,000 labelled rows it is the strong, cheap
baseline (SetFit's paper, Tunstall et al. 2022, reports it close to full fine-tuning at that size).

`near_chance` compares a run's best evaluation with what a constant guess scores on the same labels (the majority
class, or a uniform guess over the labels), so a run that learned nothing says so in one line.
"""
from __future__ import annotations

import logging
import math
import warnings
from typing import Any

import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.tasks.batching import forward_rows

log = logging.getLogger(__name__)

CHANCE_MARGIN = 0.05  # a best accuracy within this of the constant guess counts as "learned nothing"


def fit_logistic(x: torch.Tensor, y: torch.Tensor, num_labels: int, c: float = 1.0,
                 max_iter: int = 500) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight [K, D], bias [K]) minimising sum(cross-entropy) + ||W||^2 / (2 C) (scikit-learn's
    LogisticRegression(C) with the multinomial loss; the bias unpenalised), by L-BFGS in float64."""
    x, y = x.double(), y.long()
    w = torch.zeros(num_labels, x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(num_labels, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=max_iter, tolerance_grad=1e-9, tolerance_change=1e-12,
                            history_size=20, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(x @ w.T + b, y, reduction="sum") + (w * w).sum() / (2 * c)
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return w.detach().float(), b.detach().float()


def pooled_features(model: nn.Module, rows: list[dict], pad_id: int, batch_size: int,
                    progress: bool = False) -> torch.Tensor:
    """What the classifier of `model` (a `SequenceClassifier`) reads, for each row: [N, H], fp32, eval mode."""
    head = model.classifier
    model.classifier = nn.Identity()  # logits become the pooled vector (dropout is off in eval mode)
    try:
        out = forward_rows(model, rows, pad_id, batch_size, ("logits",), desc="embed", progress=progress)
    finally:
        model.classifier = head
    return torch.stack([o["logits"] for o in out])


def fit_frozen_head(model: nn.Module, rows: list[dict], pad_id: int, batch_size: int,
                    progress: bool = False) -> None:
    """Set `model.classifier` to a logistic regression on the frozen pooled features of the training `rows`."""
    if not isinstance(getattr(model, "classifier", None), nn.Linear):
        raise BertforgeError("method frozen-head needs a model whose classifier is one linear layer on the pooled "
                             "sentence vector; this model family's head is another (use method finetune)")
    feats = pooled_features(model, rows, pad_id, batch_size, progress)
    labels = torch.stack([r["labels"] for r in rows]).long()
    w, b = fit_logistic(feats, labels, model.classifier.out_features)
    with torch.no_grad():
        model.classifier.weight.copy_(w)
        model.classifier.bias.copy_(b)


def chance_scores(gold: list[int], num_labels: int) -> dict[str, float]:
    """What a constant guess scores on `gold`: accuracy of the majority class (at least 1/K), and the macro-F1
    of always predicting the majority class."""
    if not gold:
        return {}
    counts = [gold.count(k) for k in range(num_labels)]
    top = max(counts)
    share = top / len(gold)
    f1_top = 2 * share / (1 + share)  # precision = share, recall = 1 for the class always predicted
    return {"accuracy": max(share, 1 / num_labels), "macro_f1": f1_top / num_labels}


def near_chance(best: dict[str, Any], chance: dict[str, float], margin: float = CHANCE_MARGIN) -> str | None:
    """One line when the best evaluation is within `margin` of the constant guess (by accuracy, or by macro-F1
    where there is no accuracy), else None."""
    for metric in ("accuracy", "macro_f1"):
        value, base = best.get(metric), chance.get(metric)
        if isinstance(value, (int, float)) and base is not None and not math.isnan(value):
            if value <= base + margin:
                return (f"the best {metric} {value:.3f} is within {margin} of a constant guess ({base:.3f}): the "
                        "model learned little from this data. Try more optimizer steps (--max-steps 300, or leave "
                        "--epochs unset: small data then trains for at least 200 steps), a higher --lr (1e-4), or, "
                        "for a few hundred rows, --method frozen-head")
            return None
    return None


def warn_near_chance(task: str, best: dict[str, Any], chance: dict[str, float]) -> str | None:
    """`near_chance`'s line as a log warning and a Python warning (the command line prints it once)."""
    message = near_chance(best, chance)
    if message:
        log.warning("%s: %s", task, message)
        warnings.warn(f"{task}: {message}", stacklevel=3)
    return message
