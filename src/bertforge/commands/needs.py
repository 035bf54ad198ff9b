"""What a verb needs beyond bertforge's own dependencies, declared beside the verb and checked by `cli` right after
the command line is parsed, before any work: a missing optional library is one line naming the extra to install,

    bertforge finetune: error: --task mrpc needs scikit-learn, which is not installed: pip install 'bertforge[tasks]'

Every verb declares `needs` with its parser: a tuple of `Need`s, or a function of the parsed arguments returning
them (an option can add needs: `--task mrpc` scikit-learn, `analyze attention --out F.png` matplotlib). `EXTRAS` is
pyproject.toml's [project.optional-dependencies] as bertforge imports them (tests/test_cli_needs.py keeps the two
the same). The trackers of `--report-to` are checked once, by `api.choices.report_to` (`tracker_needs`, `options.tracking`);
a YAML `--config` file by `commands.options.read_config_file`, which reads it before the command line is parsed.
"""
from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from bertforge.errors import BertforgeError

# extra -> {module bertforge imports: the package pip installs}
EXTRAS: dict[str, dict[str, str]] = {
    "tasks": {"scipy": "scipy", "sklearn": "scikit-learn", "seqeval": "seqeval"},
    "embed": {"faiss": "faiss-cpu", "scipy": "scipy"},
    "plot": {"matplotlib": "matplotlib"},
    "analysis": {"matplotlib": "matplotlib", "scipy": "scipy", "sklearn": "scikit-learn", "captum": "captum"},
    "serve": {"fastapi": "fastapi", "uvicorn": "uvicorn"},
    "export": {"onnx": "onnx", "onnxruntime": "onnxruntime"},
    "seq2seq": {"sacrebleu": "sacrebleu", "rouge_score": "rouge-score"},
    "yaml": {"yaml": "PyYAML"},
    "data": {"pyarrow": "pyarrow", "pandas": "pandas", "datasets": "datasets"},
    "retrieval": {"bm25s": "bm25s", "faiss": "faiss-cpu", "scipy": "scipy"},
    "ray": {"ray": "ray"},  # index build --ray (ray[data])
}
# The options that name a data source (a file, a folder of splits, a saved or Hub dataset): what reading each
# imports is decided by `io.tables.source_libraries`, for every verb alike.
SOURCE_OPTIONS = ("data", "input", "corpus", "train", "eval", "sts")
# The options that name a model (a folder, an exported graph, a Hub id): `model_needs` (and commands.options).
MODEL_DESTS = ("model", "teacher", "student_init", "init_from", "rerank", "tokenizer", "student")


@dataclass(frozen=True)
class Need:
    """`module` (from `extra`) must import for `what` (the verb or option that uses it) to run."""

    extra: str
    module: str
    what: str

    def __post_init__(self) -> None:
        if self.module not in EXTRAS.get(self.extra, {}):
            raise ValueError(f"{self.module!r} is not a library of the extra {self.extra!r} (EXTRAS)")

    @property
    def package(self) -> str:
        return EXTRAS[self.extra][self.module]

    def check(self) -> None:
        """One line naming the extra when the module does not import (missing, or an install that is broken)."""
        try:
            importlib.import_module(self.module)
        except ImportError:
            raise BertforgeError(f"{self.what} needs {self.package}, which is not installed: "
                                 f"pip install 'bertforge[{self.extra}]'") from None


Needs = tuple[Need, ...] | Callable[[argparse.Namespace], Iterable[Need]]


def of_extra(extra: str, what: str) -> tuple[Need, ...]:
    """Every library of `extra`."""
    return tuple(Need(extra, module, what) for module in EXTRAS[extra])


# The libraries of tasks.metrics: by metric name (a GLUE task's `TaskSpec.metrics`), and by task kind for the
# generic tasks (classify: macro F1; regress: Pearson / Spearman; tag: seqeval's entity F1; seq2seq: BLEU, ROUGE).
_METRIC_MODULES = {"f1": "sklearn", "mcc": "sklearn", "pearson": "scipy", "spearman": "scipy"}
_KIND_NEEDS = {"classify": (("tasks", "sklearn"),), "regress": (("tasks", "scipy"),), "tag": (("tasks", "seqeval"),),
               "seq2seq": (("seq2seq", "sacrebleu"), ("seq2seq", "rouge_score"))}


