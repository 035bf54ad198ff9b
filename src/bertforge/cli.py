"""The `bertforge` command line: one sub-command per verb, each a small function calling the library.

Verbs live in `bertforge.commands.*`; each module exposes `register(subparsers)`.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import logging
import os
import re
import signal
import sys
import warnings
from collections.abc import Iterator

from tqdm import tqdm

from bertforge.errors import BertforgeError
from bertforge.fileio import is_write_failure, write_failure_reason

COMMAND_MODULES = [
    "bertforge.commands.tokenizer",  # tokenizer train
    "bertforge.commands.model",      # info, fill-mask
    "bertforge.commands.generate",   # generate
    "bertforge.commands.embed",      # embed, index
    "bertforge.commands.pretrain",   # prepare, pretrain, ablate
    "bertforge.commands.longify",    # longify (a Longformer from a bert / roberta checkpoint)
    "bertforge.commands.finetune",   # finetune, evaluate, predict
    "bertforge.commands.analyze",    # analyze attention|heads|probe|importance|explain
    "bertforge.commands.prune",      # prune
    "bertforge.commands.serve",      # serve
    "bertforge.commands.distill",    # distill general | task
    "bertforge.commands.compress",   # quantize, export
]


class OneLineParser(argparse.ArgumentParser):
    """argparse's usage errors as one line naming the flag, like every other error of the CLI (exit 2).

    Sub-commands inherit the class (add_subparsers defaults parser_class to the parent's type)."""

    def error(self, message: str):  # type: ignore[override]
        # "argument --lr: must be > 0 (got nan)" (a bound of bertforge.commands.bounds) -> "--lr must be > 0 ..."
        message = re.sub(r"^argument (\S+): must be ", r"\1 must be ", message)
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="bertforge", description="The BERT family end to end.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one verb; returns the exit status (0, 2 for a user error, 130 interrupted, 141 stdout closed early)."""
    try:
        try:
            return _run(argv)
        finally:
            sys.stdout.flush()  # a reader that left early (`| head`) shows here, not at interpreter exit
    except BrokenPipeError:
        _discard_stdout()
        return 128 + signal.SIGPIPE  # what a shell reports for a tool that stopped writing to a closed pipe


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's own flush at exit does not raise BrokenPipeError again."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, io.UnsupportedOperation):  # stdout replaced by an object without a file
        pass


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # a usage error (already printed as one line) or --help: a status, as for verbs
        return exit_.code if isinstance(exit_.code, int) else 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    verb = args.command
    try:
        with one_line_warnings(verb):
            return int(args.func(args) or 0)
    except BrokenPipeError:
        raise  # not an error of the verb: the reader of stdout went away (see main)
    except BertforgeError as err:
        print(f"bertforge {verb}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # safety net: verbs raise BertforgeError themselves, but a missed path is still one line
        where = f"{err.filename}: " if err.filename else ""
        print(f"bertforge {verb}: error: {where}{write_failure_reason(err)}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        if not is_write_failure(err):  # torch's writer on a full disk; any other RuntimeError is a bug: traceback
            raise
        print(f"bertforge {verb}: error: cannot write a file: {write_failure_reason(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"bertforge {verb}: interrupted", file=sys.stderr)
        return 130


class _WarningLines(logging.Handler):
    """Prints log records and Python warnings as "bertforge VERB: warning: MESSAGE", each message once.

    Library code reports a data problem both through logging (for applications) and warnings.warn (for tests
    and callers that filter); on the command line that is one event, so the second report is dropped.
    """

    def __init__(self, verb: str):
        super().__init__(logging.WARNING)
        self.verb = verb
        self.seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        self.show(record.getMessage(), record.levelname.lower())

    def showwarning(self, message, category, filename, lineno, file=None, line=None) -> None:
        self.show(str(message), "warning")

    def show(self, message: str, level: str) -> None:
        message = " ".join(message.split())  # one line, whatever the source
        if message in self.seen:
            return
        self.seen.add(message)
        # tqdm.write clears an active progress bar first, so the warning starts its own line.
        tqdm.write(f"bertforge {self.verb}: {level}: {message}", file=sys.stderr)
        sys.stderr.flush()


@contextlib.contextmanager
def one_line_warnings(verb: str) -> Iterator[None]:
    """Route bertforge's log warnings and Python warnings to one line each for the duration of a verb."""
    handler = _WarningLines(verb)
    logger = logging.getLogger("bertforge")
    saved = logger.propagate, warnings.showwarning
    logger.addHandler(handler)
    logger.propagate = False  # a root handler (logging.basicConfig) would print the same record again
    warnings.showwarning = handler.showwarning
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate, warnings.showwarning = saved


if __name__ == "__main__":
    sys.exit(main())
