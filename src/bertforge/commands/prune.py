"""`bertforge prune --model DIR --task TASK --data PATH --fraction F --out D`: remove attention heads (Michel et al.)."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bertforge.commands.bounds import COUNT, COUNT0, OPEN_FRACTION, POSITIVE
from bertforge.commands.needs import task_needs
from bertforge.commands.options import add_overwrite_arg, add_progress_arg, add_seed_arg, device_of
from bertforge.device import add_device_args
from bertforge.commands.data_options import add_column_args, add_data_args
from bertforge.errors import BertforgeError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prune", help="remove the least important attention heads of a fine-tuned model",
                       description="Score heads by the gradient of a head mask on task data (Michel et al. 2019), "
                                   "mask the least important ones step by step, then remove them physically "
                                   "(smaller matrices, faster). The output is in bertforge's layout: transformers "
                                   "v5 no longer loads pruned heads.")
    p.add_argument("--model", required=True, metavar="DIR", help="a model fine-tuned by `bertforge finetune`")
    p.add_argument("--task", required=True, help="the task it was fine-tuned for (e.g. sst2)")
    add_data_args(p, "labelled task data: a folder of splits (as `finetune --data` takes; heads are scored on its "
                     "train split, metrics taken on its dev split), a saved or Hub dataset, or one file (both)",
                  required=True)
    add_column_args(p)
    p.add_argument("--fraction", required=True, type=OPEN_FRACTION, help="share of all heads to remove, in (0, 1)")
    p.add_argument("--out", required=True, metavar="D", help="output directory for the pruned model")
    p.add_argument("--step", type=OPEN_FRACTION, default=0.1, help="share of heads removed per iteration (default 0.1)")
    p.add_argument("--max-examples", type=COUNT, default=2000, help="examples used to score heads (default 2000)")
    p.add_argument("--finetune-steps", type=COUNT0, default=0, help="optional short re-fine-tune after pruning")
    p.add_argument("--lr", type=POSITIVE, default=2e-5, help="re-fine-tune learning rate (default 2e-5)")
    p.add_argument("--eval", metavar="PATH", help="labelled data to evaluate before and after (default: --data's dev "
                                                   "split, or the --data file)")
    p.add_argument("--batch-size", type=COUNT, default=32)
    add_seed_arg(p, 0, "random seed of the re-fine-tune")
    add_device_args(p, None)
    add_progress_arg(p)
    add_overwrite_arg(p)
    p.set_defaults(func=prune_command, needs=lambda args: task_needs(args.task))  # scored before and after


def _forward_seconds(model, enc, batch_size: int) -> float:
    start = time.perf_counter()
    model_kind_eval = model.training
    from bertforge.tasks.batching import forward_rows
    forward_rows(model, enc.rows, enc.pad_id, batch_size, ("logits",), progress=False)
    model.train(model_kind_eval)
    return time.perf_counter() - start


def prune_command(args: argparse.Namespace) -> int:
    if not 0.0 < args.fraction < 1.0:  # before anything is loaded
        raise BertforgeError(f"--fraction must be between 0 and 1 (exclusive), got {args.fraction}")
    if not 0.0 < args.step <= 1.0:
        raise BertforgeError(f"--step must be in (0, 1], got {args.step}")
    from bertforge.io.write import atomic_write_text
    from bertforge.io.rundir import claim_output_dir

    device_of(args)
    # claimed before the model is loaded: an earlier run (or a fine-tuned model) in --out is refused, not replaced
    with claim_output_dir(args.out, resume=False, overwrite=args.overwrite, resume_flag=None):
        report = _prune(args)
        atomic_write_text(Path(args.out) / "pruning.json", json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    print(f"saved to {args.out} in bertforge's layout (per-layer head counts in config.json); "
          "transformers v5 cannot load pruned heads, load it with bertforge")
    return 0


def _prune(args: argparse.Namespace) -> dict:
    import torch

    from bertforge.analysis.importance import (iterative_mask, load_task_data, prune_masked, short_finetune)
    from bertforge.device import move_model
    from bertforge.io.tables import is_splits
    from bertforge.model.folder import ModelFolder
    from bertforge.tasks.models import save_task_model

    torch.manual_seed(args.seed)
    folder = ModelFolder.open(args.model)
    columns = dict(data_config=args.data_config, text_col=args.text_col, text_pair_col=args.text_pair_col,
                   label_col=args.label_col)
    model, kind, enc, labels, saved = load_task_data(folder, args.task, args.data, split="train", **columns)
    model = move_model(model, device_of(args), f"--model {args.model}")
    tokenizer = folder.tokenizer()
    eval_enc = enc
    evaluation = args.eval or (kind.split_source(args.data, "dev", args.data_config) if is_splits(args.data) else None)
    if evaluation is not None:
        examples = kind.read(evaluation)
        kind.check(examples, evaluation)
        eval_enc = kind.encode(examples, tokenizer)
    before = kind.evaluate(model, eval_enc, args.batch_size, progress=args.progress)
    params_before = sum(p.numel() for p in model.parameters())
    secs_before = _forward_seconds(model, eval_enc, args.batch_size)
    mask = iterative_mask(model, enc, args.fraction, args.step, args.batch_size, args.max_examples,
                          progress=args.progress)
    removed = prune_masked(model, mask)
    short_finetune(model, enc, args.finetune_steps, args.lr, args.batch_size, seed=args.seed, progress=args.progress)
    after = kind.evaluate(model, eval_enc, args.batch_size, progress=args.progress)
    secs_after = _forward_seconds(model, eval_enc, args.batch_size)
    save_task_model(model, args.out, labels, {k: v for k, v in saved.items() if k != "kind"},
                    tokenizer=tokenizer)
    total = int(mask.shape[0] * mask.shape[1])
    report = {"fraction": args.fraction, "heads_removed": int(total - mask.sum()), "heads_total": total,
              "removed": {str(k): v for k, v in removed.items()},
              "heads_per_layer": model.config.heads_per_layer, "parameters_before": params_before,
              "parameters_after": sum(p.numel() for p in model.parameters()),
              "metrics_before": before, "metrics_after": after, "eval_seconds_before": round(secs_before, 3),
              "eval_seconds_after": round(secs_after, 3), "speedup": round(secs_before / max(secs_after, 1e-9), 3),
              "finetune_steps": args.finetune_steps, "seed": args.seed}
    return report
