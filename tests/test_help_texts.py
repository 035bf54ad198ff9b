"""Help texts speak to users: `bertforge --help` and every verb's (and sub-verb's) `--help` hold no words that only
make sense inside the project's own history (issue numbers, "session", "round", "the seeds' tables")."""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bertforge.cli import build_parser, main

BERTFORGE = shutil.which("bertforge", path=str(Path(sys.executable).parent)) or shutil.which("bertforge")
JARGON = re.compile(r"\bissues?\b|#\d|\bseeds'|\bsessions?\b|\brounds?\b(?!-)|\blanded\b|\bfiled\b|%%", re.I)


def _verbs(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path: ("tokenizer",), ("tokenizer", "train"), ... from the parser itself, so a verb added
    later is checked without a change here."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.append((*path, name))
                out.extend(_verbs(sub, (*path, name)))
    return out


VERBS = _verbs(build_parser())


def test_every_verb_is_found():
    assert {("ablate",), ("serve",), ("generate",), ("index", "query"), ("analyze", "probe"),
            ("distill", "task"), ("tokenizer", "train")} <= set(VERBS) and len(VERBS) > 25


def test_top_level_help_through_the_console_script_says_what_ablate_is():
    assert BERTFORGE, "the bertforge console script is not installed"
    for args in (["--help"], ["ablate", "--help"]):
        proc = subprocess.run([BERTFORGE, *args], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "COLUMNS": "200"})
        assert proc.returncode == 0, proc.stderr
        assert not JARGON.search(proc.stdout), JARGON.search(proc.stdout)
    top = subprocess.run([BERTFORGE, "--help"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "200"}).stdout
    line = next(line for line in top.splitlines() if line.split()[:1] == ["ablate"])
    assert "BERT, RoBERTa, ALBERT, ELECTRA, SpanBERT and DeBERTa-v3 papers' ablation tables" in line


@pytest.mark.parametrize("verb", VERBS, ids=" ".join)
def test_verb_help_has_no_project_jargon(verb, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one line per sentence: no word split over two lines
    assert main([*verb, "--help"]) == 0  # main returns argparse's status (0 for --help)
    text = capsys.readouterr().out
    assert text.startswith(f"usage: bertforge {' '.join(verb)}")
    found = JARGON.search(text)
    context = text[max(0, found.start() - 80):found.end() + 80] if found else ""
    assert not found, f"bertforge {' '.join(verb)} --help: {found.group(0)!r} in ...{context}..."
