"""`bertforge distill general | task`: DistilBERT-style general distillation and task distillation."""
from __future__ import annotations

import argparse
import json
import sys

from bertforge.commands.needs import task_needs, tracker_needs
from bertforge.commands.options import (add_config_arg, add_overwrite_arg, add_progress_arg, add_seed_arg,
                                        add_tracking_args)
from bertforge.commands.data_options import add_column_args, add_corpus_column_arg, add_data_args
from bertforge.device import TRAINING_PRECISIONS, add_device_args
from bertforge.commands.bounds import COUNT, COUNT0, EPOCHS, FRACTION, LENGTH, NONNEG, OPEN_FRACTION, POSITIVE, STEPS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("distill", help="distil a teacher into a smaller student (general | task)",
                       description="Knowledge distillation: `general` (DistilBERT's triple loss on raw text) or "
                                   "`task` (soft targets of a fine-tuned teacher). See docs/distillation.md.")
    dsub = p.add_subparsers(dest="distill_command", metavar="MODE")

    g = dsub.add_parser("general", help="DistilBERT: soft MLM targets + MLM + hidden-state cosine on a corpus")
    g.add_argument("--teacher", required=True, metavar="DIR", help="a masked LM (BertForMaskedLM / ForPreTraining)")
    g.add_argument("--corpus", required=True, nargs="+", metavar="PATH",
                   help=".txt / .jsonl / .csv / .tsv / .json / .parquet files, save_to_disk folders, or folders of them")
    add_corpus_column_arg(g)
    g.add_argument("--out", required=True, metavar="DIR")
    g.add_argument("--student-layers", type=COUNT, help="student depth (default: half the teacher's, every other "
                                                      "layer copied)")
    g.add_argument("--student-init", metavar="DIR", help="start from this masked LM instead (same vocabulary)")
    g.add_argument("--random-init", action="store_true", help="the same student shape, randomly initialised "
                                                              "(the from-scratch baseline)")
    budget = g.add_mutually_exclusive_group(required=True)
    budget.add_argument("--max-steps", type=STEPS)
    budget.add_argument("--time-budget", metavar="DUR", help="wall clock, e.g. 30m, 1h")
    g.add_argument("--alpha-ce", type=NONNEG, default=5.0)
    g.add_argument("--alpha-mlm", type=NONNEG, default=2.0)
    g.add_argument("--alpha-cos", type=NONNEG, default=1.0)
    g.add_argument("--temperature", type=POSITIVE, default=2.0)
    g.add_argument("--ce-positions", choices=("all", "masked"), default="all",
                   help="where the soft loss is taken: every real token (DistilBERT) or the masked ones")
    g.add_argument("--seq-len", type=LENGTH, metavar="N",
                   help="block length (default: 128, or the teacher's positions if fewer; longer is refused)")
    g.add_argument("--batch-size", type=COUNT, default=32)
    g.add_argument("--lr", type=POSITIVE, default=5e-4)
    g.add_argument("--max-blocks", type=COUNT, help="use at most this many blocks of the corpus")
    g.add_argument("--heldout-fraction", type=OPEN_FRACTION, default=0.05, metavar="F",
                   help="without --heldout-corpus: the corpus' share held out for the MLM accuracy (default: 0.05)")
    g.add_argument("--heldout-corpus", nargs="+", metavar="PATH",
                   help="held-out text for the MLM accuracy (default: the corpus' last --heldout-fraction)")
    g.add_argument("--teacher-precision", choices=("fp32", "bf16"), default="fp32")
    add_device_args(g, TRAINING_PRECISIONS, None, "training autocast", device=False)
    add_seed_arg(g)
    add_device_args(g, None)
    g.add_argument("--save-every", type=COUNT, metavar="N", help="checkpoint every N steps (default: at the end)")
    g.add_argument("--resume", action="store_true", help="continue the interrupted run in --out")
    add_overwrite_arg(g, resume=True)
    add_progress_arg(g, default=False)
    add_tracking_args(g)
    add_config_arg(g)
    g.set_defaults(func=general_command, needs=tracker_needs)

    t = dsub.add_parser("task", help="soft targets of a fine-tuned teacher -> layers:N, bilstm or a pretrained DIR")
    t.add_argument("--teacher", required=True, metavar="DIR", help="a model fine-tuned by `bertforge finetune`")
    t.add_argument("--task", required=True, help="the teacher's task (sst2, stsb, conll2003, or a kind name)")
    add_data_args(t, "a folder of splits (as `finetune --data` takes), a saved DatasetDict, a Hugging Face Hub "
                     "dataset id (with --data-config), or one training file", required=True)
    t.add_argument("--out", required=True, metavar="DIR")
    t.add_argument("--student", default="layers:3", help="layers:N (teacher layers spread evenly), bilstm, or a "
                                                         "pretrained encoder DIR with the teacher's vocabulary")
    t.add_argument("--alpha", type=FRACTION, default=0.5, help="weight of the soft loss; 1 - alpha on the labels")
    t.add_argument("--temperature", type=POSITIVE, default=2.0)
    t.add_argument("--epochs", type=EPOCHS, default=3.0)
    t.add_argument("--max-steps", type=STEPS)
    t.add_argument("--lr", type=POSITIVE, help="default 5e-5 (transformer), 1e-3 (bilstm)")
    t.add_argument("--batch-size", type=COUNT, default=32)
    t.add_argument("--max-seq-len", type=LENGTH)
    t.add_argument("--train-limit", type=COUNT, help="first N training examples")
    t.add_argument("--limit", type=COUNT, dest="eval_limit", help="first N evaluation examples")
    add_column_args(t, "classify/regress: ")
    t.add_argument("--augment", type=COUNT0, default=0, help="bilstm: augmented variants per example (paper: 20)")
    t.add_argument("--p-mask", type=FRACTION, default=0.1)
    t.add_argument("--p-ng", type=FRACTION, default=0.25)
    t.add_argument("--bilstm-hidden", type=COUNT, default=300)
    t.add_argument("--teacher-precision", choices=("fp32", "bf16"), default="fp32")
    add_device_args(t, TRAINING_PRECISIONS, None, "training autocast (a bilstm student: fp32)", device=False)
    add_seed_arg(t, 42)
    add_device_args(t, None)
    t.add_argument("--save-every", type=COUNT, metavar="N", help="checkpoint every N steps (default: every epoch)")
    t.add_argument("--resume", action="store_true", help="continue the interrupted run in --out")
    add_overwrite_arg(t, resume=True)
    add_progress_arg(t, default=False)
    add_tracking_args(t)
    add_config_arg(t)
    t.set_defaults(func=task_command, needs=lambda args: (*task_needs(args.task), *tracker_needs(args)))


def _run(args: argparse.Namespace, task_mode: bool, **given) -> int:
    """Distil with the parsed flags of the same names as the config's fields; print the run's record."""
    from bertforge.api import distill
    from bertforge.api.choices import distill_options

    keys = distill_options(task_mode)
    options = {k: v for k, v in vars(args).items() if k in keys}
    result = distill(args.teacher, out=args.out, **given, **options)
    print(json.dumps(result.to_dict(), indent=2))
    print(f"-> {args.out}", file=sys.stderr)
    return 0


def general_command(args: argparse.Namespace) -> int:
    return _run(args, False, data=args.corpus)


def task_command(args: argparse.Namespace) -> int:
    return _run(args, True, data=args.data, task=args.task)
