"""The `bertforge` command line: one sub-command per verb, each a small function calling the library.

Verbs live in `bertforge.commands.*`; each module exposes `register(subparsers)`.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from bertforge.errors import BertforgeError

COMMAND_MODULES = [
    "bertforge.commands.tokenizer",  # tokenizer train
    "bertforge.commands.model",      # info, fill-mask
    "bertforge.commands.embed",      # embed, index
    "bertforge.commands.pretrain",   # prepare, pretrain, ablate
    "bertforge.commands.finetune",   # finetune, evaluate, predict
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bertforge", description="The BERT family end to end.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except BertforgeError as err:
        print(f"bertforge {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"bertforge {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
