"""Predictions from a fine-tuned directory, one JSON object per input; the task comes from its config.json.

Input formats by kind are listed in `bertforge.tasks.inputs`. Outputs: label + score + probabilities (classify),
score (regress), tokens + tags (tag), answer + span + score + null/no-answer flag (qa), label index +
probabilities (choice); each kind's `predict` in `bertforge.tasks.kinds` formats its records.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bertforge.io.write import atomic_write_text, write_errors


def predict(model_dir: Any, inputs: Any, batch_size: int = 64, device: str = "auto",
            progress: bool = True, precision: str = "fp32", compile: bool = False, text_col: str | None = None,
            text_pair_col: str | None = None, split: str | None = None,
            config: str | None = None) -> list[dict[str, Any]]:
    """Predictions for every example of `inputs`, in input order, on `device` (fp32, or bf16 / fp16 autocast;
    torch.compile'd with `compile`). `model_dir`: a model folder or an opened `ModelFolder`. `inputs`: a file, a
    saved or hub dataset (its `split`; a hub dataset's `config`), or data in memory
    (`bertforge.io.tables.open_table`); `text_col` / `text_pair_col` name its text columns (default: the model's
    own where the input has them, else the usual names)."""
    from bertforge.io.tables import single_source
    from bertforge.model.folder import ModelFolder
    from bertforge.tasks.finetune import fit_task_length
    from bertforge.tasks.folders import saved_task
    from bertforge.tasks.kinds import kind_from_saved
    from bertforge.device import resolve_device
    from bertforge.device import autocast, check_precision, compile_module, move_model

    run_on = resolve_device(device)  # a missing GPU or an impossible precision: before any reading
    check_precision(precision, run_on, allowed=("fp32", "bf16", "fp16"))
    folder = ModelFolder.open(model_dir)
    kind = kind_from_saved(folder.path, *saved_task(folder), text_col=text_col, text_pair_col=text_pair_col)
    fit_task_length(kind, folder, flag=None)  # the length its config.json records must fit its positions
    source = single_source(inputs, split, config)
    examples = kind.read_inputs(source)
    kind.check(examples, source, labelled=False)  # before the model is loaded
    enc = kind.encode(examples, folder.tokenizer())
    model = kind.load(folder)
    compile_module(move_model(model, run_on, f"--model {model_dir}"), compile)
    with autocast(run_on, precision):
        return kind.predict(model, enc, batch_size, progress)


def write_jsonl(records: list[dict[str, Any]], path: str | Path | None) -> None:
    """JSONL to `path` or stdout. A file is replaced atomically; a symlink is written through (the link stays) and
    a device or FIFO in place; a failed write (ENOSPC, EIO) is one BertforgeError naming the path."""
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if path is None:
        with write_errors("<stdout>"):  # flushed here, so a full disk is reported now, not lost at exit
            sys.stdout.write(text)
            sys.stdout.flush()
        return
    atomic_write_text(path, text)
