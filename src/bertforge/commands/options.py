"""Options shared by verbs, declared once here with one meaning: `--no-progress` (verbs that show progress bars),
`--seed` (verbs that draw random numbers), `--overwrite` (verbs that write an output folder), the training verbs'
`--report-to` / `--logging-dir` (experiment trackers) and `--config FILE` (a run's options from a JSON or YAML
file, e.g. an earlier run's run_options.json). `--device` / `--precision` / `--compile` are declared by
`bertforge.device.add_device_args`; `device_of` resolves `--device` for the verbs that place a model themselves.
Every verb that names a model (`--model`, `--teacher`, `--init-from`, ...) takes `--revision` (`add_revision_args`,
called for all verbs by `cli`), and `resolve_model_args` turns the model names it was given into local folders
(`io.hub`: a Hugging Face Hub id at the revision, from the cache when offline) before any work.

`--config` is applied by `cli` before argparse parses the command line (`apply_config_file`): the file's keys become
the verb's parser defaults, so a flag given on the command line still wins. Keys are the option names that
run_options.json records: the flag's name with or without its dashes, dashes or underscores ("max_steps",
"--max-steps"); a recorded negation ("progress" for --no-progress, "no_group_by_length" for a store_false flag)
maps onto its flag; a null value keeps the flag's default.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bertforge.commands.bounds import SEED, Number
from bertforge.api.choices import built_student
from bertforge.commands.needs import MODEL_DESTS, Need  # noqa: F401 (MODEL_DESTS: re-exported)
from bertforge.errors import BertforgeError

CONFIG_DEST = "config_file"
# MODEL_DESTS (commands.needs): the options that name a model to load (a folder or a Hugging Face Hub id); serve's
# take `NAME=` in front.


def add_progress_arg(p: argparse.ArgumentParser, default: bool = True) -> None:
    """--no-progress: no progress bars (`args.progress`). A verb quiet by default (default False) also takes
    --progress."""
    if default:
        p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    else:
        p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=False,
                       help="progress bars (default: none)")


def add_seed_arg(p: argparse.ArgumentParser, default: int | None = 0, what: str = "random seed") -> None:
    """--seed S: the same seed, the same numbers (`args.seed`)."""
    tail = f" (default: {default})" if default is not None else ""
    p.add_argument("--seed", type=SEED, default=default, metavar="S", help=what + tail)


def add_overwrite_arg(p: argparse.ArgumentParser, what: str = "--out", resume: bool = False,
                      without: str | None = None) -> None:
    """--overwrite: replace the earlier output in the verb's output folder. `without`: what the verb does without
    it, when that is not refusing a folder that holds files."""
    if without is None:
        without = f"without it{' or --resume' if resume else ''}, a {what} that holds files is refused"
    p.add_argument("--overwrite", action="store_true", help=f"replace the earlier output in {what} ({without})")


def device_of(args: argparse.Namespace):
    """--device resolved and --precision checked against it (`api.inputs.placement`, the API's one check): the first
    thing a verb that places its own model does (one line, nothing written). Kept on `args` (`args._placement`,
    which the verb passes to the API as its device), so nothing resolves or checks them again."""
    from bertforge.api.inputs import placement

    if getattr(args, "_placement", None) is None:
        args._placement = placement(getattr(args, "device", "auto"), getattr(args, "precision", None) or None)
        args._device = args._placement.device
    return args._placement.device


def _verb_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """`parser` and every (sub-)sub-command parser under it."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases share a parser
                found += _verb_parsers(sub)
    return found


def add_revision_args(parser: argparse.ArgumentParser) -> None:
    """--revision on every verb that names a model: the branch, tag or commit of the Hugging Face Hub ids given."""
    for verb in _verb_parsers(parser):
        if any(a.dest in MODEL_DESTS for a in verb._actions):
            verb.add_argument("--revision", metavar="REV",
                              help="the branch, tag or commit of a model given as a Hugging Face Hub id (default: "
                                   "main; offline: from the local cache)")


def resolve_model_args(args: argparse.Namespace) -> None:
    """Each model option's value as a local path: a folder stays as given, a Hugging Face Hub id becomes its
    snapshot folder (at --revision), `serve --model ID` becomes `ID=FOLDER` so it is served under its id. One line
    for a name that is neither, before any work."""
    from bertforge.io.hub import resolve_model_option, resolve_once

    revision, used = getattr(args, "revision", None), False
    for dest in MODEL_DESTS:
        value = getattr(args, dest, None)
        flag = "--" + dest.replace("_", "-")
        if isinstance(value, list):  # serve: [NAME=]FOLDER-OR-ID, repeated
            resolved = []
            for spec in value:
                name, sep, model = spec.rpartition("=")
                path = resolve_model_option(model, revision, f"{flag} {name}=" if sep else flag)
                used |= str(path) != model
                served = name or model.removeprefix("hf://")  # served under its Hub id
                resolved.append(f"{served}={path}" if str(path) != model else spec)
            setattr(args, dest, resolved)
        elif isinstance(value, str) and value and not (dest == "student" and built_student(value)):
            path = resolve_once(value, revision, flag)
            used |= str(path) != value
            setattr(args, dest, path)
    if revision is not None and not used:
        raise BertforgeError(f"--revision {revision}: no model was given as a Hugging Face Hub id (a revision "
                             "names a version of one)")


def add_tracking_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--report-to", action="append", metavar="NAME",
                   help="experiment trackers besides metrics.jsonl: tensorboard, mlflow or none (default: none; "
                        "several comma-separated or repeated). Extras: bertforge[tensorboard], bertforge[mlflow]")
    p.add_argument("--logging-dir", metavar="DIR", help="--report-to tensorboard: event files here (default: OUT/runs)")


