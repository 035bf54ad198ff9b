"""What many test files share: the shared data folder, and the verbs of the command line.

Real datasets (GLUE, SQuAD, CoNLL-2003, Gutenberg books, WikiText) live outside the repository, in
../shared/data next to it, or wherever $BERTFORGE_SHARED_DATA points. A test that reads them asks the
`shared_data` fixture for a path and is skipped, with the path it wanted, where the data is not there (a fresh
clone); every other test runs.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

import pytest

SHARED_DATA_VAR = "BERTFORGE_SHARED_DATA"


def shared_data_root() -> Path:
    """$BERTFORGE_SHARED_DATA, else ../shared/data next to the repository (not cwd-relative: pytest may run from
    anywhere)."""
    return Path(os.environ.get(SHARED_DATA_VAR) or Path(__file__).resolve().parents[2] / "shared" / "data")


@pytest.fixture
def shared_data() -> Callable[..., Path]:
    """`shared_data("glue", "SST-2")`: that path under the shared data folder, or the test is skipped saying which
    path it needs."""
    def path(*parts: str) -> Path:
        found = shared_data_root().joinpath(*parts)
        if not found.exists():
            pytest.skip(f"needs {found} (the shared data folder: ../shared/data next to the repository, or "
                        f"${SHARED_DATA_VAR})")
        return found
    return path


@pytest.fixture(scope="session")
def verb_parsers() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every verb that runs, by its command path (("finetune",), ("index", "build"), ...) -> its parser, found by
    walking the parser `bertforge.cli` builds, so a verb added later is covered without a change to the tests."""
    from bertforge.cli import build_parser

    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            found[path] = parser
        for action in subs:
            for name, sub in action.choices.items():
                walk(sub, (*path, name))

    walk(build_parser(), ())
    return found


@pytest.fixture
def one_torch_thread():
    """torch on one thread, as the console script runs with OMP_NUM_THREADS=1: sums run in the same order, so a
    result computed here equals the command's bit for bit."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
