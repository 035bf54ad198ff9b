"""What the public functions accept, decided in one place:

  * a model as a folder, a Hugging Face Hub id (at `revision`; from the cache when offline), an opened
    `ModelFolder`, or, where a verb can use one, a model already loaded (`model_name`, `placed`);
  * data as a path (a file, a folder of splits, a saved or Hub dataset) or in memory (a list of strings or dicts,
    a pandas DataFrame, a pyarrow Table, a `datasets.Dataset`), read by `io.tables` (`read_texts`);
  * a corpus (pretraining, tokenizer training, general distillation) as files (a path, or a list of paths, folders
    and globs, as on the command line), as a table in memory, or as `texts`: documents as strings. A corpus in
    memory is written once to the bertforge cache under its content's sha256 and read from there like any file,
    so the same texts give the same file (a resumed run sees the same data) and the verbs' file readers, worker
    processes and fingerprints need no second path (`corpus_files`);
  * a verb's rarely used options as keywords of its config dataclass, an unknown one refused in one line
    (`make_config`).

Nothing here imports torch at import time: `import bertforge` stays fast.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from bertforge.config.arguments import DATA, TEXT, check_args, maybe
from bertforge.errors import ArgumentError, BertforgeError
from bertforge.io.cache import CACHE_VAR, cache_dir  # noqa: F401 (CACHE_VAR: the variable users set)


def model_name(model: Any, revision: str | None = None, flag: str = "model=") -> Any:
    """`model` as the library's loaders take it: a name (a path, or a Hub id: its snapshot folder at `revision`)
    becomes its local path, once (`io.hub.resolve_once`: a name the command line resolved stays as it is); an
    opened ModelFolder or a loaded model stays as it is. A revision applies to Hub ids only (a local folder has no
    versions; as on the command line, it is ignored for one)."""
    if isinstance(model, (str, os.PathLike)):
        from bertforge.io.hub import resolve_once

        return resolve_once(model, revision, flag)
    if model is None:
        raise ArgumentError(f"{flag.strip('-=').replace('-', '_') or 'model'}=None: no model given")
    return model


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a call runs: `device` resolved and `precision` checked against it, once (`placement`). Passed down as
    the call's device, so no later step resolves or checks them again."""

    device: Any                    # a torch.device
    precision: str | None = None   # checked against it (None: none was given)


def placement(device: Any, precision: str | None = None, allowed: tuple[str, ...] | None = None) -> Placement:
    """`device` resolved (None: "auto"; a torch.device or a Placement: as it is) and `precision` checked against it
    (among `allowed`): one line before any work."""
    from bertforge.device import PRECISIONS, check_precision, resolve_device

    if isinstance(device, Placement):
        if precision is None or (precision == device.precision and (allowed is None or precision in allowed)):
            return device
        run_on = device.device
    elif type(device).__name__ == "device":  # a torch.device: resolved by whoever made it
        run_on = device
    else:
        run_on = resolve_device(device or "auto")
    if precision is not None:
        check_precision(precision, run_on, allowed=allowed or PRECISIONS)
    return Placement(run_on, precision)


def device_for(device: Any, precision: str | None = None, allowed: tuple[str, ...] | None = None):
    """The torch.device of `placement(device, precision, allowed)`."""
    return placement(device, precision, allowed).device


def placed(model: Any, device: str | None, compile: bool = False, what: str = "--model"):
    """A loaded model on `device` (None: where it is), encoding through a torch.compile'd copy with `compile`."""
    if hasattr(model, "compile_inference"):  # a cross-encoder runs eagerly
        model.compile_inference = bool(compile)
    if device is None:
        return model
    from bertforge.device import move_model

    return move_model(model, device_for(device), what)


