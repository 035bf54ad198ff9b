"""`bertforge --help`, every verb's `--help` and a mistyped command line answer without importing torch (seconds
of start-up): the parser is built from torch-free modules, the verbs import what they use when they run."""
from __future__ import annotations

import json
import subprocess
import sys

# In a fresh interpreter: run each command line through the console script's entry point and say, for each, whether
# torch had been imported by then (once imported it stays: the first command that imports it is the culprit).
PROBE = r"""
import contextlib, io, json, sys
from bertforge.cli import main

seen = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exit_:
            rc = exit_.code
    seen.append({"argv": argv, "rc": rc, "torch": "torch" in sys.modules, "out": out.getvalue(), "err": err.getvalue()})
print(json.dumps(seen))
"""


def probe(commands: list[list[str]]) -> list[dict]:
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(commands)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_help_of_bertforge_and_of_every_verb_imports_no_torch(verb_parsers):
    paths = sorted({path[:n] for path in verb_parsers for n in range(len(path) + 1)})  # groups too: index, analyze
    results = probe([[*path, "--help"] for path in paths])
    assert len(results) > 30
    for r in results:
        assert r["rc"] == 0 and "usage: bertforge" in r["out"], r
        assert not r["torch"], f"bertforge {' '.join(r['argv'])} imported torch"


def test_argument_errors_import_no_torch(tmp_path):
    bad = tmp_path / "run.json"
    bad.write_text('{"no_such_option": 1}', encoding="utf-8")
    results = probe([
        ["finetune", "--lr", "nan", "--task", "sst2", "--model", "m", "--out", "o"],  # a bound
        ["embed", "--model", "m", "--input", "i.txt"],  # a required flag missing
        ["pretrain", "--recipe", "bort"],  # not a choice
        ["index", "build", "--no-such-flag"],  # not a flag of the verb
        ["no-such-verb"],
        ["finetune", "--config", str(bad), "--task", "sst2", "--model", "m", "--out", "o"],  # a --config key
    ])
    for r in results:
        lines = r["err"].strip().splitlines()
        assert r["rc"] == 2 and len(lines) == 1 and "error:" in lines[0], r
        assert not r["torch"], f"bertforge {' '.join(r['argv'])} imported torch"
