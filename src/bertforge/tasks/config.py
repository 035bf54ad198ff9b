"""`FinetuneConfig`: everything one fine-tuning (or evaluation) job needs, and the task names it accepts.

Standard library only, so the CLI can build its parser (the task choices) without importing torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError

# task name -> kind (bertforge.tasks.kinds has one class per kind); GLUE-style names read with tasks.registry
TASK_KINDS = {"sst2": "classify", "cola": "classify", "mrpc": "classify", "stsb": "regress", "rte": "classify",
              "qnli": "classify", "mnli": "classify", "snli": "classify", "conll": "tag", "squad": "qa",
              "squad2": "qa", "swag": "choice", "classify": "classify", "regress": "regress", "tag": "tag",
              "qa": "qa", "choice": "choice", "seq2seq": "seq2seq"}
TASKS = tuple(TASK_KINDS)
FREEZE_KINDS = ("classify", "regress", "tag")  # what the feature-based mode (a head on frozen features) supports
# The numeric fields that must be positive when given (the command line's bounds say the same for its flags; the
# Python API and a config built in code meet this check).
POSITIVE_FIELDS = ("max_seq_len", "eval_batch_size", "eval_limit", "epochs", "max_steps", "batch_size", "lr", "runs",
                   "train_limit", "max_target_len", "num_beams", "max_query_length")


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
    epochs: float = 3.0
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

    def __post_init__(self) -> None:
        self.task = self.task.lower().replace("-", "").replace("_", "")
        if self.task not in TASK_KINDS:
            raise BertforgeError(f"unknown task {self.task!r} (choose from {', '.join(TASKS)})")
        if self.runs < 1:
            raise BertforgeError(f"--runs must be at least 1, got {self.runs}")
        for name in POSITIVE_FIELDS:
            value = getattr(self, name)
            if value is not None and value <= 0:
                flag = {"eval_limit": "limit"}.get(name, name)
                raise BertforgeError(f"--{flag.replace('_', '-')} must be positive, got {value}")
        if self.max_seq_len is None:
            self.max_seq_len = default_max_len(self.kind)
        if self.freeze and self.kind not in FREEZE_KINDS:
            raise BertforgeError(f"--freeze (feature-based mode) supports classification, regression and tagging, "
                                 f"not {self.task}")

    @property
    def training_precision(self) -> str:
        """`precision`, or where none was asked for: bf16 autocast where the CPU / GPU computes bf16 natively, else
        fp32 (`device.default_precision`; ~1.6x faster at the same scores on such CPUs)."""
        from bertforge.device import default_precision

        return self.precision or default_precision(self.device)

    @property
    def kind(self) -> str:
        return TASK_KINDS[self.task]
