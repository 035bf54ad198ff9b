"""The base of the task kinds (`bertforge.tasks.kinds`): `TaskKind`, the behaviour every kind shares, and
`Encoded`, a kind's encoded examples. What differs between kinds (reading, encoding, the model, batching, saving,
scoring) is a method here with the encoders' behaviour as its default; an encoder-decoder kind (tasks.seq2seq)
overrides the model's build / save / load and the batching as well.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterable
from typing import Any, Callable

import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.io.read import COMPRESSIONS, compression
from bertforge.io.tables import SPLITS, find_split, is_splits, source_name, split_aliases
from bertforge.model.folder import ModelFolder
from bertforge.tasks import squad as S
from bertforge.tasks.batching import forward_rows, make_collate
from bertforge.tasks.config import FinetuneConfig, default_max_len

DEV_STEMS = SPLITS["dev"]


@dataclass
class Encoded:
    """Examples and their model rows (tensors trimmed to their length; SQuAD: one row per window, `windows`
    maps them back to the examples). `pad_id` is the tokenizer's, for batching the rows."""

    examples: list
    rows: list[dict[str, torch.Tensor]]
    pad_id: int
    windows: S.SquadFeatures | None = None


class TaskKind:
    """The behaviour shared by every kind; subclasses fill in reading, encoding, scoring and predictions."""

    name = ""  # the model kind bertforge.tasks.models builds (and config.json's bertforge_task.kind)
    extensions: tuple[str, ...] = ()  # data files looked for in a --data folder, in this order (then saved datasets)
    main_metric = "accuracy"
    label_column = "'label' column"  # named when a file has no labels
    splits_eval_file = False  # QA: with only an eval file, train on its first half (by article)

    def __init__(self, cfg: FinetuneConfig, saved: dict[str, Any], labels: list[str] | None):
        self.task = cfg.task
        self.labels = list(labels) if labels else None
        # a saved model encodes as it was trained unless the user chose a length
        given = cfg.max_seq_len != default_max_len(self.name)
        self.max_len = int(cfg.max_seq_len if given or not saved.get("max_seq_len") else saved["max_seq_len"])

    # ---- data ----------------------------------------------------------------------------------------------------
    def data_files(self, split: str) -> list[str]:
        """Glob patterns of a split's file in a --data folder, most preferred first (each also compressed)."""
        return [stem + ext for stem in split_aliases(split) for ext in compressed(self.extensions)]

    def split_source(self, data: Any, split: str, config: str | None = None) -> Any:
        """The source of `split` ("train", "dev", "test") in `data` (a folder of splits, a hub dataset id with its
        `config`, a DatasetDict...; `bertforge.io.tables.find_split`), None when it has no such split; `data` itself
        when it is one table (a file, a saved Dataset, data in memory)."""
        if not is_splits(data):
            return data
        return find_split(data, split, config=config, patterns=self.data_files(split))

    def read(self, source: Any) -> list:
        """Labelled examples from a file, a saved or hub dataset split, or data in memory."""
        raise NotImplementedError

    def read_inputs(self, source: Any) -> list:
        """Unlabelled examples for `predict` (bertforge.tasks.inputs lists the formats)."""
        raise NotImplementedError

    def has_label(self, example: Any) -> bool:
        return getattr(example, "label", None) is not None

    def check(self, examples: list, source: Any, labelled: bool = True) -> None:
        """At least one example and, for training and evaluation, a label on every one."""
        path = source_name(source)
        if not examples:
            raise BertforgeError(f"{path}: no examples (an empty file, or only a header)")
        if not labelled:
            return
        unlabelled = [i for i, ex in enumerate(examples) if not self.has_label(ex)]
        if len(unlabelled) == len(examples):
            raise BertforgeError(f"{path}: no {self.label_column}; training and evaluation need labels")
        if unlabelled:
            raise BertforgeError(f"{path}: example {unlabelled[0] + 1} has no label ({self.label_column})")

    def split(self, train: list, evaluation: list, eval_file: Any, training: bool) -> tuple[list, list]:
        """The (train, eval) examples to use; only QA changes them (a dev file split by article)."""
        return train, evaluation

    def encode(self, examples: list, tokenizer) -> Encoded:
        raise NotImplementedError

    # ---- model ---------------------------------------------------------------------------------------------------
    @property
    def num_labels(self) -> int:
        return len(self.labels) if self.labels else 1

    def build(self, model_dir: "Path | ModelFolder", freeze: dict[str, Any] | None = None
              ) -> tuple[nn.Module, list[str]]:
        """The task model (tasks.models class for `name`) whose encoder comes from `model_dir` (a path or an opened
        model folder); (model, missing)."""
        from bertforge.tasks.models import init_from_pretrained

        return init_from_pretrained(model_dir, self.name, self.num_labels, freeze)

    def info(self) -> dict[str, Any]:
        """What config.json's bertforge_task keeps, so that evaluate and predict rebuild this kind."""
        return {"name": self.task, "max_seq_len": self.max_len}

    def collate(self, pad_id: int) -> Callable[[list[dict]], dict[str, torch.Tensor]]:
        """How training rows become a batch."""
        return make_collate(pad_id)

    def save(self, model: nn.Module, directory: Path, tokenizer: Any) -> None:
        """Write the fine-tuned model (with this kind's settings in config.json's bertforge_task)."""
        from bertforge.tasks.models import save_task_model

        save_task_model(model, directory, self.labels, self.info(), tokenizer=tokenizer)

    def load_into(self, model: nn.Module, directory: Path) -> None:
        """Load a saved checkpoint's weights into `model` (the Trainer's resume)."""
        from bertforge.model.checkpoint import load_pretrained

        load_pretrained(model, directory)

    def load(self, path: "Path | ModelFolder") -> nn.Module:
        """A fine-tuned model for `evaluate` (an exported graph runs in onnxruntime)."""
        from bertforge.tasks.models import load_task_model

        return load_task_model(path)[0]

    def logits(self, model: nn.Module, enc: Encoded, batch_size: int, progress: bool,
               desc: str) -> list[torch.Tensor]:
        outs = forward_rows(model, enc.rows, enc.pad_id, batch_size, ("logits",), desc, progress)
        return [o["logits"] for o in outs]

    def evaluate(self, model: nn.Module, enc: Encoded, batch_size: int = 64,
                 progress: bool = False) -> dict[str, float]:
        raise NotImplementedError

    def predict(self, model: nn.Module, enc: Encoded, batch_size: int = 64, progress: bool = False) -> list[dict]:
        raise NotImplementedError


def compressed(suffixes: Iterable[str]) -> list[str]:
    """`suffixes`, each followed by its compressed forms (.csv, .csv.gz, .csv.bz2, ...; Parquet compresses its
    own pages)."""
    out: list[str] = []
    for suffix in suffixes:
        forms = [suffix] if compression(suffix) or suffix.endswith(".parquet") else [suffix] + [
            suffix + c for c in COMPRESSIONS]
        out += [f for f in forms if f not in out]
    return out
