"""bertforge's dropout: torch's distribution and scaling from uniform draws on the CPU, torch's own masks on request,
and attention dropout drawn the same way."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from bertforge.model.attention import attend
from bertforge.model.dropout import Dropout, dropout, torch_masks, uniform_masks


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_keeps_one_minus_p_and_scales_the_kept(p):
    torch.manual_seed(0)
    x = torch.ones(400, 500)
    y = dropout(x, p)
    kept = y != 0
    n = x.numel()
    # binomial: 5 standard deviations either side of n (1 - p)
    assert abs(int(kept.sum()) - n * (1 - p)) < 5 * math.sqrt(n * p * (1 - p))
    torch.testing.assert_close(y[kept], torch.full((int(kept.sum()),), 1 / (1 - p)))
    assert abs(float(y.mean()) - 1.0) < 0.01  # the expectation is kept


def test_gradient_is_the_mask_times_the_scale_and_seeds_repeat():
    torch.manual_seed(3)
    x = torch.randn(64, 32, requires_grad=True)
    y = dropout(x, 0.25)
    y.sum().backward()
    torch.testing.assert_close(x.grad, (y != 0).float() / 0.75)
    torch.manual_seed(3)
    again = dropout(torch.randn(64, 32), 0.25)
    torch.testing.assert_close(again, y.detach())


def test_eval_zero_and_one():
    x = torch.randn(8, 8)
    assert dropout(x, 0.3, training=False) is x and dropout(x, 0.0) is x
    assert bool((dropout(x, 1.0) == 0).all())
    module = Dropout(0.3).eval()
    assert module(x) is x and isinstance(module, torch.nn.Dropout)


def test_bf16_input_keeps_its_dtype():
    x = torch.randn(16, 16, dtype=torch.bfloat16)
    assert dropout(x, 0.1).dtype == torch.bfloat16


def test_torch_masks_reproduces_torch_dropout_exactly():
    x = torch.randn(32, 64)
    torch.manual_seed(7)
    ref = F.dropout(x, 0.1, True)
    with torch_masks():
        assert not uniform_masks(x)
        torch.manual_seed(7)
        torch.testing.assert_close(Dropout(0.1)(x), ref, rtol=0, atol=0)
    assert uniform_masks(x)


def test_attention_dropout_on_cpu_is_the_eager_maths_with_the_same_mask():
    """attend(dropout_p > 0) on the CPU = softmax(q k^T / sqrt(d) + mask) with bertforge's mask, then @ v."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 10, 8) for _ in range(3))
    mask = torch.ones(2, 1, 1, 10, dtype=torch.bool)
    mask[1, ..., 7:] = False
    torch.manual_seed(11)
    ctx, _ = attend(q, k, v, mask, dropout_p=0.2)
    torch.manual_seed(11)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(~mask, torch.finfo(torch.float32).min)
    expect = dropout(scores.softmax(-1), 0.2) @ v
    torch.testing.assert_close(ctx, expect)
    # with torch's masks, SDPA's own dropout runs instead (and at p = 0 both are SDPA: identical)
    with torch_masks():
        torch.manual_seed(11)
        torch_ctx, _ = attend(q, k, v, mask, dropout_p=0.2)
    assert torch_ctx.shape == ctx.shape and not torch.equal(torch_ctx, ctx)
    torch.testing.assert_close(attend(q, k, v, mask)[0], F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
