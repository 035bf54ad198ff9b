"""`FinetuneConfig`: everything one fine-tuning (or evaluation) job needs, and the task names it accepts.

Standard library only, so the CLI can build its parser (the task choices) without importing torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.config.arguments import (COUNT, EPOCHS, FRACTION, NONNEG, POSITIVE, SEED, STEPS, check_args,
                                        maybe)
from bertforge.errors import BertforgeError

# task name -> kind (bertforge.tasks.kinds has one class per kind); GLUE-style names read with tasks.registry
TASK_KINDS = {"sst2": "classify", "cola": "classify", "mrpc": "classify", "stsb": "regress", "rte": "classify",
              "qnli": "classify", "mnli": "classify", "snli": "classify", "conll": "tag", "squad": "qa",
              "squad2": "qa", "swag": "choice", "classify": "classify", "regress": "regress", "tag": "tag",
              "qa": "qa", "choice": "choice", "seq2seq": "seq2seq"}
TASKS = tuple(TASK_KINDS)
FREEZE_KINDS = ("classify", "regress", "tag")  # what the feature-based mode (a head on frozen features) supports
# The bounds of the numeric fields, the command line's (`bertforge.config.arguments`): the parser's flags, the
# Python API and a config built in code meet the same check, here, once. A sequence length's upper bound is the
# model's positions (config.positions, checked with the model at hand; a saved config.json's value is named there).
FIELD_BOUNDS = {"epochs": maybe(EPOCHS), "max_steps": maybe(STEPS), "lr": maybe(POSITIVE), "batch_size": COUNT,
                "eval_batch_size": COUNT, "max_seq_len": maybe(COUNT), "warmup_ratio": FRACTION,
                "weight_decay": NONNEG, "seed": SEED, "runs": COUNT, "train_limit": maybe(COUNT),
                "eval_limit": maybe(COUNT), "doc_stride": COUNT, "max_query_length": COUNT, "max_target_len": COUNT,
                "num_beams": COUNT}


# How long a run trains when neither --epochs nor --max-steps is given: the BERT paper's 3 epochs, but at least
# MIN_STEPS optimizer steps, so that small data gets more epochs (200 rows at batch 32 make 7 steps an epoch: 3
# epochs are 21 steps, after which all-MiniLM-L6-v2 still predicts ~0.5 for every SST-2 sentence; 200 steps
# reach 0.77 accuracy on its dev set, above a logistic regression on the frozen sentence embeddings, 0.73).
# Such a run evaluates (and keeps a checkpoint) about MAX_EVALS times, every few epochs, rather than every epoch.
DEFAULT_EPOCHS = 3.0
MIN_STEPS = 200
MAX_EVALS = 10
METHODS = ("finetune", "frozen-head")  # how `finetune` trains (FinetuneConfig.method)


def default_max_len(kind: str) -> int:
    """Tokens per input when none is given: SQuAD's 384 (question + context window), an encoder-decoder's source
    512 (T5's), else BERT's 128."""
    return {"qa": 384, "seq2seq": 512}.get(kind, 128)


@dataclass
class FinetuneConfig:
    """Everything one fine-tuning job needs. `data` is a folder of splits, a hub dataset id (its configuration in
    `data_config`) or one file; `train` / `eval` name a split's source directly (any source
    `bertforge.io.tables.open_table` takes, data in memory too). Columns left None are found by their usual names
    (`bertforge.io.tables.pick_columns`)."""

    task: str
    model: str | Path
    out: str | Path
    data: Any = None
    train: Any = None
    eval: Any = None
    data_config: str | None = None
    epochs: float | None = None  # None: `plan_epochs` (3, or more on small data: at least MIN_STEPS steps)
    max_steps: int | None = None
    lr: float | None = None  # None: `default_lr` (the task's and the model family's usual rate)
    batch_size: int = 32
    eval_batch_size: int = 64
    max_seq_len: int | None = None  # None: 128, or 384 for SQuAD
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    seed: int = 42
    runs: int = 1
    freeze: bool = False
    features: str = "concat_last4"
    head: str = "linear"
    text_col: str | None = None
    text_pair_col: str | None = None
    label_col: str | None = None
    labels: tuple[str, ...] = ()  # tag tasks: entity types besides conll's own (--task tag: the only ones allowed)
    resume: bool = False
    precision: str | None = None  # None: training in `training_precision`, evaluation in fp32
    group_by_length: bool = True
    train_limit: int | None = None  # first N training examples (quick runs, benchmarks)
    eval_limit: int | None = None
    doc_stride: int = 128
    max_query_length: int = 64
    device: str = "auto"
    compile: bool | None = None  # torch.compile (training: None = on a GPU only; evaluation: when True)
    progress: bool = True
    report_to: tuple[str, ...] = ()  # trackers besides metrics.jsonl (TrainConfig.report_to)
    logging_dir: Path | None = None  # TensorBoard's event folder (default: each run's folder / runs)
    # seq2seq: the source / target columns, the target length, and the search that evaluation generates with
    source_col: str = "source"
    target_col: str = "target"
    max_target_len: int = 128
    num_beams: int = 1
    save_checkpoints: bool = True  # per-epoch trainer checkpoints (needed for --resume)
    # finetune: the whole model (the BERT paper's recipe); frozen-head: a logistic regression on the frozen mean-pooled
    # sentence embeddings (classification; few-shot data), saved as the same kind of model folder
    method: str = "finetune"

    def __post_init__(self) -> None:
        self.task = self.task.lower().replace("-", "").replace("_", "")
        if self.task not in TASK_KINDS:
            raise BertforgeError(f"unknown task {self.task!r} (choose from {', '.join(TASKS)})")
        check_args(vars(self), **FIELD_BOUNDS)
        if self.max_seq_len is None:
            self.max_seq_len = default_max_len(self.kind)
        if self.method not in METHODS:
            raise BertforgeError(f"unknown method {self.method!r} (choose from {', '.join(METHODS)})")
        if self.method == "frozen-head" and (self.kind != "classify" or self.freeze):
            raise BertforgeError(f"method frozen-head trains a classifier on frozen sentence embeddings: it takes a "
                                 f"classification task without freeze, not {self.task}{' with freeze' * self.freeze}")
        if self.freeze and self.kind not in FREEZE_KINDS:
            raise BertforgeError(f"--freeze (feature-based mode) supports classification, regression and tagging, "
                                 f"not {self.task}")

    def plan_epochs(self, train_rows: int) -> tuple[float, int]:
        """(epochs, evaluate every N epochs) for `train_rows` training rows: `epochs` when given (evaluating every
        epoch); else DEFAULT_EPOCHS, or as many epochs as make MIN_STEPS optimizer steps when that is more (the
        rule for small data), evaluating about MAX_EVALS times. It depends on the data and options alone, so a
        run reproduces for a fixed seed."""
        if self.epochs is not None:
            return float(self.epochs), 1
        per_epoch = max(1, math.ceil(train_rows / self.batch_size))
        epochs = max(DEFAULT_EPOCHS, float(math.ceil(MIN_STEPS / per_epoch)))
        return epochs, max(1, math.ceil(epochs / MAX_EVALS))

    @property
    def training_precision(self) -> str:
        """`precision`, or where none was asked for: bf16 autocast where the CPU / GPU computes bf16 natively, else
        fp32 (`device.default_precision`; ~1.6x faster at the same scores on such CPUs)."""
        from bertforge.device import default_precision

        return self.precision or default_precision(self.device)

    @property
    def kind(self) -> str:
        return TASK_KINDS[self.task]
