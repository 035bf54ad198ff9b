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


def predict(model_dir: str | Path, input_path: str | Path, batch_size: int = 64, device: str = "auto",
            progress: bool = True, precision: str = "fp32", compile: bool = False) -> list[dict[str, Any]]:
    """Predictions for every example in `input_path`, in input order, on `device` (fp32, or bf16 / fp16
    autocast; torch.compile'd with `compile`)."""
    from bertforge.model.folder import inspect_folder
    from bertforge.tasks.finetune import fit_task_length
    from bertforge.tasks.folders import saved_task
    from bertforge.tasks.kinds import kind_from_saved
    from bertforge.model.onnx import onnx_file
    from bertforge.tokenization import Tokenizer
    from bertforge.training import resolve_device
    from bertforge.device import autocast, check_precision, compile_module, move_model

    run_on = resolve_device(device)  # a missing GPU or an impossible precision: before any reading
    check_precision(precision, run_on, allowed=("fp32", "bf16", "fp16"))
    path = inspect_folder(model_dir).path
    kind = kind_from_saved(path, *saved_task(path))
    fit_task_length(kind, path, flag=None)  # the length its config.json records must fit its positions
    examples = kind.read_inputs(Path(input_path))
    kind.check(examples, Path(input_path), labelled=False)  # before the model is loaded
    enc = kind.encode(examples, Tokenizer.from_pretrained(path))
    model = kind.load(onnx_file(model_dir) or path)
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
