"""Pruning attention heads (Michel et al. 2019): the heads least important to a fine-tuned model's loss (the
gradient of a head mask, `analysis.importance`) removed a step at a time, a short re-fine-tune, and the model's
metrics and forward seconds before and after, saved with the smaller model as OUT/pruning.json."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


def _forward_seconds(model: Any, enc: Any, batch_size: int) -> float:
    """Seconds of one forward pass over the encoded examples (the model's train/eval mode kept)."""
    from bertforge.tasks.batching import forward_rows

    start = time.perf_counter()
    training = model.training
    forward_rows(model, enc.rows, enc.pad_id, batch_size, ("logits",), progress=False)
    model.train(training)
    return time.perf_counter() - start


def prune_heads(model: str, data: Any, *, task: str, out: Any, fraction: float, step: float, max_examples: int,
                finetune_steps: int, lr: float, eval: Any, batch_size: int, seed: int, device: Any, progress: bool,
                overwrite: bool, columns: dict[str, Any]) -> dict[str, Any]:
    """Prune `fraction` of the heads of the model folder `model` (fine-tuned for `task`), scored on the first
    `max_examples` of `data`'s train split, `step` of them per round; re-fine-tune for `finetune_steps` at `lr`;
    save it to `out` (claimed first: an earlier run there is refused unless `overwrite`) with OUT/pruning.json.
    Metrics and timings are taken before and after on `eval` (default: the dev split of `data`, or the `data`
    file). `columns`: data_config, text_col, text_pair_col, label_col. Returns the report (pruning.json's
    content)."""
    from bertforge.io.rundir import claim_output_dir
    from bertforge.io.write import atomic_write_text

    # claimed before the model is loaded: an earlier run (or a fine-tuned model) in `out` is refused, not replaced
    with claim_output_dir(out, resume=False, overwrite=overwrite, resume_flag=None):
        report = _prune(model, data, task=task, out=out, fraction=fraction, step=step, max_examples=max_examples,
                        finetune_steps=finetune_steps, lr=lr, eval=eval, batch_size=batch_size, seed=seed,
                        device=device, progress=progress, columns=columns)
        atomic_write_text(Path(out) / "pruning.json", json.dumps(report, indent=2) + "\n")
    return report


def _prune(model: str, data: Any, *, task: str, out: Any, fraction: float, step: float, max_examples: int,
           finetune_steps: int, lr: float, eval: Any, batch_size: int, seed: int, device: Any, progress: bool,
           columns: dict[str, Any]) -> dict[str, Any]:
    import torch

    from bertforge.analysis.importance import iterative_mask, load_task_data, prune_masked, short_finetune
    from bertforge.device import move_model
    from bertforge.io.tables import is_splits
    from bertforge.model.folder import ModelFolder
    from bertforge.tasks.models import save_task_model

    torch.manual_seed(seed)
    folder = ModelFolder.open(model)
    net, kind, enc, labels, saved = load_task_data(folder, task, data, split="train", **columns)
    net = move_model(net, device, f"--model {model}")
    tokenizer = folder.tokenizer()
    eval_enc = enc
    evaluation = eval or (kind.split_source(data, "dev", columns["data_config"]) if is_splits(data) else None)
    if evaluation is not None:
        examples = kind.read(evaluation)
        kind.check(examples, evaluation)
        eval_enc = kind.encode(examples, tokenizer)
    before = kind.evaluate(net, eval_enc, batch_size, progress=progress)
    params_before = sum(p.numel() for p in net.parameters())
    secs_before = _forward_seconds(net, eval_enc, batch_size)
    mask = iterative_mask(net, enc, fraction, step, batch_size, max_examples, progress=progress)
    removed = prune_masked(net, mask)
    short_finetune(net, enc, finetune_steps, lr, batch_size, seed=seed, progress=progress)
    after = kind.evaluate(net, eval_enc, batch_size, progress=progress)
    secs_after = _forward_seconds(net, eval_enc, batch_size)
    save_task_model(net, out, labels, {k: v for k, v in saved.items() if k != "kind"}, tokenizer=tokenizer)
    total = int(mask.shape[0] * mask.shape[1])
    # in PruneResult's field order: this is OUT/pruning.json and `PruneResult.to_dict()`
    return dict(fraction=fraction, heads_removed=int(total - mask.sum()), heads_total=total,
                removed={str(k): v for k, v in removed.items()}, heads_per_layer=net.config.heads_per_layer,
                parameters_before=params_before, parameters_after=sum(p.numel() for p in net.parameters()),
                metrics_before=before, metrics_after=after, eval_seconds_before=round(secs_before, 3),
                eval_seconds_after=round(secs_after, 3), speedup=round(secs_before / max(secs_after, 1e-9), 3),
                finetune_steps=finetune_steps, seed=seed)
