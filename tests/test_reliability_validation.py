"""Reliability (issue #33, validation): nonsense input is one line naming the flag / file / field, before any work.

The CLI cases run the installed console script (`cli`, `one_line` from tests/test_reliability.py); the table of
numeric flags walks the parsers bertforge.cli builds, so a verb or flag added later is covered without a new test.
"""
from __future__ import annotations

import argparse
import json

import pytest
import torch

from bertforge import cli as bertforge_cli
from bertforge.commands.bounds import Number
from tests.test_reliability import cli, one_line


# ---- every numeric flag of every verb --------------------------------------------------------------------------
def _verbs(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(argv prefix, parser) for every verb and sub-verb."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _verbs(sub, (*path, name))


def _numeric_flags():
    for path, parser in _verbs(bertforge_cli.build_parser()):
        for action in parser._actions:
            if action.option_strings and (action.type in (int, float) or isinstance(action.type, Number)):
                yield path, action


NUMERIC = [(path, action) for path, action in _numeric_flags()]


def test_every_numeric_flag_declares_its_bounds():
    assert len(NUMERIC) > 100  # the walk reaches every verb (finetune, index build, analyze heads, ...)
    unbounded = [f"{' '.join(path)} {action.option_strings[0]}" for path, action in NUMERIC
                 if not isinstance(action.type, Number)]
    assert unbounded == [], f"declare a bound (bertforge.commands.bounds) for: {unbounded}"


@pytest.mark.parametrize("path,action", NUMERIC, ids=[f"{' '.join(p)} {a.option_strings[0]}" for p, a in NUMERIC])
def test_bad_values_of_a_numeric_flag_are_one_line_naming_it(path, action, capsys):
    flag = action.option_strings[0]
    for bad in action.type.bad_values():
        # parse-only: argparse refuses the value before the verb runs (main returns the status)
        assert bertforge_cli.main([*path, f"{flag}={bad}"]) == 2, (flag, bad)
        err = capsys.readouterr().err.strip().splitlines()
        head = f"bertforge {' '.join(path)}: error: {flag} must be "
        assert len(err) == 1 and err[0].startswith(head) and bad in err[0], (flag, bad, err)
    # the declared default lies within the bound, and a value inside it is taken as a number
    if action.default is not None:
        assert action.type(str(action.default)) == action.default, (flag, action.default)
    assert isinstance(action.type(action.type.good_value()), (int, float))


def test_the_named_nonsense_of_the_issue_is_refused_by_the_console_script():
    one_line(cli("pretrain", "--eval-batches", "0"), "pretrain: error: --eval-batches must be at least 1 (got 0)")
    one_line(cli("finetune", "--lr", "nan"), "--lr must be a finite number > 0 (got nan)")
    one_line(cli("export", "--opset", "1"), "--opset must be in 14..20 (got 1)")
    # the rest of the issue's list (prune --max-examples 0, embed-train --max-steps 0, tokenizer train
    # --min-frequency -1, analyze heads --max-sentences 0) is in the in-process walk above