def tracking(args: argparse.Namespace) -> dict[str, Any]:
    """{report_to, logging_dir} from the flags; a tracker whose library is missing is one line, now (before any
    data is read or model built)."""
    from bertforge.api.choices import report_to

    return {"report_to": report_to(getattr(args, "report_to", None)),
            "logging_dir": Path(args.logging_dir) if getattr(args, "logging_dir", None) else None}


def add_config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", dest=CONFIG_DEST, metavar="FILE",
                   help="read options from FILE (JSON; YAML with bertforge[yaml]): keys are option names as in "
                        "run_options.json (an earlier run's OUT/run_options.json reproduces it); flags given on "
                        "the command line override the file")


def _verb_parser(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.ArgumentParser:
    """The (sub-)parser that parses `argv`'s verb: follow the sub-command names at the front of argv."""
    current, rest = parser, list(argv)
    while rest:
        subs = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or rest[0] not in subs[0].choices:
            break
        current = subs[0].choices[rest.pop(0)]
    return current


def _config_path(argv: Sequence[str]) -> str | None:
    """The one --config FILE of argv (None: none); a second is refused (merge the files into one: which of two
    would win for a key both hold is no rule a reader of the command can see)."""
    paths = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--config" and i + 1 < len(argv)]
    paths += [arg.split("=", 1)[1] for arg in argv if arg.startswith("--config=")]
    if len(paths) > 1:
        raise BertforgeError(f"--config is given {len(paths)} times ({', '.join(paths)}); give one file (merge "
                             "their options into it)")
    return paths[0] if paths else None


def read_config_file(path: str) -> dict[str, Any]:
    """The file's mapping of options; a run_options.json gives its recorded "options"."""
    from bertforge.io.read import read_json, require_file

    p = require_file(path, "--config")
    if p.suffix.lower() in (".yaml", ".yml"):
        Need("yaml", "yaml", f"--config {p} (YAML)").check()
        import yaml

        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as err:
            raise BertforgeError(f"--config {p}: invalid YAML ({' '.join(str(err).split())})") from None
        if not isinstance(data, dict):
            raise BertforgeError(f"--config {p}: expected a mapping of option names, found {type(data).__name__}")
    else:
        data = read_json(p)
    if isinstance(data.get("options"), dict) and "fingerprint" in data:  # a run's own run_options.json
        data = data["options"]
    return data


def _check(action: argparse.Action, key: str, value: Any, path: str) -> Any:
    """`value` as the flag would have parsed it, or one line naming the key."""
    def wrong(expected: str) -> BertforgeError:
        return BertforgeError(f"--config {path}: {key}: expected {expected}, got {value!r}")

    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction,
                           argparse.BooleanOptionalAction)) or (
            isinstance(action, argparse._StoreConstAction) and isinstance(action.const, bool)):
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if action.nargs in ("+", "*") or isinstance(action, argparse._AppendAction):
        items = value if isinstance(value, list) else [value] if isinstance(action, argparse._AppendAction) else None
        if items is None:
            raise wrong("a list")
        return [_scalar(action, key, v, path, wrong) for v in items]
    return _scalar(action, key, value, path, wrong)