def read_texts(source: Any, text_col: Any = None, *, split: str | None = None, config: str | None = None,
               what: str = "texts") -> list[str]:
    """One text per row of `source`: a list of strings as it is; a file's lines or a table's text column
    (`text_col`; default: the first of text, sentence, ... present), from its `split` of a folder of splits, a
    saved or Hub dataset (a Hub dataset's `config`). An empty row is "" so that output row i is input row i."""
    from bertforge.io import tables

    check_args(locals(), source=DATA, text_col=maybe(TEXT), split=maybe(TEXT), config=maybe(TEXT), what=TEXT)
    if isinstance(source, str) and not os.path.lexists(source) and any(c.isspace() for c in source):
        raise BertforgeError(f"{what}: {source[:60]!r} is no file or folder (a single string is read as a path; "
                             "give a list of strings to use the texts themselves)")
    return tables.read_texts(tables.single_source(source, split, config), text_col)


def corpus_files(corpus: Any = None, texts: Any = None, text_col: str | None = None,
                 what: str = "corpus") -> tuple[list[str] | None, str | None]:
    """(files, text column) for a verb that reads a corpus from files: `corpus` as paths (a path, or a list of
    paths, folders and globs) with `text_col` the column of its tables; or data in memory (a table: `text_col` is
    its text column; `texts`: the documents), written to the bertforge cache as JSON lines (its field: text).
    (None, None) when neither is given."""
    if corpus is not None and texts is not None:
        raise BertforgeError(f"give {what} or texts, not both")
    if texts is None and corpus is None:
        return None, None
    if texts is None and isinstance(corpus, (str, os.PathLike)):
        return [str(corpus)], text_col
    if texts is None and isinstance(corpus, (list, tuple)) and corpus and all(
            isinstance(p, (str, os.PathLike)) for p in corpus):
        return [str(p) for p in corpus], text_col
    if texts is not None:
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise BertforgeError("texts: give a list of documents, each a string")
        documents = list(texts)
    else:
        from bertforge.io import tables

        documents = tables.read_texts(corpus, text_col)
    documents = [d for d in documents if d.strip()]
    if not documents:
        raise BertforgeError(f"{what}: no text (every document is empty)")
    return [str(cached_corpus(documents))], None


def cached_corpus(documents: list[str]) -> Path:
    """The documents as a JSONL file in the cache, named by their content (written once; kept as it is after)."""
    from bertforge.io.write import atomic_write_text, ensure_dir

    text = "".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in documents)
    path = cache_dir() / "corpora" / f"{hashlib.sha256(text.encode('utf-8')).hexdigest()[:32]}.jsonl"
    if not path.is_file():  # the same texts: the same file, untouched (its identity is what a resume checks)
        ensure_dir(path.parent, f"the bertforge cache (${CACHE_VAR})")
        atomic_write_text(path, text)
    return path


def make_config(config_cls: type, verb: str, given: dict[str, Any], options: dict[str, Any]):
    """`config_cls(**given, **options)`, where `options` are the caller's further keywords: one that is no field of
    the config (a typo) is one line naming it and the options there are."""
    fields = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(options) - fields)
    if unknown:
        free = sorted(fields - set(given))
        raise BertforgeError(f"{verb}: unknown option {unknown[0]!r} (its options: {', '.join(free)})")
    return config_cls(**given, **options)


def read_history(folder: str | Path) -> list[dict[str, Any]]:
    """The records of a run's metrics.jsonl (what the seed determines: loss, learning rate, evaluations), [] when
    the run wrote none."""
    from bertforge.io.read import jsonl_rows

    path = Path(folder) / "metrics.jsonl"
    return [record for _, record in jsonl_rows(path)] if path.is_file() else []


def trackers(report_to: Any = None, logging_dir: Any = None) -> dict[str, Any]:
    """{report_to, logging_dir} for a training run: the trackers besides metrics.jsonl ("tensorboard", "mlflow";
    a list, or one comma-separated string), each imported now, so a missing library is one line before any work."""
    from bertforge.training.reporting import parse_report_to

    return {"report_to": parse_report_to(report_to), "logging_dir": Path(logging_dir) if logging_dir else None}