def task_needs(task: str | None) -> tuple[Need, ...]:
    """What scoring `--task TASK` imports (nothing for a task name the verb will refuse itself)."""
    from bertforge.api.choices import TASK_KINDS, task_metrics

    name = (task or "").lower().replace("-", "").replace("_", "")
    what = f"--task {task}"
    metrics = task_metrics(name)
    if metrics is not None:
        modules = dict.fromkeys(_METRIC_MODULES[m] for m in metrics if m in _METRIC_MODULES)
        return tuple(Need("tasks", module, what) for module in modules)
    return tuple(Need(extra, module, what) for extra, module in _KIND_NEEDS.get(TASK_KINDS.get(name, ""), ()))


def index_method(index: str | Path | None) -> str:
    """The retrieval method an index folder records in its meta.json ("dense" when it records none, or the file
    cannot be read: loading the index then says what is wrong)."""
    import json

    try:
        return json.loads((Path(index) / "meta.json").read_text(encoding="utf-8")).get("method", "dense")
    except (OSError, ValueError, AttributeError, TypeError):
        return "dense"


def index_needs(index: str | Path | None, what: str, method: str | None = None) -> tuple[Need, ...]:
    """What searching (or building) an index imports: faiss for dense vectors, bm25s for BM25, both for hybrid."""
    if index is None and method is None:
        return ()
    method = method or index_method(index)
    needs = []
    if method != "bm25":
        needs.append(Need("embed", "faiss", what))
    if method in ("bm25", "hybrid"):
        needs.append(Need("retrieval", "bm25s", f"{what} (a {method} index)"))
    return tuple(needs)


def tracker_needs(args: argparse.Namespace) -> tuple[Need, ...]:
    """`--report-to`'s trackers: `training.reporting` imports each now and names its extra in one line."""
    if getattr(args, "report_to", None):
        from bertforge.api.choices import report_to

        report_to(args.report_to)
    return ()


def source_libraries(source: str) -> tuple[str, ...]:
    """The libraries of the `data` extra that `io.tables` imports to read `source`, decided from its name alone:
    pyarrow for Parquet files (also in a folder of splits), datasets for save_to_disk folders and Hub ids."""
    from bertforge.io.tables import file_format, is_saved_dataset, looks_like_hub_id

    p = Path(source)
    if p.is_dir():
        if is_saved_dataset(p) or any(is_saved_dataset(c) for c in p.iterdir() if c.is_dir()):
            return ("datasets",)
        return ("pyarrow",) if any(file_format(c) == "parquet" for c in p.iterdir()) else ()
    if file_format(p) == "parquet":
        return ("pyarrow",)
    return ("datasets",) if not p.exists() and looks_like_hub_id(source) else ()


def source_needs(args: argparse.Namespace) -> tuple[Need, ...]:
    """What reading the verb's data sources imports (Parquet: pyarrow; saved or Hub datasets: datasets)."""
    needs = []
    for option in SOURCE_OPTIONS:
        value = getattr(args, option, None)
        for source in value if isinstance(value, list) else [value]:
            if isinstance(source, str):
                flag = "--" + option.replace("_", "-")
                needs += [Need("data", module, f"{flag} {source}") for module in source_libraries(source)]
    return tuple(needs)


def check_needs(args: argparse.Namespace) -> None:
    """The parsed verb's declared needs and its data sources' libraries, each importable, else one line (a
    BertforgeError) naming its extra."""
    needs = getattr(args, "needs", ())
    for need in (*(needs(args) if callable(needs) else needs), *source_needs(args), *model_needs(args)):
        need.check()


def model_needs(args: argparse.Namespace) -> tuple[Need, ...]:
    """onnxruntime for a model option naming a folder (or .onnx file) that `bertforge export` wrote, whatever the
    verb: said before the verb reads its input."""
    needs = []
    for dest in MODEL_DESTS:
        value = getattr(args, dest, None)
        for spec in value if isinstance(value, list) else [value]:
            path = Path(str(spec).rpartition("=")[2]).expanduser() if isinstance(spec, str) else None
            if path is not None and (path.suffix == ".onnx" or (path / "model.onnx").is_file()):
                from bertforge.api.choices import is_exported  # (torch: only for a folder that may be one)

                if is_exported(path):  # a folder that cannot be read: said when it is opened
                    needs.append(Need("export", "onnxruntime", f"--{dest.replace('_', '-')} {spec}"))
    return tuple(needs)
