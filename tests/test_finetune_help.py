"""`bertforge finetune --help`: its flags in sections (what every run takes, then each task family's own), the
first example a user's own CSV with a Hub model, no example that needs data from elsewhere, and every flag (name,
default) exactly as before: the flags are a contract (run_options.json, --config files, scripts)."""
from __future__ import annotations

import argparse
import re

import pytest

from bertforge.cli import build_parser, main

# Every flag of finetune with its default, in the order declared (the usage line's order).
FLAGS = {
    '--model': None, '--out': None, '--task': None, '--data': None, '--data-config': None, '--train': None,
    '--eval': None, '--text-col': None, '--text-pair-col': None, '--label-col': None, '--max-seq-len': None,
    '--source-col': 'source', '--target-col': 'target', '--max-target-len': 128, '--num-beams': 1,
    '--eval-batch-size': 64, '--limit': None, '--device': 'auto', '--no-compile': None, '--no-progress': True,
    '--epochs': None, '--max-steps': None, '--lr': None, '--batch-size': 32, '--warmup-ratio': 0.1,
    '--weight-decay': 0.01, '--seed': 42, '--runs': 1, '--train-limit': None, '--labels': (), '--method': 'finetune',
    '--freeze': False, '--features': 'concat_last4', '--head': 'linear', '--precision': None,
    '--no-group-by-length': True, '--resume': False, '--overwrite': False, '--doc-stride': 128,
    '--max-query-length': 64, '--index': None, '--retriever': None, '--top-k': None, '--max-answer-len': 30,
    '--train-retriever': False,
    '--generator': None, '--rag-kind': 'token', '--freeze-retriever': False, '--report-to': None,
    '--logging-dir': None, '--config': None, '--revision': None,
}
SECTIONS = ["options", "model, task, data and output", "training", "classification and regression",
            "token classification",
            "extractive question answering", "open-domain QA", "seq2seq", "rag / fid", "experiment tracking",
            "device, precision and progress"]
CSV_EXAMPLE = ("bertforge finetune --task classify --model sentence-transformers/all-MiniLM-L6-v2 --train my.csv "
               "--text-col text --label-col label --out runs/my")


@pytest.fixture(scope="module")
def finetune_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["finetune"]


@pytest.fixture(scope="module")
def help_text() -> str:
    import contextlib
    import io
    import os

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "200"  # one line per flag's help: the listing is read line by line below
    try:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["finetune", "--help"]) == 0
    finally:
        if saved is None:
            os.environ.pop("COLUMNS")
        else:
            os.environ["COLUMNS"] = saved
    return out.getvalue()


def test_the_flags_and_their_defaults_are_unchanged(finetune_parser):
    got = {a.option_strings[-1]: a.default for a in finetune_parser._actions if a.dest != "help"}
    assert list(got) == list(FLAGS) and got == FLAGS


def _sections(text: str) -> dict[str, list[str]]:
    """Each section title of the help (up to its first " (" or ":") -> the flags listed in it."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":") and line != "examples:":
            current = re.split(r" \(|:$", line)[0]
            sections[current] = []
        elif line == "examples:":
            current = None
        elif current is not None and re.match(r"  -", line):  # a flag's entry (its help may follow on the line)
            entry = re.split(r"\s{2,}", line.strip())[0]
            sections[current] += [f.split()[0] for f in entry.split(", ")]
    return sections


def test_help_groups_the_flags_by_task_family_and_lists_each_flag_once(help_text):
    sections = _sections(help_text)
    assert list(sections) == SECTIONS
    listed = [flag for flags in sections.values() for flag in flags]
    assert sorted(listed) == sorted({*FLAGS, "-h", "--help", "-k", "--compile", "--marginalise"}), listed
    assert len(listed) == len(set(listed))  # each flag once
    assert {"--text-col", "--label-col", "--freeze"} <= set(sections["classification and regression"])
    assert sections["token classification"] == ["--labels"]
    assert sections["extractive question answering"] == ["--doc-stride", "--max-query-length"]
    assert {"--index", "--top-k", "--max-answer-len"} <= set(sections["open-domain QA"])
    assert {"--report-to", "--logging-dir"} == set(sections["experiment tracking"])
    assert {"--device", "--precision", "--compile", "--no-compile", "--no-progress"} == set(
        sections["device, precision and progress"])


def test_the_first_example_is_a_users_own_csv_with_a_hub_model(help_text, finetune_parser):
    examples = help_text.split("\nexamples:\n", 1)[1]
    commands = [line.strip() for line in examples.splitlines() if line.strip().startswith("bertforge ")]
    assert commands[0] == CSV_EXAMPLE
    assert "../shared" not in help_text  # every example runs on the user's own files or a Hub dataset
    args = build_parser().parse_args(CSV_EXAMPLE.split()[1:])  # the example is a valid command line
    assert (args.task, args.model, args.train, args.text_col, args.label_col, args.data) == (
        "classify", "sentence-transformers/all-MiniLM-L6-v2", "my.csv", "text", "label", None)
    model = next(a for a in finetune_parser._actions if a.dest == "model")
    assert model.metavar == "MODEL" and "a folder" in model.help and "Hub id" in model.help
