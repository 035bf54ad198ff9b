"""Optional libraries: every verb declares what it needs beyond bertforge's own dependencies
(`bertforge.commands.needs`), `cli` checks it right after parsing, and a missing one is one line naming the extra
to install, before anything is read or written. The extras hidden here are hidden in a child process (None in
sys.modules: an import raises ModuleNotFoundError, importlib.util.find_spec finds nothing), as in an environment
without them."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bertforge.commands.needs import EXTRAS, Need
from test_finetune_cli import base, write_sst  # noqa: F401 (fixture)

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
TRACKERS = ("tensorboard", "mlflow")  # --report-to's extras, checked by training.reporting

# Runs each command line of a JSON list through the console script's entry point with the named modules hidden,
# and writes [{"argv", "rc", "stderr"}] to a file outside the working folder.
RUNNER = r"""
import contextlib, io, json, sys, traceback

hidden, commands, report = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
for name in filter(None, hidden.split(",")):
    sys.modules[name] = None  # import name: ModuleNotFoundError; importlib.util.find_spec(name): None
from bertforge.cli import main

results = []
for argv in commands:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exit_:
            rc = exit_.code
        except BaseException:
            rc = "traceback"
            traceback.print_exc()
    results.append({"argv": argv, "rc": rc, "stderr": err.getvalue()})
with open(report, "w") as fh:
    json.dump(results, fh)
