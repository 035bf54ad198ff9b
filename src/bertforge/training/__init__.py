"""The shared training loop: `from bertforge.training import Trainer, TrainConfig, ResumableLoader` (devices and
precisions are `bertforge.device`'s)."""

from bertforge.training.config import TrainConfig, parse_duration
from bertforge.training.distributed import distributed_context
from bertforge.training.loader import ResumableLoader, count_tokens
from bertforge.training.optim import (SCHEDULES, WarmupLinearDecay, WarmupStableDecay, build_optimizer,
                                      build_schedule, no_decay, param_groups)
from bertforge.training.state import default_load_fn, default_save_fn, load_trainer_state, set_seed
from bertforge.training.trainer import NonFiniteLoss, Trainer

__all__ = [
    "Trainer", "TrainConfig", "ResumableLoader", "parse_duration", "distributed_context", "WarmupLinearDecay",
    "WarmupStableDecay", "SCHEDULES", "build_schedule", "build_optimizer", "no_decay", "param_groups",
    "default_save_fn", "default_load_fn", "load_trainer_state", "set_seed", "count_tokens", "NonFiniteLoss",
]
