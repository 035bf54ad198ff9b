"""Public entry point of the shared training loop (implementation in `bertforge.training`).

    from bertforge.train import Trainer, TrainConfig, ResumableLoader, distributed_context
"""

from bertforge.training import *  # noqa: F401,F403
from bertforge.training import __all__  # noqa: F401
