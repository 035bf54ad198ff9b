"""Datasets as tables: folders that datasets' `save_to_disk` wrote, datasets on the Hugging Face Hub (read by
`datasets.load_dataset`, from its cache when offline), and the split names they go by (train, dev / validation,
test). datasets is imported only here, and only when such a source is read."""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io.rows import HubSplit, Row, Table, first_line, import_extra

# The names each split goes by, the usual one first (GLUE's files say dev, the Hugging Face Hub says validation).
SPLITS = {"train": ("train",), "dev": ("dev", "dev_matched", "valid", "validation", "val", "eval"), "test": ("test",)}


def is_saved_dataset(path: str | Path) -> bool:
    """Whether `path` is a folder that datasets' save_to_disk wrote (a Dataset or a DatasetDict)."""
    p = Path(path)
    return p.is_dir() and ((p / "dataset_dict.json").is_file() or (p / "state.json").is_file())


def saved_table(path: Path, split: str | None) -> Table:
    if not is_saved_dataset(path):
        raise BertforgeError(f"{path}: a folder, but not one that datasets' save_to_disk wrote (no state.json or "
                             "dataset_dict.json); name a file in it")
    datasets = import_extra("datasets", f"{path}: reading a saved dataset")
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as err:  # datasets' own errors for a damaged folder
        raise BertforgeError(f"{path}: cannot read this saved dataset ({first_line(err)})") from None
    return dataset_table(loaded, str(path), split)


_HUB: dict[tuple[str, str | None], Any] = {}  # datasets loaded in this process (each read once)


def load_hub_dataset(dataset: str, config: str | None) -> Any:
    """The DatasetDict of a hub dataset (all its splits), through datasets.load_dataset: downloaded when online
    (a token from HF_TOKEN), from the cache when offline; anything that cannot be had is one line."""
    key = (dataset, config)
    if key not in _HUB:
        datasets = import_extra("datasets", f"{dataset}: no such file or folder; reading it as a Hugging Face Hub "
                                "dataset")
        verbosity = datasets.logging.get_verbosity()
        datasets.logging.set_verbosity_error()  # its notes ("using the latest cached version...") are no errors
        try:
            _HUB[key] = datasets.load_dataset(dataset, config)
        except ConnectionError:
            raise BertforgeError(f"{dataset}: no such file or folder, and no Hugging Face Hub dataset of that name in "
                                 "the cache (offline, or the Hub cannot be reached)") from None
        except Exception as err:  # DatasetNotFoundError, a config not cached or not given, ...
            raise BertforgeError(f"{dataset}: no such file or folder, nor a dataset to be had from the Hugging Face "
                                 f"Hub ({first_line(err)})") from None
        finally:
            datasets.logging.set_verbosity(verbosity)
    return _HUB[key]


def hub_table(dataset: str, config: str | None, split: str | None) -> Table:
    return dataset_table(load_hub_dataset(dataset, config), str(HubSplit(dataset, config)), split)


def dataset_table(data: Any, name: str, split: str | None) -> Table:
    """A datasets Dataset as a table; a DatasetDict gives its `split`."""
    stem = str(getattr(data, "split", None) or "") or Path(name).stem
    if isinstance(data, dict):  # a DatasetDict is a dict of split name -> Dataset
        data, name, stem = choose_split(data, name, split)

    def rows() -> Iterator[Row]:
        i = 0
        for batch in data.with_format(None).iter(batch_size=1024):
            keys = list(batch)
            for values in zip(*(batch[k] for k in keys)):
                yield Row(f"{name} row {i}", dict(zip(keys, values)))
                i += 1

    table = Table(name, rows, list(data.column_names), stem=stem)
    for column, feature in getattr(data, "features", {}).items():
        names = getattr(feature, "names", None) or getattr(getattr(feature, "feature", None), "names", None)
        if names:  # ClassLabel, or a Sequence / List of ClassLabel
            table.class_names[column] = list(names)
    return table


def choose_split(splits: dict, name: str, split: str | None) -> tuple[Any, str, str]:
    """(the data of `split`, its name for messages, the split's name) from a dict of splits; without `split`, its
    only split."""
    names = list(splits)
    chosen = split_name(names, split) if split else (names[0] if len(names) == 1 else None)
    if chosen is None:
        asked = f"no split {split!r}" if split else "several splits; name the one to read"
        raise BertforgeError(f"{name}: {asked} (splits: {', '.join(map(str, names)) or 'none'})")
    return splits[chosen], f"{name} [{chosen}]", str(chosen)


def split_aliases(split: str) -> tuple[str, ...]:
    """The names `split` goes by, itself first: "dev" and "validation" find each other (SPLITS)."""
    group = SPLITS.get(split) or next((names for names in SPLITS.values() if split in names), ())
    return tuple(dict.fromkeys((split, *group)))


def split_name(names: Iterable[str], split: str) -> str | None:
    """Which of `names` is `split` (train, dev, test, or a name of its own), by its aliases in order."""
    names = list(names)
    return next((c for c in split_aliases(split) if c in names), None)
