"""The shared training loop; `bertforge.train` re-exports the public names."""

from bertforge.training.config import TrainConfig, parse_duration
from bertforge.training.distributed import distributed_context
from bertforge.training.loader import ResumableLoader, to_device
from bertforge.training.optim import WarmupLinearDecay, build_optimizer, no_decay, param_groups
from bertforge.training.state import default_load_fn, default_save_fn, load_trainer_state, set_seed
from bertforge.training.trainer import Trainer, count_tokens, resolve_device

__all__ = [
    "Trainer", "TrainConfig", "ResumableLoader", "parse_duration", "distributed_context", "to_device",
    "WarmupLinearDecay", "build_optimizer", "no_decay", "param_groups", "default_save_fn", "default_load_fn",
    "load_trainer_state", "set_seed", "count_tokens", "resolve_device",
]
