"""What the public functions return, as objects with named fields; `to_dict()` gives what the command line prints
(or writes as the run's results) for the same call, as JSON-ready values.

Training verbs return a `TrainResult` (the output folder, the final or best metrics, the history of its
metrics.jsonl, and the verb's own report), with a few fields more per verb; `quantize` and `export` their parity
records; inference returns plain data (numpy arrays, lists of records, strings) and evaluation a dict of metrics.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class TrainResult:
    """A finished training run: `out` holds the model (loadable by bertforge, and by transformers or
    sentence-transformers), `metrics` its final held-out metrics (fine-tuning: the best evaluation), `history` the
    records of OUT/metrics.jsonl in order, `record` the verb's report (`to_dict()`)."""

    out: Path
    metrics: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list, repr=False)
    record: dict[str, Any] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.record)


@dataclass
class FinetuneResult(TrainResult):
    """`finetune`: `metrics` are the best run's best evaluation; `summary` the median / min / max / std of the main
    metric over the runs (empty without evaluation data); `runs` one record per run (seed, best metrics, folder,
    steps, speed)."""

    task: str = ""
    main_metric: str = ""
    summary: dict[str, float] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list, repr=False)
    precision: str = "fp32"


@dataclass
class PretrainResult(TrainResult):
    """`pretrain`: `metrics` are the held-out metrics of the final model; `record` is OUT/eval_results.json (recipe,
    size, steps, parameters, timings, fill-mask examples)."""


@dataclass
class DistillResult(TrainResult):
    """`distill`: `metrics` are the student's best evaluation (task) or its held-out MLM accuracy (general);
    `record` is OUT/results.json."""


@dataclass
class SentenceEncoderResult(TrainResult):
    """`train_sentence_encoder`: `model` is the trained encoder (saved in `out` in the sentence-transformers
    layout), `metrics` its STS correlation on `eval` after training ({} without `eval`), `sts_before` the same
    before training."""

    model: Any = field(default=None, repr=False)
    loss: str = ""
    examples: int = 0
    sts_before: dict[str, float] | None = None


@dataclass
class QuantizeResult:
    """`quantize`: the int8 model in `out`; how far its first output is from the fp32 model's (max absolute
    difference, mean cosine) on sample inputs, and the weight files' sizes."""

    kind: str
    out: Path
    max_abs_diff: float
    mean_cosine: float
    weights_bytes_fp32: int
    weights_bytes_int8: int

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "out": str(self.out)}


@dataclass
class ExportResult:
    """`export`: the graph(s) in `out` (model.onnx, model.int8.onnx with `int8`), their inputs and outputs, their
    largest difference from PyTorch on sample inputs, the nodes onnxruntime's optimiser fused, and `unfused`: why
    the graph was left unfused (e.g. attention with relative-position scores, which the fused node cannot take)."""

    out: Path
    kind: str
    format: str
    opset: int
    inputs: list[str]
    outputs: list[str]
    fp32_max_abs_diff: float
    fused_nodes: dict[str, int]
    int8_max_abs_diff: float | None = None
    int8_mean_cosine: float | None = None
    unfused: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record `bertforge export` prints (and writes to OUT/export.json)."""
        d = dataclasses.asdict(self)
        del d["out"]
        return {k: v for k, v in d.items() if v is not None or not (k.startswith("int8_") or k == "unfused")}


@dataclass
class PruneResult:
    """`prune`: the pruned model in `out` (bertforge's layout: per-layer head counts in its config.json); the heads
    removed per layer, the parameters and metrics before and after, the evaluation's seconds before and after and
    their ratio (`speedup`). `to_dict()` is OUT/pruning.json, what `bertforge prune` prints."""

    out: Path
    fraction: float
    heads_removed: int
    heads_total: int
    removed: dict[str, list[int]]
    heads_per_layer: list[int]
    parameters_before: int
    parameters_after: int
    metrics_before: dict[str, Any]
    metrics_after: dict[str, Any]
    eval_seconds_before: float
    eval_seconds_after: float
    speedup: float
    finetune_steps: int
    seed: int

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        del d["out"]
        return d
