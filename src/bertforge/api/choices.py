"""What the command line asks the library before any work: the names its parsers offer (tasks, task kinds,
recipes, maskings, families, tokenizer kinds and layouts, ablation tables and arms), what a task's scoring
imports, whether a folder is an exported graph, the trackers of `--report-to` and the files of a corpus.

`bertforge.commands` builds its parsers from these and imports nothing else of the library (tests/test_architecture.py);
each is read from the module that owns it. Building a parser imports no torch: every module read here at import
time is torch-free (tests/test_cli_startup.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bertforge.config.arguments import (COUNT, COUNT0, EPOCHS, FINITE, FRACTION, INNER_FRACTION, LENGTH, NONNEG,
                                        OPEN_FRACTION, OPSET, PORT, POSITIVE, SEED, STEPS, Number, built_student,
                                        int_range)
from bertforge.families import FAMILIES, MODEL_TYPES
from bertforge.pretraining.recipes import (DEFAULT as DEFAULT_RECIPE, EMBEDDING_SHARING, INPUT_FORMATS, MASKINGS,
                                        OBJECTIVES, RECIPES, SCHEDULES, SIZE_NAMES)
from bertforge.tasks.config import TASK_KINDS, TASKS
from bertforge.tokenization.pipelines import LAYOUTS, PLAIN_LAYOUTS, TOKENIZER_KINDS

__all__ = ["DEFAULT_RECIPE", "EMBEDDING_SHARING", "FAMILIES", "INPUT_FORMATS", "LAYOUTS", "MASKINGS", "MODEL_TYPES",
           "OBJECTIVES", "PLAIN_LAYOUTS", "RECIPES", "SCHEDULES", "SIZE_NAMES", "TASKS", "TASK_KINDS",
           "TOKENIZER_KINDS", "ablation_listing", "corpus_file_list", "distill_options", "is_exported",
           "report_to", "task_metrics", "finetune_default",
           # the bounds of numeric arguments, shared by the parsers and the public API (config/arguments.py)
           "COUNT", "COUNT0", "EPOCHS", "FINITE", "FRACTION", "INNER_FRACTION", "LENGTH", "NONNEG", "OPEN_FRACTION",
           "OPSET", "PORT", "POSITIVE", "SEED", "STEPS", "Number", "built_student", "int_range"]


def finetune_default(field: str) -> Any:
    """FinetuneConfig's default of `field`: the one place a fine-tuning default is written."""
    from bertforge.tasks.config import FinetuneConfig

    return getattr(FinetuneConfig, field)


def task_metrics(task: str) -> tuple[str, ...] | None:
    """The metric names a named task (sst2, mrpc, ... of `tasks.registry`) is scored by; None for another name."""
    from bertforge.tasks.registry import TASKS as NAMED

    return tuple(NAMED[task].metrics) if task in NAMED else None


def report_to(names: Any) -> tuple[str, ...]:
    """`--report-to`'s trackers, each imported now: a missing library (or an unknown name) is one line naming it,
    before any data is read or model built: the API's own check (`api.inputs.trackers`)."""
    from bertforge.api.inputs import trackers

    return trackers(names)["report_to"]


def is_exported(path: str | Path) -> bool:
    """Whether `path` (a folder, or a .onnx file) is a graph `bertforge export` wrote; a folder that cannot be
    read says so when it is opened, so here it is not one."""
    from bertforge.errors import BertforgeError
    from bertforge.model.folder import onnx_file

    try:
        return onnx_file(Path(path)) is not None
    except BertforgeError:
        return False


def corpus_file_list(corpus: list[str]) -> list[Path]:
    """The files of a corpus given as paths, folders and globs; a missing file or a pattern matching nothing is
    one line."""
    from bertforge.data.corpus import find_files

    return find_files(corpus)


def distill_options(task: bool) -> frozenset[str]:
    """The option names of a distillation mode (task distillation's or the general one's), its inputs and output
    excepted: the fields of its config."""
    if task:
        from bertforge.distillation.task import TaskDistillConfig as config
    else:
        from bertforge.distillation.general import GeneralDistillConfig as config
    return frozenset(config.__dataclass_fields__) - {"teacher", "task", "data", "corpus", "out"}


def ablation_listing() -> str:
    """What `bertforge ablate --list` prints: every paper's table with its arms and claims, and the arms."""
    from bertforge.lab.tables import listing

    return listing()
