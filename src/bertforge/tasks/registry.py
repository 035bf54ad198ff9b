"""The GLUE-style task table: for each task its reader, label list, label column, metrics and usual files.

    spec = get_task("sst-2")
    train = spec.read(data_dir / "glue/SST-2/train.tsv")
    metrics = compute_metrics(spec.name, preds, labels)     # bertforge.tasks.metrics
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.labels import NLI2_LABELS, NLI3_LABELS
from bertforge.tasks.examples import TextExample
from bertforge.tasks.glue import read_cola, read_mrpc, read_nli_jsonl, read_qnli, read_rte, read_sst2, read_stsb


@dataclass(frozen=True)
class TaskSpec:
    """How to read and score one sentence (pair) classification / regression task.

    ``labels`` None means regression (one float output). ``files`` maps split names to the usual paths
    relative to the shared data directory (informational; pass any source to ``read``). ``columns``: the task's
    (text, text pair, label) column names, which ``read`` takes others for."""

    name: str
    reader: Callable[..., list[TextExample]]
    labels: tuple[str, ...] | None
    metrics: tuple[str, ...]
    main_metric: str
    files: dict[str, str] = field(default_factory=dict)
    columns: tuple[str, str | None, str] = ("sentence", None, "label")

    @property
    def label_column(self) -> str:
        """The column (or field) the labels come from, for messages about a file that lacks it."""
        return self.columns[2]

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def num_labels(self) -> int:
        return 1 if self.labels is None else len(self.labels)

    def read(self, source: Any, text_col: Any = None, text_pair_col: Any = None,
             label_col: Any = None) -> list[TextExample]:
        """The examples of `source` (a path or any data `bertforge.io.tables.open_table` takes); a column given
        replaces the task's own."""
        text, pair, label = self.columns
        return self.reader(source, text_col or text, text_pair_col or pair, label_col or label)


def _glue(folder: str, splits: Sequence[str] = ("train", "dev")) -> dict[str, str]:
    return {s: f"glue/{folder}/{s}.tsv" for s in splits}


TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in [
        TaskSpec("sst2", read_sst2, ("0", "1"), ("accuracy",), "accuracy", _glue("SST-2")),
        TaskSpec("cola", read_cola, ("0", "1"), ("mcc", "accuracy"), "mcc", _glue("CoLA")),
        TaskSpec("mrpc", read_mrpc, ("0", "1"), ("f1", "accuracy"), "f1", _glue("MRPC"),
                 ("#1 String", "#2 String", "Quality")),
        TaskSpec("stsb", read_stsb, None, ("pearson", "spearman"), "spearman", _glue("STS-B"),
                 ("sentence1", "sentence2", "score")),
        TaskSpec("rte", read_rte, NLI2_LABELS, ("accuracy",), "accuracy", _glue("RTE"), ("sentence1", "sentence2", "label")),
        TaskSpec("qnli", read_qnli, NLI2_LABELS, ("accuracy",), "accuracy", _glue("QNLI", ("dev",)),
                 ("question", "sentence", "label")),
        TaskSpec("mnli", read_nli_jsonl, NLI3_LABELS, ("accuracy",), "accuracy", {"dev": "mnli/dev_matched.jsonl"},
                 ("premise", "hypothesis", "label")),
        TaskSpec("snli", read_nli_jsonl, NLI3_LABELS, ("accuracy",), "accuracy", {"dev": "snli/dev.jsonl"},
                 ("premise", "hypothesis", "label")),
    ]
}


def get_task(name: str) -> TaskSpec:
    """Look a task up by name, ignoring case, '-' and '_' ("SST-2", "sst_2" and "sst2" all work)."""
    key = re.sub(r"[-_\s]", "", name.lower())
    if key == "stsbenchmark":
        key = "stsb"
    if key not in TASKS:
        raise BertforgeError(f"unknown task {name!r} (known: {', '.join(TASKS)})")
    return TASKS[key]