def _scalar(action: argparse.Action, key: str, value: Any, path: str, wrong) -> Any:
    kind = action.type
    if isinstance(kind, Number):  # a bounded flag: the JSON type first, then the flag's own bounds
        if isinstance(value, str):
            try:
                value = int(value) if kind.integer else float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int if kind.integer else (int, float)):
            raise wrong("an integer" if kind.integer else "a number")
        try:
            value = kind(str(value))
        except argparse.ArgumentTypeError as err:
            raise BertforgeError(f"--config {path}: {key} {err}") from None
    elif kind in (int, float) and isinstance(value, str):
        try:  # text as on the command line: PyYAML reads 1e-3 (no dot) as a string
            value = kind(value)
        except ValueError:
            pass
    if isinstance(kind, Number):
        pass
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong("an integer")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong("a number")
        value = float(value)
    elif isinstance(value, (dict, list, bool)) or value is None:
        raise wrong("a string")
    else:
        try:  # a flag's own parser (e.g. str.lower) sees the text it would see on the command line
            value = str(value) if kind is None else kind(str(value))
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            raise wrong("a valid " + (action.metavar or action.dest.upper())) from None
    if action.choices is not None and value not in action.choices:
        raise BertforgeError(f"--config {path}: {key}: {value!r} is not one of {', '.join(map(str, action.choices))}")
    return value


def config_defaults(verb: argparse.ArgumentParser, data: dict[str, Any], path: str) -> dict[str, Any]:
    """The file's options as {dest: value} of `verb`'s flags; an unknown key or a wrong type is one line."""
    actions = {a.dest: a for a in verb._actions if a.option_strings and a.dest not in ("help", CONFIG_DEST)}
    defaults: dict[str, Any] = {}
    for raw, value in data.items():
        key = str(raw).lstrip("-").replace("-", "_")
        dest, negate = key, False
        if dest not in actions:  # a recorded negation: progress for --no-progress, no_x for a store_false x
            if "no_" + key in actions:
                dest, negate = "no_" + key, True
            elif key.startswith("no_") and key[3:] in actions:
                dest, negate = key[3:], True
        action = actions.get(dest)
        if action is None:
            raise BertforgeError(f"--config {path}: unknown option {raw!r} (not an option of this command)")
        if value is None:
            continue  # recorded as "not given": the flag's own default
        value = _check(action, str(raw), value, path)
        defaults[dest] = (not value) if negate else value
    return defaults


def apply_config_file(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """With `--config FILE` in argv for a verb that takes it: the file's options become that verb's defaults
    (flags on the command line override them), and required flags the file gives are no longer required."""
    path = _config_path(argv)
    if path is None:
        return
    verb = _verb_parser(parser, argv)
    if not any(a.dest == CONFIG_DEST for a in verb._actions):
        return  # argparse itself refuses --config for this verb
    defaults = config_defaults(verb, read_config_file(path), path)
    for action in verb._actions:
        if action.dest in defaults:
            action.required = False
    for group in verb._mutually_exclusive_groups:  # a required choice the file makes is made
        if any(a.dest in defaults for a in group._group_actions):
            group.required = False
    verb.set_defaults(**defaults)


def add_trainer_args(p: argparse.ArgumentParser, resume: bool = False) -> None:
    """The flags of a verb that trains on the shared Trainer (`embed-train`, `retriever train`): --seed, the device,
    precision and compile flags, --no-progress, --overwrite (and --resume), --report-to / --logging-dir, --config."""
    from bertforge.device import TRAINING_PRECISIONS, add_device_args

    add_seed_arg(p)
    add_device_args(p, TRAINING_PRECISIONS, "fp32", "bf16 autocast or fp32",
                    compile="torch.compile the model (default: on when training on a GPU; falls back to eager with "
                            "one line)")
    add_progress_arg(p)
    add_overwrite_arg(p, resume=resume)
    add_tracking_args(p)
    add_config_arg(p)
