"""The GLUE-style task table: for each task its reader, label list, label column, metrics and usual files.

    spec = get_task("sst-2")
    train = spec.read(data_dir / "glue/SST-2/train.tsv")
    metrics = compute_metrics(spec.name, preds, labels)     # bertforge.tasks.metrics
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bertforge.errors import BertforgeError
from bertforge.labels import NLI2_LABELS, NLI3_LABELS
from bertforge.tasks.examples import TextExample
from bertforge.tasks.glue import read_cola, read_mrpc, read_nli_jsonl, read_qnli, read_rte, read_sst2, read_stsb


@dataclass(frozen=True)
class TaskSpec:
    """How to read and score one sentence (pair) classification / regression task.

    ``labels`` None means regression (one float output). ``files`` maps split names to the usual paths
    relative to the shared data directory (informational; pass any path to ``read``). ``label_column`` names
    the column (or field) the labels come from, for messages about a file that lacks it."""

    name: str
    reader: Callable[[str | Path], list[TextExample]]
    labels: tuple[str, ...] | None
    metrics: tuple[str, ...]
    main_metric: str
    files: dict[str, str] = field(default_factory=dict)
    label_column: str = "label"

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def num_labels(self) -> int:
        return 1 if self.labels is None else len(self.labels)

    def read(self, path: str | Path) -> list[TextExample]:
        return self.reader(path)


def _glue(folder: str, splits: Sequence[str] = ("train", "dev")) -> dict[str, str]:
    return {s: f"glue/{folder}/{s}.tsv" for s in splits}


TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in [
        TaskSpec("sst2", read_sst2, ("0", "1"), ("accuracy",), "accuracy", _glue("SST-2")),
        TaskSpec("cola", read_cola, ("0", "1"), ("mcc", "accuracy"), "mcc", _glue("CoLA")),
        TaskSpec("mrpc", read_mrpc, ("0", "1"), ("f1", "accuracy"), "f1", _glue("MRPC"), "Quality"),
        TaskSpec("stsb", read_stsb, None, ("pearson", "spearman"), "spearman", _glue("STS-B"), "score"),
        TaskSpec("rte", read_rte, NLI2_LABELS, ("accuracy",), "accuracy", _glue("RTE")),
        TaskSpec("qnli", read_qnli, NLI2_LABELS, ("accuracy",), "accuracy", _glue("QNLI", ("dev",))),
        TaskSpec("mnli", read_nli_jsonl, NLI3_LABELS, ("accuracy",), "accuracy", {"dev": "mnli/dev_matched.jsonl"}),
        TaskSpec("snli", read_nli_jsonl, NLI3_LABELS, ("accuracy",), "accuracy", {"dev": "snli/dev.jsonl"}),
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
