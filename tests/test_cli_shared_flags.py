"""The shared flags mean the same on every verb where they apply, and "applies" follows from what the verb does:

  --no-progress  a verb that loops over a data set or corpus and shows progress bars while it does
  --device       a verb that runs a model (forward passes: training, encoding, predicting, analysing, serving)
  --precision    a verb that trains, or whose outputs are computed at a precision the user chooses (analyses and
                 fill-mask read exact fp32 probabilities and gradients; `index add` / `query` encode at the
                 precision the index was built with)
  --seed         a verb that draws random numbers (training, sampling, a re-fine-tune, probes)
  --overwrite    a verb that writes an output folder (a claimed --out: refused when it holds files, without it)
  --config       a verb that trains (long runs with many options, reproduced from an earlier run_options.json)

Each flag is declared once (`bertforge.commands.options`, `bertforge.device.add_device_args`), so its name, dest,
type and wording are the same wherever it appears.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from bertforge.cli import main
from bertforge.commands.bounds import SEED
from bertforge.commands.options import CONFIG_DEST
from test_finetune_cli import base, write_sst  # noqa: F401 (fixture)

SRC = Path(__file__).resolve().parents[1] / "src" / "bertforge"

# What each verb does. L: loops over data with progress bars; M: runs a model; P: trains or computes at a chosen
# precision; R: draws random numbers; W: writes an output folder; T: trains.
DOES = {
    "tokenizer train": "L W", "info": "", "fill-mask": "M", "generate": "M P R",
    "embed": "L M P", "embed-train": "L M P R W T", "embed-eval": "L M P",
    "index build": "L M P W", "index add": "L M", "index query": "M",
    "prepare": "L W", "pretrain": "L M P R W T", "ablate": "M P R W T",  # ablate prints a line per arm, no bars
    "longify": "W", "finetune": "L M P R W T", "evaluate": "L M P", "predict": "L M P",
    "analyze attention": "M", "analyze heads": "L M W", "analyze probe": "L M R W", "analyze importance": "L M W",
    "analyze explain": "M", "prune": "L M R W", "serve": "M P",
    "distill general": "L M P R W T", "distill task": "L M P R W T", "quantize": "W", "export": "W",
    "ask": "L M",
    "retriever train": "L M P R W T", "retriever export-dpr": "W",
}
FLAGS = {"L": "--no-progress", "M": "--device", "P": "--precision", "R": "--seed", "W": "--overwrite", "T": "--config"}


def _action(parser, flag: str):
    return next((a for a in parser._actions if flag in a.option_strings), None)


def test_every_verb_says_what_it_does(verb_parsers):
    assert {" ".join(path) for path in verb_parsers} == set(DOES), "classify the new verb in DOES"


@pytest.mark.parametrize("trait", sorted(FLAGS))
def test_a_shared_flag_is_on_exactly_the_verbs_it_applies_to(trait, verb_parsers):
    flag = FLAGS[trait]
    wrong = {" ".join(path): "missing" if trait in DOES[" ".join(path)] else "not applicable"
             for path, parser in verb_parsers.items()
             if (_action(parser, flag) is not None) != (trait in DOES[" ".join(path)])}
    assert not wrong, f"{flag}: {wrong}"


def test_each_shared_flag_has_one_meaning(verb_parsers):
    seen: dict[str, set] = {flag: set() for flag in FLAGS.values()}
    for parser in verb_parsers.values():
        for flag in FLAGS.values():
            a = _action(parser, flag)
            if a is None:
                continue
            kind = (a.dest, a.metavar, a.type, a.nargs, a.const)
            if flag == "--overwrite":  # worded once, naming the verb's own --out
                kind += (a.help.split(" (")[0].replace("--out", "OUT").replace("--index", "OUT"),)
            if flag in ("--no-progress", "--config", "--device"):
                kind += (a.help,)
            seen[flag].add(kind)
    assert seen["--no-progress"] == {("progress", None, None, 0, False, "no progress bars"),
                                     ("progress", None, None, 0, None, "progress bars (default: none)")}, seen
    assert {k[:3] for k in seen["--device"]} == {("device", "DEV", None)}
    assert len(seen["--device"]) == 1 and {k[0] for k in seen["--precision"]} == {"precision"}
    assert {k[:3] for k in seen["--seed"]} == {("seed", "S", SEED)}
    assert seen["--overwrite"] == {("overwrite", None, None, 0, True, "replace the earlier output in OUT")}
    assert {k[0] for k in seen["--config"]} == {CONFIG_DEST} and len(seen["--config"]) == 1


def test_shared_flags_are_declared_only_where_they_are_defined():
    """--device / --precision in device.py; --no-progress / --progress, --seed, --overwrite, --config in
    commands/options.py: a verb that wants one calls the helper, it does not spell the flag again."""
    homes = {"--device": "device.py", "--precision": "device.py", "--no-progress": "commands/options.py",
             "--progress": "commands/options.py", "--seed": "commands/options.py",
             "--overwrite": "commands/options.py", "--config": "commands/options.py"}
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument" and node.args
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value in homes):
                where = str(path.relative_to(SRC))
                if where != homes[node.args[0].value]:
                    found.append(f"{node.args[0].value} in {where}")
    assert not found, found


# ---- the flags the walk found missing before, doing what they say ----------------------------------------------------
def _pairs(path: Path) -> Path:
    rows = [("a good film", "a great movie", 4.5), ("the plot was dull", "a boring story", 4.0),
            ("a good film", "the plot was dull", 0.5), ("a great movie", "a boring story", 1.0)] * 4
    path.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in rows),
                    encoding="utf-8")
    return path


def test_embed_train_takes_the_shared_flags_and_config(base, tmp_path, capsys):  # noqa: F811 (fixture)
    train = _pairs(tmp_path / "pairs.tsv")
    common = ["embed-train", "--model", str(base), "--train", str(train), "--max-steps", "2", "--batch-size", "4"]
    assert main([*common, "--out", str(tmp_path / "a"), "--no-progress", "--device", "cpu", "--precision", "fp32",
                 "--seed", "3"]) == 0
    assert main([*common, "--out", str(tmp_path / "a"), "--no-progress"]) == 2  # an earlier run: refused
    assert "--overwrite" in capsys.readouterr().err
    (tmp_path / "run.json").write_text(json.dumps({"seed": 3, "device": "cpu", "progress": False}))
    assert main([*common, "--out", str(tmp_path / "b"), "--config", str(tmp_path / "run.json")]) == 0
    a, b = (json.loads(line) for line in ((tmp_path / d / "metrics.jsonl").read_text().splitlines()[-1]
                                          for d in ("a", "b")))
    assert a == b  # the same seed from the command line and from the file: the same run
    assert main([*common, "--out", str(tmp_path / "c"), "--device", "cuda:7", "--no-progress"]) == 2
    assert "--device cuda:7" in capsys.readouterr().err and not (tmp_path / "c").exists()


def test_folders_that_were_silently_replaced_now_need_overwrite(base, tmp_path, capsys):  # noqa: F811 (fixture)
    texts = tmp_path / "texts.txt"
    texts.write_text("a good film\nthe plot was dull\na great movie\n", encoding="utf-8")
    prepare = ["prepare", "--corpus", str(texts), "--tokenizer", str(base), "--out", str(tmp_path / "shards"),
               "--no-progress"]
    heads = ["analyze", "heads", "--model", str(base), "--input", str(texts), "--out", str(tmp_path / "heads"),
             "--clusters", "2", "--no-progress", "--device", "cpu"]
    # what each writes that depends only on its input (manifest.json and heads.json also hold timings)
    for argv, kept in ((prepare, lambda out: (out / "shard_00000.ids.bin").read_bytes()),
                       (heads, lambda out: json.loads((out / "heads.json").read_text())["heads"])):
        out = Path(argv[argv.index("--out") + 1])
        assert main(argv) == 0
        before = kept(out)
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "already holds" in err and "--overwrite" in err, err
        assert kept(out) == before
        assert main([*argv, "--overwrite"]) == 0
        assert kept(out) == before  # replaced by the same input's output
