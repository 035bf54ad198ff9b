"""`bertforge prune --model DIR --task TASK --data PATH --fraction F --out D`: remove attention heads (Michel et al.)."""
from __future__ import annotations

import argparse
import json

from bertforge.commands.bounds import COUNT, COUNT0, INNER_FRACTION, OPEN_FRACTION, POSITIVE
from bertforge.commands.needs import task_needs
from bertforge.commands.options import add_overwrite_arg, add_progress_arg, add_seed_arg
from bertforge.device import add_device_args
from bertforge.commands.data_options import add_column_args, add_data_args


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
    p.add_argument("--fraction", required=True, type=INNER_FRACTION, help="share of all heads to remove, in (0, 1)")
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


def prune_command(args: argparse.Namespace) -> int:
    from bertforge.api import prune

    result = prune(args.model, args.data, task=args.task, out=args.out, fraction=args.fraction, step=args.step,
                   max_examples=args.max_examples, finetune_steps=args.finetune_steps, lr=args.lr, eval=args.eval,
                   batch_size=args.batch_size, seed=args.seed, device=args.device, progress=args.progress,
                   overwrite=args.overwrite, data_config=args.data_config, text_col=args.text_col,
                   text_pair_col=args.text_pair_col, label_col=args.label_col)
    print(json.dumps(result.to_dict(), indent=2))
    print(f"saved to {args.out} in bertforge's layout (per-layer head counts in config.json); "
          "transformers v5 cannot load pruned heads, load it with bertforge")
    return 0
