"""Held-out pretraining metrics: MLM loss / accuracy / perplexity against the most-frequent-token baseline, the
objective's own numbers (NSP, SOP, SBO, RTD), and the check for a run stuck at the baseline. (The tokens trained on are
counted by the Trainer, over every segment of a resumed run.)"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from bertforge.pretraining.objectives import IGNORE

# A run is "stuck" when its held-out MLM accuracy is within STUCK_MARGIN of always predicting the most frequent
# token, after STUCK_AFTER_STEPS steps (well past any default warm-up of a short run): the collapse a too-high
# learning rate causes in larger models, or a run far too short to learn anything.
STUCK_MARGIN = 0.01
STUCK_AFTER_STEPS = 300


def token_frequencies(corpus, chunk: int = 1 << 24) -> np.ndarray:
    """Token counts over every shard (for the most-frequent-token baseline; the held-out share is negligible)."""
    counts = np.zeros(corpus.vocab_size, np.int64)
    for start in range(0, corpus.total_tokens, chunk):
        ids = np.asarray(corpus.tokens(start, min(start + chunk, corpus.total_tokens)), np.int64)
        counts += np.bincount(ids, minlength=corpus.vocab_size)
    return counts


def most_frequent_token(corpus) -> int:
    """The most frequent non-special token of `corpus`: what the baseline always predicts."""
    counts = token_frequencies(corpus)
    counts[list(corpus.special_ids)] = 0
    return int(counts.argmax())


@torch.no_grad()
def mlm_metrics(model: nn.Module, batches: list[dict], most_frequent: int, device: torch.device | None = None,
                precision: str = "fp32") -> dict[str, float]:
    """MLM accuracy / loss of `model.predict_masked` (any objective; ELECTRA's generator) at the masked positions
    of `batches`, and the accuracy of always predicting `most_frequent` there (the baseline)."""
    was_training = model.training
    model.eval()
    device = device or next(model.parameters()).device
    correct = total = base = 0
    loss_sum = 0.0
    for b in batches:
        b = {k: v.to(device) for k, v in b.items()}
        pos = b["mlm_labels"].ne(IGNORE)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model.predict_masked(b["input_ids"], b["attention_mask"], b.get("token_type_ids"), pos)
        logits = logits.float()
        targets = b["mlm_labels"][pos]
        correct += int(logits.argmax(-1).eq(targets).sum())
        base += int(targets.eq(most_frequent).sum())
        loss_sum += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
        total += int(targets.numel())
    model.train(was_training)
    loss = loss_sum / max(total, 1)
    return {"mlm_acc": correct / max(total, 1), "mlm_loss": loss, "mlm_ppl": math.exp(min(loss, 50)),
            "baseline_acc": base / max(total, 1), "masked_tokens": float(total)}


@torch.no_grad()
def evaluate(model: nn.Module, loader_batches: list[dict], most_frequent: int, device: torch.device,
             precision: str = "fp32") -> dict[str, float]:
    """Held-out metrics: the objective's own numbers (NSP/SOP, SBO, RTD accuracy) from its forward, and MLM
    loss/accuracy/baseline from `mlm_metrics` (the one place they are computed; ablation uses it too)."""
    was_training = model.training
    model.eval()
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for batch in loader_batches:
        batch = {k: v.to(device) for k, v in batch.items()}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = model(**batch)
        k = int(batch["mlm_labels"].ne(IGNORE).sum())
        for name, value in out.items():
            if not isinstance(value, torch.Tensor) or value.ndim or name.startswith("mlm") or name == "loss":
                continue
            w = k if name.startswith("sbo") else 1  # SBO numbers are per masked token; the rest per batch
            sums[name] = sums.get(name, 0.0) + float(value) * w
            weights[name] = weights.get(name, 0.0) + w
    model.train(was_training)
    res = {name: sums[name] / max(weights[name], 1e-9) for name in sums}
    res.pop("replaced_frac", None)
    res.update(mlm_metrics(model, loader_batches, most_frequent, device, precision))
    return res


def stuck_at_baseline(metrics: dict[str, float], step: int, after_steps: int = STUCK_AFTER_STEPS,
                      margin: float = STUCK_MARGIN) -> bool:
    """True when, after `after_steps` steps, held-out MLM accuracy is no better than the most-frequent-token
    baseline by more than `margin`: the model (nearly) always predicts that token."""
    if "mlm_acc" not in metrics or "baseline_acc" not in metrics or step < after_steps:
        return False
    return metrics["mlm_acc"] < metrics["baseline_acc"] + margin
