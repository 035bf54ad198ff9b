"""`TrainConfig`: every knob of the shared training loop, validated once up front."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from bertforge.errors import BertforgeError

SCHEDULES = ("linear", "wsd")  # training.optim.build_schedule builds each

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(h|m|s)?", re.IGNORECASE)
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, None: 1.0}


def parse_duration(value: str | float | int) -> float:
    """Seconds from a number or a string such as "90s", "30m", "1h", "1h30m", "2.5h" (bare numbers are seconds)."""
    if isinstance(value, bool):
        raise BertforgeError(f"time_budget_s: expected a duration like '30m', got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip().replace(" ", "")
        pos, seconds = 0, 0.0
        while pos < len(text):
            m = _DURATION_PART.match(text, pos)
            if m is None or (m.group(2) is None and (pos != 0 or m.end() != len(text))):
                raise BertforgeError(f"time_budget_s: cannot parse duration {value!r} (use e.g. '90s', '30m', '1h30m')")
            seconds += float(m.group(1)) * _UNIT_SECONDS[m.group(2).lower() if m.group(2) else None]
            pos = m.end()
        if not text:
            raise BertforgeError("time_budget_s: empty duration")
    if not math.isfinite(seconds) or seconds <= 0:
        raise BertforgeError(f"time_budget_s: duration must be positive, got {value!r}")
    return seconds


@dataclass
class TrainConfig:
    """Configuration of `Trainer`.

    Length of training: give `max_steps` (optimizer steps), `num_epochs` (steps derived from `len(loader)`), or
    `time_budget_s` (wall clock, number or "30m"/"90s"/"1h"). A time budget combined with `max_steps`/`num_epochs`
    stops at whichever comes first and decays the learning rate over the step count; a time budget alone decays
    over a horizon re-estimated every step from the measured step time (see `WarmupLinearDecay`).
    """

    out_dir: str | Path
    lr: float = 1e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6  # BERT's AdamW epsilon
    warmup_steps: int | None = None
    warmup_ratio: float | None = None  # fraction of the horizon; 0.1 when neither warm-up field is given
    schedule: str = "linear"  # "linear": warm-up then linear decay; "wsd": warm-up, stable, 1-sqrt decay
    decay_ratio: float = 0.2  # "wsd": the share of the horizon spent decaying
    max_steps: int | None = None
    time_budget_s: float | str | None = None
    num_epochs: float | None = None
    grad_accum: int = 1
    max_grad_norm: float | None = 1.0
    precision: str = "fp32"  # "fp32" | "bf16" (autocast)
    log_every: int = 10
    eval_every: int | None = None  # None: evaluate only at the end (when eval_fn is given)
    save_every: int | None = None  # None: checkpoint only at the end
    keep_checkpoints: int | None = 2  # None keeps every checkpoint
    seed: int = 0
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N"
    compile: bool | None = None  # torch.compile the forward while training (None: on a GPU only; eager fallback)
    prefetch: int = 2  # batches prepared ahead in a background thread (0: in the loop, between steps)
    # processes making batches (a ResumableLoader's; same batches, same order for any number); None: a few on a
    # GPU, none (the thread) on the CPU, whose cores the model's step uses
    loader_workers: int | None = None
    progress: bool = True
    plot: bool = True
    resume: bool | str | Path = False  # True: out_dir/checkpoints/latest (fresh start if none); or a checkpoint dir
    overwrite: bool = True  # a fresh run into an out_dir holding checkpoints deletes them (False: raise instead)
    best_metric: str | None = None  # eval metric to track; the best model goes to out_dir/best/
    greater_is_better: bool = True
    load_best_at_end: bool = False  # reload out_dir/best/ into the model when training ends
    ddp_find_unused_parameters: bool = False
    report_to: tuple[str, ...] = ()  # trackers besides metrics.jsonl: "tensorboard", "mlflow" (training.reporting)
    logging_dir: str | Path | None = None  # TensorBoard's event folder (default: out_dir/runs)
    extra: dict = field(default_factory=dict)  # free-form, copied into trainer_state.pt for the record

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)
        if self.time_budget_s is not None:
            self.time_budget_s = parse_duration(self.time_budget_s)
        self.betas = tuple(float(b) for b in self.betas)  # type: ignore[assignment]
        self.report_to = tuple(self.report_to)
        if self.max_steps is None and self.num_epochs is None and self.time_budget_s is None:
            raise BertforgeError("TrainConfig: give max_steps, num_epochs or time_budget_s")
        if self.max_steps is not None and self.num_epochs is not None:
            raise BertforgeError("TrainConfig: give either max_steps or num_epochs, not both")
        _positive("max_steps", self.max_steps)
        _positive("num_epochs", self.num_epochs)
        _positive("grad_accum", self.grad_accum)
        _positive("log_every", self.log_every)
        _positive("eval_every", self.eval_every)
        _positive("save_every", self.save_every)
        _positive("keep_checkpoints", self.keep_checkpoints)
        if self.warmup_steps is not None and self.warmup_ratio is not None:
            raise BertforgeError("TrainConfig: give either warmup_steps or warmup_ratio, not both")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise BertforgeError(f"TrainConfig.warmup_steps: must be >= 0, got {self.warmup_steps}")
        if self.warmup_ratio is not None and not 0.0 <= self.warmup_ratio < 1.0:
            raise BertforgeError(f"TrainConfig.warmup_ratio: must be in [0, 1), got {self.warmup_ratio}")
        if self.warmup_steps is None and self.warmup_ratio is None:
            self.warmup_ratio = 0.1
        if self.schedule not in SCHEDULES:
            raise BertforgeError(f"TrainConfig.schedule: expected one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if not 0.0 < self.decay_ratio <= 1.0:
            raise BertforgeError(f"TrainConfig.decay_ratio: must be in (0, 1], got {self.decay_ratio}")
        if self.precision not in ("fp32", "bf16"):
            raise BertforgeError(f"TrainConfig.precision: expected 'fp32' or 'bf16', got {self.precision!r}")
        if isinstance(self.prefetch, bool) or self.prefetch < 0:
            raise BertforgeError(f"TrainConfig.prefetch: must be >= 0, got {self.prefetch!r}")
        if self.loader_workers is not None and (isinstance(self.loader_workers, bool) or self.loader_workers < 0):
            raise BertforgeError(f"TrainConfig.loader_workers: must be >= 0, got {self.loader_workers!r}")
        if self.lr <= 0:
            raise BertforgeError(f"TrainConfig.lr: must be > 0, got {self.lr}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise BertforgeError(f"TrainConfig.max_grad_norm: must be > 0 or None, got {self.max_grad_norm}")


def _positive(name: str, value: float | None) -> None:
    if value is not None and (isinstance(value, bool) or value <= 0):
        raise BertforgeError(f"TrainConfig.{name}: must be a positive number, got {value!r}")
