"""The run-health checks of `bertforge pretrain`: the stuck-at-the-baseline detector, and learning rate / warm-up
defaults that follow the model size."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from bertforge.config import preset
from bertforge.pretraining.metrics import STUCK_AFTER_STEPS, mlm_metrics, stuck_at_baseline
from bertforge.pretraining.objectives import IGNORE
from bertforge.pretraining.options import PretrainOptions, schedule
from bertforge.pretraining.recipes import SIZE_NAMES, resolve, size_of
from bertforge.pretraining.report import stuck_warning

VOCAB, MOST_FREQUENT = 12, 5


class Always(nn.Module):
    """predict_masked -> logits peaked at one token (the collapsed model) or, with token=None, at the masked
    position's input id (an oracle: the batches below put the answer there)."""

    def __init__(self, token: int | None):
        super().__init__()
        self.token = token
        self.dummy = nn.Parameter(torch.zeros(1))

    def predict_masked(self, input_ids, attention_mask, token_type_ids, positions):
        ids = input_ids[positions] if self.token is None else torch.full((int(positions.sum()),), self.token)
        return nn.functional.one_hot(ids, VOCAB).float() * 10 + self.dummy


def batch() -> dict:
    # 10 masked targets, 3 of them the most frequent token: the baseline scores 3/10
    labels = torch.tensor([[5, 1, 2, 5, 3, IGNORE], [4, 5, 6, 7, 8, IGNORE]])
    ids = torch.where(labels.eq(IGNORE), 0, labels)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
            "mlm_labels": labels}


def test_a_model_that_always_predicts_the_most_frequent_token_is_stuck():
    collapsed = mlm_metrics(Always(MOST_FREQUENT), [batch()], MOST_FREQUENT)
    assert collapsed["mlm_acc"] == collapsed["baseline_acc"] == pytest.approx(0.3)
    assert stuck_at_baseline(collapsed, step=STUCK_AFTER_STEPS)
    assert not stuck_at_baseline(collapsed, step=STUCK_AFTER_STEPS - 1)  # too early to tell
    learned = mlm_metrics(Always(None), [batch()], MOST_FREQUENT)
    assert learned["mlm_acc"] == 1.0 and not stuck_at_baseline(learned, step=10 * STUCK_AFTER_STEPS)
    # within the margin above the baseline still counts as stuck; clearly above it does not
    assert stuck_at_baseline({"mlm_acc": 0.305, "baseline_acc": 0.3}, step=STUCK_AFTER_STEPS)
    assert not stuck_at_baseline({"mlm_acc": 0.33, "baseline_acc": 0.3}, step=STUCK_AFTER_STEPS)
    assert not stuck_at_baseline({"rtd_acc": 0.5}, step=10 * STUCK_AFTER_STEPS)  # no MLM numbers: no verdict


def test_stuck_warning_is_one_line_naming_the_likely_cause():
    m = {"mlm_acc": 0.061, "baseline_acc": 0.061}
    high = stuck_warning(m, 1581, lr=5e-4, default_lr=1e-4, size="bert-base")
    assert "\n" not in high and "1581 steps" in high and "0.061" in high
    assert "lr 0.0005 is too high for bert-base (its default is 0.0001)" in high
    low = stuck_warning(m, 400, lr=1e-4, default_lr=1e-4, size="bert-base")
    assert "\n" not in low and "too few steps" in low


def test_default_lr_and_warmup_follow_the_size():
    roberta = resolve("roberta")
    lrs = [roberta.default_lr(size) for size in SIZE_NAMES]
    assert lrs == [1e-3, 1e-3, 5e-4, 3e-4, 1e-4, 1e-4, 7e-4]  # bert-tiny ... bert-large, bert-l6-h384 (GPT-small)
    assert resolve("electra").default_lr("bert-base") == pytest.approx(2e-4)  # ELECTRA: twice BERT's rate
    opts = PretrainOptions(recipe=roberta, out="x", size="bert-base")
    base = preset("bert-base")
    assert schedule(opts, base) == (1e-4, 0.1, "bert-base")
    opts.size = "bert-tiny"
    assert schedule(opts, preset("bert-tiny"))[:2] == (1e-3, 0.06)
    opts.size, opts.lr, opts.warmup_ratio = "bert-large", 5e-4, 0.02  # explicit values always win
    assert schedule(opts, preset("bert-large"))[:2] == (5e-4, 0.02)
    large = schedule(PretrainOptions(recipe=roberta, out="x", size="bert-large"), preset("bert-large"))
    assert large[1] > 0.1  # deeper model, longer warm-up


def test_a_continued_checkpoint_is_sized_by_its_own_shape():
    assert size_of(preset("bert-base")) == "bert-base" and size_of(preset("bert-mini")) == "bert-mini"
    assert size_of(preset("distilbert-base")) == "bert-base"
    assert size_of(preset("electra-small")) == "bert-base"  # 12 layers deep: the conservative rate
    assert size_of(preset("bert-large", num_hidden_layers=48)) == "bert-large"
    opts = PretrainOptions(recipe=resolve("roberta"), out="x", size="bert-tiny", init_from="ckpt")
    assert schedule(opts, preset("roberta-base")) == (1e-4, 0.1, "bert-base")  # not bert-tiny's 1e-3
