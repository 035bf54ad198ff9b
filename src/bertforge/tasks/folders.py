"""Fine-tuned model folders: the model in an OUT folder, its task read without loading weights, installing a model.

A finished `bertforge finetune --out OUT` leaves the model in OUT itself (as transformers' Trainer users expect:
`AutoModelFor...from_pretrained(OUT)` works); what any folder holds is `bertforge.model.folder.ModelFolder.open`'s
to say (it also finds the OUT/best folders that older versions wrote).
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io.write import atomic_write, note_written, write_errors
from bertforge.model.folder import ModelFolder
from bertforge.tasks.config import TASK_KINDS

# the files of a saved model (save_task_model: weights, config, tokenizer) and the Trainer's best_metrics.json
MODEL_FILES = ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
               "vocab.txt", "best_metrics.json", "config.json")  # config.json last: a model is complete with it


def saved_task(folder: "str | Path | ModelFolder") -> tuple[dict[str, Any], list[str] | None]:
    """(bertforge_task, label names) of a fine-tuned model's folder (opened, or a path to open), without loading
    its weights; one line for a folder that holds none."""
    folder = ModelFolder.open(folder)
    task = folder.task
    if task is None or task.get("kind") not in set(TASK_KINDS.values()):
        raise BertforgeError(f"{folder.path / 'config.json'}: not a bertforge fine-tuned model (no bertforge_task "
                             "field); fine-tune it first with `bertforge finetune`")
    return task, folder.labels


def install_model(src: Path, dst: Path, move: bool) -> None:
    """Make `dst` hold the model saved in `src` (moved, or copied), replacing the model files `dst` had.

    Each file lands by an atomic rename (a copy goes through io.write.atomic_write: a killed copy leaves only a
    .NAME.PID.*.tmp that the next claim of the folder removes); config.json comes last, so a folder with a
    config.json is complete."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        if not (src / name).is_file():
            (dst / name).unlink(missing_ok=True)  # e.g. an earlier run's best_metrics.json
        elif move:
            with write_errors(dst / name):
                os.replace(src / name, dst / name)
            note_written(dst / name)
        else:
            atomic_write(dst / name, lambda tmp, f=src / name: shutil.copyfile(f, tmp))


def install_dir(src: Path, dst: Path) -> None:
    """Move folder `src` to `dst`, replacing it: the old one is renamed aside first (a killed move leaves a
    .old-NAME-PID folder, which the next claim removes) and dropped after."""
    if not src.is_dir():
        return
    old = dst.with_name(f".old-{dst.name}-{os.getpid()}")
    if dst.exists():
        os.replace(dst, old)
    os.replace(src, dst)
    shutil.rmtree(old, ignore_errors=True)


# atomic_write_dir's leftovers (training.state): .tmp-NAME-PID / .old-NAME-PID
_TEMP_DIR = re.compile(r"^\.(tmp|old)-.+-\d+$")


def remove_stale_temp_dirs(folder: Path) -> list[Path]:
    """Delete the half-written directories a killed run left at the top of `folder` (e.g. .tmp-best-123).
    Only call it while holding the folder's claim: then no live writer can own them."""
    removed = []
    if folder.is_dir():
        for p in folder.iterdir():
            if _TEMP_DIR.match(p.name) and p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    return removed
