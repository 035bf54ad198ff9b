"""The `bertforge` command line: one sub-command per verb, each a small function calling the library.

Verbs live in `bertforge.commands.*`; each module exposes `register(subparsers)`.
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import importlib
import io
import logging
import os
import re
import signal
import sys
import warnings
from collections.abc import Iterator

from bertforge.commands.needs import check_needs
from bertforge.commands.options import CONFIG_DEST, add_revision_args, apply_config_file, resolve_model_args
from bertforge.errors import ArgumentError, BertforgeError
from bertforge.io.write import is_write_failure, write_failure_reason
from bertforge.io.rundir import check_not_an_input, protect_inputs

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
    "bertforge.commands.ask",        # ask (open-domain QA: retrieve, then read)
    "bertforge.commands.retriever",  # retriever train | export-dpr
]


class OneLineParser(argparse.ArgumentParser):
    """argparse's usage errors as one line naming the flag, like every other error of the CLI (exit 2).

    Sub-commands inherit the class (add_subparsers defaults parser_class to the parent's type)."""

    def error(self, message: str):  # type: ignore[override]
        # "argument --lr: must be > 0 (got nan)" (a bound of bertforge.commands.bounds) -> "--lr must be > 0 ...";
        # an option with aliases ("-k/--top-k") is named as the first
        message = re.sub(r"^argument ([^\s/]+)(?:/\S+)?: must be ", r"\1 must be ", message)
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="bertforge", description="The BERT family end to end.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    add_revision_args(parser)
    return parser


# Options that name what a verb writes, and how an option that names something it reads is recognised: a path
# metavar, or one of the usual input names (for options declared without a metavar, e.g. distill's --student).
# --config FILE is no input here: it is read whole before the verb starts (so OUT/run_options.json may be given
# back to the run it came from), and its values are checked as the verb's options.
OUTPUT_DESTS = ("out", "logging_dir")
PATH_METAVARS = ("DIR", "FILE", "PATH", "D", "IDX")
INPUT_DESTS = ("model", "teacher", "student", "student_init", "init_from", "tokenizer", "corpus", "data", "train",
               "eval", "input", "index", "heldout_corpus", "downstream", "rerank")


def verb_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub-)parser that parsed `args`: followed down through the chosen sub-commands."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or getattr(args, subs[0].dest, None) not in subs[0].choices:
            return parser
        parser = subs[0].choices[getattr(args, subs[0].dest)]


def input_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options of a verb that name files or folders it reads (every one but the output)."""
    found = []
    for a in parser._actions:
        if a.dest in (*OUTPUT_DESTS, CONFIG_DEST) or a.choices is not None or a.type not in (None, str) or a.nargs == 0:
            continue
        metavar = a.metavar if isinstance(a.metavar, str) else ""
        if metavar.split("=")[-1].strip("[]") in PATH_METAVARS or a.dest in INPUT_DESTS:
            found.append(a)
    return found


def verb_inputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[tuple[str, str]]:
    """(flag, path) for every existing input path given to the verb (defaults included; a glob as its matches;
    `NAME=DIR` as DIR). A value naming nothing on disk cannot be damaged (and may be a name: --student layers:3)."""
    inputs = []
    for a in input_actions(verb_parser(parser, args)):
        value = getattr(args, a.dest, None)
        flag = a.option_strings[-1] if a.option_strings else a.dest
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if not isinstance(v, (str, os.PathLike)) or not str(v):
                continue
            v = str(v)
            if not os.path.lexists(v) and "=" in v and os.path.lexists(v.split("=", 1)[1]):
                v = v.split("=", 1)[1]  # serve --model NAME=DIR
            paths = [v] if os.path.lexists(v) else sorted(glob.glob(v, recursive=True))
            inputs += [(flag, p) for p in paths]
    return inputs


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
    argv = sys.argv[1:] if argv is None else list(argv)
    try:  # --config FILE: the file's options become the verb's defaults before the command line is parsed
        apply_config_file(parser, argv)
    except BertforgeError as err:
        print(f"bertforge {' '.join(argv[:1]) or '-'}: error: {err}", file=sys.stderr)
        return 2
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # a usage error (already printed as one line) or --help: a status, as for verbs
        return exit_.code if isinstance(exit_.code, int) else 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    verb = args.command
    try:
        check_needs(args)  # a missing optional library: one line naming its extra, before anything is read
        resolve_model_args(args)  # Hugging Face Hub ids -> local folders (downloaded, or the cache offline)
        inputs = verb_inputs(parser, args)
        with one_line_warnings(verb), protect_inputs(inputs):
            for dest in OUTPUT_DESTS:  # before any work: no verb clears or writes what it reads
                if getattr(args, dest, None):
                    check_not_an_input(getattr(args, dest), inputs, "--" + dest.replace("_", "-"))
            return int(args.func(args) or 0)
    except BrokenPipeError:
        raise  # not an error of the verb: the reader of stdout went away (see main)
    except ArgumentError as err:  # the API's parameter, said as the flag it came from
        print(f"bertforge {verb}: error: {err.as_flag()}", file=sys.stderr)
        return 2
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
        from tqdm import tqdm

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
