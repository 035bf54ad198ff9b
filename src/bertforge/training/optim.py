"""AdamW with BERT's weight-decay groups, and the learning-rate schedules: warm-up + linear decay (BERT) and
warm-up + stable + 1-sqrt decay (ModernBERT)."""

from __future__ import annotations

import math

import torch
from torch import nn

from bertforge.training.config import TrainConfig


def no_decay(name: str, param: torch.Tensor) -> bool:
    """Biases, LayerNorm/norm weights and other vectors are not weight-decayed (BERT's recipe)."""
    lname = name.lower()
    return param.ndim < 2 or "layernorm" in lname or "layer_norm" in lname or "norm" in lname


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: decayed matrices, undecayed biases/norms. Frozen parameters are left out."""
    decay, skip = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (skip if no_decay(name, p) else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": skip, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """torch AdamW with the fused kernel on CUDA and CPU (one pass over each tensor instead of ~10; transformers'
    Trainer defaults to it too), torch's default elsewhere."""
    floats = all(p.is_floating_point() for p in model.parameters() if p.requires_grad)
    kwargs = {"fused": True} if device.type in ("cuda", "cpu") and floats else {}
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, **kwargs)


class WarmupLinearDecay:
    """LR multiplier: `step / warmup` during warm-up, then linear decay to 0 at `total` (the HF/BERT schedule).

    `step` is the number of optimizer steps already taken, so the first update uses factor 0 when warm-up > 0,
    exactly like `transformers.get_linear_schedule_with_warmup`. It is a callable object (not a lambda) so that
    `LambdaLR.state_dict()` stores its fields and a time-budget horizon survives resume.

    With a time budget and no step count, `total` is None until the trainer has measured a few steps; it then
    re-estimates `total = step + remaining_time / mean_step_time` after every step (`set_total`). Before the
    first estimate only warm-up applies; with `warmup_ratio` the warm-up length follows the current estimate.
    """

    def __init__(self, total: int | None, warmup_steps: int | None = None, warmup_ratio: float | None = None):
        self.total = total
        self.warmup_steps = warmup_steps
        self.warmup_ratio = warmup_ratio

    def set_total(self, total: int) -> None:
        self.total = max(int(total), 1)

    def warmup(self) -> int | None:
        if self.warmup_steps is not None:
            return self.warmup_steps
        if self.total is None:
            return None
        return int(self.warmup_ratio * self.total)  # type: ignore[operator]

    def __call__(self, step: int) -> float:
        warmup = self.warmup()
        if warmup is None:  # horizon not measured yet (first steps of a time-budget run): hold at the start
            return 0.0
        if step < warmup:
            return step / warmup
        if self.total is None:
            return 1.0
        return max(0.0, (self.total - step) / max(1, self.total - warmup))


class WarmupStableDecay(WarmupLinearDecay):
    """LR multiplier of the trapezoidal / warmup-stable-decay schedule ModernBERT trains with (Warner et al. 2024,
    after Xing et al. 2018; Zhai et al. 2022; Hu et al. 2024): linear warm-up, the peak rate held, then a
    1 - sqrt decay (Hägele et al. 2024, which ModernBERT uses) to 0 over the last `decay_ratio` of the horizon.

    The stable phase needs no horizon, so a time-budget run holds the peak until its step-time estimate places
    the decay; warm-up and horizon behave exactly as in `WarmupLinearDecay`.
    """

    def __init__(self, total: int | None, warmup_steps: int | None = None, warmup_ratio: float | None = None,
                 decay_ratio: float = 0.2):
        super().__init__(total, warmup_steps, warmup_ratio)
        self.decay_ratio = decay_ratio

    def __call__(self, step: int) -> float:
        warmup = self.warmup()
        if warmup is None:
            return 0.0
        if step < warmup:
            return step / warmup
        if self.total is None:
            return 1.0
        decay_start = max(warmup, self.total - int(math.ceil(self.decay_ratio * self.total)))
        if step < decay_start:
            return 1.0
        return max(0.0, 1.0 - math.sqrt((step - decay_start) / max(1, self.total - decay_start)))


def build_schedule(cfg: TrainConfig, total: int | None) -> WarmupLinearDecay:
    """The LR multiplier `cfg.schedule` names ("linear": BERT's warm-up + linear decay; "wsd": warm-up, stable,
    1-sqrt decay over the last `cfg.decay_ratio`)."""
    if cfg.schedule == "wsd":
        return WarmupStableDecay(total, cfg.warmup_steps, cfg.warmup_ratio, cfg.decay_ratio)
    return WarmupLinearDecay(total, cfg.warmup_steps, cfg.warmup_ratio)