"""


def run_hidden(modules, commands: list[list[str]], cwd: Path, report: Path) -> list[dict]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", RUNNER, ",".join(sorted(modules)), json.dumps(commands), str(report)],
                          cwd=cwd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(report.read_text())


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# ---- the declarations ----------------------------------------------------------------------------------------------
def test_every_verb_declares_its_needs(verb_parsers):
    for path, parser in verb_parsers.items():
        needs = parser.get_default("needs")
        assert needs is not None, f"{' '.join(path)}: declare needs=... (() for none) in its set_defaults"
        assert callable(needs) or all(isinstance(n, Need) for n in needs), path


def test_the_declared_libraries_are_pyprojects_extras():
    from bertforge.training.reporting import _NEEDS as tracker_needs

    extras = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["optional-dependencies"]

    def packages(requirements: list[str]) -> set[str]:
        return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in requirements}

    for extra, libraries in EXTRAS.items():
        assert extra in extras, extra
        assert {p.lower() for p in libraries.values()} <= packages(extras[extra]), extra
        for module in libraries:  # the test environment has every extra: each module name is the one that imports
            assert importlib.util.find_spec(module) is not None, (extra, module)
    assert set(extras) - {"test", "bench"} == set(EXTRAS) | {extra for *_, extra in tracker_needs.values()}
    with pytest.raises(ValueError, match="not a library of the extra"):
        Need("serve", "faiss", "a verb")


# ---- each extra hidden: one line, nothing written ------------------------------------------------------------------
# (command line, the extra its message names). The paths name nothing: the check comes before any of them is read.
MISSING = [
    (["ask", "--index", "no-such-index", "--reader", "r", "who?"], "embed"),  # a folder without meta.json: dense
    (["retriever", "train", "--model", "m", "--train", "t", "--out", "o"], "retrieval"),
    (["finetune", "--task", "mrpc", "--model", "m", "--data", "d", "--out", "o"], "tasks"),
    (["finetune", "--task", "classify", "--model", "m", "--data", "d", "--out", "o"], "tasks"),
    (["finetune", "--task", "stsb", "--model", "m", "--data", "d", "--out", "o"], "tasks"),
    (["evaluate", "--task", "conll", "--model", "m", "--data", "d"], "tasks"),
    (["prune", "--model", "m", "--task", "cola", "--data", "d", "--fraction", "0.5", "--out", "o"], "tasks"),
    (["distill", "task", "--teacher", "m", "--task", "regress", "--data", "d", "--out", "o"], "tasks"),
    (["ablate", "--table", "bert", "--out", "o"], "tasks"),
    (["finetune", "--task", "seq2seq", "--model", "m", "--data", "d", "--out", "o"], "seq2seq"),
    (["evaluate", "--task", "seq2seq", "--model", "m", "--data", "d"], "seq2seq"),
    (["embed-eval", "--model", "m", "--sts", "s.tsv"], "embed"),
    (["embed-train", "--model", "m", "--train", "t.tsv", "--eval", "e.tsv", "--out", "o"], "embed"),
    (["index", "build", "--model", "m", "--corpus", "c.txt", "--out", "o"], "embed"),
    (["index", "add", "--index", "i", "--corpus", "c.txt"], "embed"),
    (["index", "query", "--index", "i", "a question"], "embed"),
    (["index", "build", "--method", "bm25", "--corpus", "c.txt", "--out", "o"], "retrieval"),
    (["index", "build", "--model", "m", "--corpus", "c.txt", "--out", "o", "--ray"], "ray"),
    (["analyze", "attention", "--model", "m", "--text", "t", "--out", "o.png"], "analysis"),
    (["analyze", "heads", "--model", "m", "--input", "f.txt", "--out", "o"], "analysis"),
    (["analyze", "probe", "--model", "m", "--task", "pos", "--data", "d", "--out", "o"], "analysis"),
    (["analyze", "importance", "--model", "m", "--task", "sst2", "--data", "d", "--out", "o"], "analysis"),
    (["analyze", "explain", "--model", "m", "--text", "t", "--out", "o.html"], "analysis"),
    (["serve", "--model", "m"], "serve"),
    (["export", "--model", "m", "--out", "o"], "export"),
    (["finetune", "--config", "run.yaml", "--task", "sst2", "--model", "m", "--data", "d", "--out", "o"], "yaml"),
    (["pretrain", "--config", "run.yaml", "--out", "o"], "yaml"),
    (["pretrain", "--report-to", "tensorboard", "--out", "o"], "tensorboard"),
    (["embed-train", "--model", "m", "--train", "t.tsv", "--out", "o", "--report-to", "tensorboard"], "tensorboard"),
    (["finetune", "--task", "sst2", "--model", "m", "--data", "d", "--out", "o", "--report-to", "mlflow"], "mlflow"),
    (["distill", "general", "--teacher", "m", "--corpus", "c.txt", "--out", "o", "--max-steps", "1",
      "--report-to", "mlflow"], "mlflow"),
    (["embed", "--model", "m", "--input", "in.parquet", "--out", "o.npy"], "data"),
    (["finetune", "--task", "sst2", "--model", "m", "--data", "nyu-mll/glue", "--data-config", "sst2", "--out", "o"],
     "data"),
]


def test_the_walk_covers_every_verb_with_a_need_and_every_extra(verb_parsers):
    walked = {next(p for p in (tuple(argv[:2]), tuple(argv[:1])) if p in verb_parsers) for argv, _ in MISSING}
    with_needs = {path for path, parser in verb_parsers.items() if parser.get_default("needs") != ()}
    assert with_needs <= walked, f"add a command line of these verbs to MISSING: {sorted(with_needs - walked)}"
    # plot (matplotlib for pretrain's curves.png) is needed by no verb: without it the curves are skipped, with a note
    assert {extra for _, extra in MISSING} == (set(EXTRAS) - {"plot"}) | set(TRACKERS)


@pytest.mark.parametrize("extra", sorted({extra for _, extra in MISSING}))
def test_a_missing_extra_is_one_line_naming_it_before_any_work(extra, tmp_path):
    work, report = tmp_path / "work", tmp_path / "report.json"
    work.mkdir()
    (work / "run.yaml").write_text("seed: 1\n", encoding="utf-8")  # a --config file exists: its reader is what fails
    modules = EXTRAS.get(extra, {extra: extra})  # a tracker's extra: its module has its name
    commands = [argv for argv, named in MISSING if named == extra]
    for result in run_hidden(modules, commands, work, report):
        lines = result["stderr"].strip().splitlines()
        assert result["rc"] == 2 and len(lines) == 1, result
        assert lines[0].startswith(f"bertforge {result['argv'][0]}: error: ") and \
            lines[0].endswith(f"pip install 'bertforge[{extra}]'"), result
        assert files_under(work) == ["run.yaml"], result  # nothing created, claimed or written


# ---- what a verb does not declare, it does not need ------------------------------------------------------------------
def test_verbs_that_need_no_extra_run_with_every_extra_hidden(base, tmp_path):  # noqa: F811 (fixture)
    every = {module for libraries in EXTRAS.values() for module in libraries} | set(TRACKERS)
    sst = write_sst(tmp_path / "sst", 24, 8)
    (tmp_path / "texts.txt").write_text("a good movie\nthe plot was dull\n", encoding="utf-8")
    (tmp_path / "corpus.txt").write_text("the movie was good\n\nthe plot was dull\n" * 20, encoding="utf-8")
    commands = [
        ["tokenizer", "train", "--corpus", "corpus.txt", "--vocab-size", "60", "--out", "tok"],
        ["info", str(base)],
        ["embed", "--model", str(base), "--input", "texts.txt", "--out", "vectors.npy", "--no-progress"],
        ["finetune", "--task", "sst2", "--model", str(base), "--data", str(sst), "--out", "ft", "--max-steps", "2",
         "--batch-size", "8", "--no-progress"],
        ["evaluate", "--task", "sst2", "--model", "ft", "--data", str(sst), "--no-progress"],
        ["predict", "--model", "ft", "--input", "texts.txt", "--out", "predictions.jsonl", "--no-progress"],
        ["quantize", "--model", "ft", "--out", "int8"],
        ["analyze", "attention", "--model", str(base), "--text", "a good movie", "--out", "attention.html"],
    ]
    for result in run_hidden(every, commands, tmp_path, tmp_path / "report.json"):
        assert result["rc"] == 0, result
    assert len((tmp_path / "predictions.jsonl").read_text().splitlines()) == 2
