"""The shared training loop: `from bertforge.training import Trainer, TrainConfig, ResumableLoader`.

The names below load on first use: `bertforge.training.config` (TrainConfig's checks, the schedule names) is read
by the command line's parser, which should not wait for torch.
"""
from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "bertforge.training.config": ("TrainConfig", "parse_duration", "SCHEDULES"),
    "bertforge.training.distributed": ("distributed_context",),
    "bertforge.training.loader": ("ResumableLoader", "count_tokens"),
    "bertforge.training.optim": ("WarmupLinearDecay", "WarmupStableDecay", "build_optimizer", "build_schedule",
                                 "no_decay", "param_groups"),
    "bertforge.training.state": ("default_load_fn", "default_save_fn", "load_trainer_state", "set_seed"),
    "bertforge.training.trainer": ("NonFiniteLoss", "Trainer"),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}
__all__ = list(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'bertforge.training' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value  # once: later look-ups do not come here
    return value
