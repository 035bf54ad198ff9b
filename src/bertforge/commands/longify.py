"""`bertforge longify --model DIR --max-length N --out D [--attention-window W]`: a Longformer made from a BERT or
RoBERTa checkpoint (Longformer's recipe: positions copied to N, global projections from the local ones)."""
from __future__ import annotations

import argparse

from bertforge.commands.bounds import COUNT, LENGTH
from bertforge.commands.options import add_overwrite_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("longify", help="make a long (Longformer) model from a bert / roberta checkpoint",
                       description="Write a Longformer checkpoint for sequences of up to --max-length tokens: the "
                                   "position table is copied over and over to N rows, each layer gets a sliding "
                                   "window and global Q/K/V initialised from its Q/K/V. Continue with `bertforge "
                                   "pretrain --init-from OUT --seq-len N` (MLM on long sequences).")
    p.add_argument("--model", required=True, metavar="DIR", help="a bert or roberta checkpoint (with or without "
                   "its MLM head)")
    p.add_argument("--max-length", required=True, type=LENGTH, metavar="N", help="longest input in tokens, e.g. 4096")
    p.add_argument("--out", required=True, metavar="D", help="output directory (LongformerForMaskedLM layout)")
    p.add_argument("--attention-window", type=COUNT, default=512, metavar="W",
                   help="window per layer, even: each token sees W/2 tokens either side (default 512)")
    add_overwrite_arg(p)
    p.set_defaults(func=longify_command, needs=())


def longify_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from bertforge.api import longify
    from bertforge.errors import BertforgeError

    if Path(args.out).resolve() == Path(args.model).resolve():
        raise BertforgeError(f"--out {args.out} is the --model directory; write the long model elsewhere")
    d = longify(args.model, args.out, max_length=args.max_length, attention_window=args.attention_window,
                overwrite=args.overwrite)
    print(f"{d['out']}: {d['architecture']} from a {d['source']} model; positions {d['positions']}, attention "
          f"window {d['attention_window']} (global Q/K/V from the local ones)")
    print(f"next: bertforge pretrain --init-from {d['out']} --seq-len {d['max_length']} --recipe roberta "
          "--corpus ...  (MLM on long sequences, [CLS] global)")
    return 0
