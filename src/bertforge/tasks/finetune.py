"""Fine-tuning driver: data -> features -> length-grouped batches -> the shared Trainer -> the best model in OUT.

    cfg = FinetuneConfig(task="sst2", model="path/to/bert", out="runs/sst2", data="glue/SST-2")
    result = finetune(cfg)           # result.summary: median / min / max / std of the main metric over --runs

Defaults are the BERT paper's: AdamW (weight decay 0.01), lr 3e-5 (2e-5..5e-5 is the useful range), 10 % linear
warm-up then linear decay, batch 32, 3 epochs, evaluation after every epoch. The output folder follows the
transformers convention: OUT itself is the final model (config.json, model.safetensors, tokenizer, best_metrics.json:
the best checkpoint by the main metric), trainer checkpoints live in OUT/checkpoints, and with --runs N each run
keeps its own folder OUT/run-K (same layout) while OUT gets the best run's model. Task specifics (reading,
encoding, scoring) live in `bertforge.tasks.kinds`; the input data is read and checked before any model is loaded.

OUT is claimed for the whole job (`bertforge.io.rundir`, once even with --runs): a second job on it is refused, a
folder holding an earlier run is refused unless `resume` or `overwrite`, the options and data fingerprint are
recorded in OUT/run_options.json and a resume that changes what the checkpoints depend on is refused, naming the
option; a job that fails before writing anything leaves no folder behind.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.io.write import atomic_write_text
from bertforge.io.rundir import claim_output_dir
from bertforge.io.tables import is_saved_dataset, is_splits, source_name
from bertforge.tasks.batching import TRAIN_KEYS, make_collate, row_length, unpad  # noqa: F401 (re-exported)
from bertforge.tasks.config import TASK_KINDS, TASKS, FinetuneConfig  # noqa: F401 (re-exported)
from bertforge.families import Family
from bertforge.model.folder import ModelFolder
from bertforge.tasks.fewshot import chance_scores, fit_frozen_head, warn_near_chance
from bertforge.tasks.folders import install_dir, install_model, remove_stale_temp_dirs, saved_task
from bertforge.tasks.kinds import TaskKind, kind_for

log = logging.getLogger(__name__)


# ---- data --------------------------------------------------------------------------------------------------------
@dataclass
class TaskData:
    """Training rows for the loader plus an `evaluate(model) -> metrics` closure over the eval split."""

    kind: str  # the kind's name: classify, regress, tag, qa or choice
    labels: list[str] | None
    main_metric: str
    train_rows: list[dict]
    evaluate: Callable[[nn.Module], dict[str, float]] | None
    task: TaskKind  # the kind object that read and encoded the data (and saves its settings with the model)
    chance: dict[str, float] = dataclasses.field(default_factory=dict)  # a constant guess's scores (classify)


def resolve_files(cfg: FinetuneConfig, kind: TaskKind, split: str = "dev",
                  need_train: bool = True) -> tuple[Any, Any]:
    """(train source, eval source) from --train / --eval or --data: a folder of splits (train.*, dev.* /
    validation.* ..., test.*, or save_to_disk's split folders), a hub dataset id (with --data-config), or one file
    (the train file; the eval file where no training is asked for, or for QA, which splits it). A source is a path,
    a `bertforge.io.tables.HubSplit`, or data in memory."""
    train, evalf = cfg.train, cfg.eval
    if cfg.data is not None:
        data = cfg.data
        if is_splits(data):
            if train is None and need_train:
                train = kind.split_source(data, "train", cfg.data_config)
            evalf = evalf if evalf is not None else kind.split_source(data, split, cfg.data_config)
        elif isinstance(data, (str, os.PathLike)) and not Path(data).exists():
            raise BertforgeError(f"--data {data}: no such file or folder")
        elif kind.splits_eval_file or not need_train:
            evalf = evalf if evalf is not None else data
        else:
            train = train if train is not None else data
    for flag, p in (("--train", train), ("--eval", evalf)):
        if isinstance(p, (str, os.PathLike)) and not (Path(p).is_file() or is_saved_dataset(p)):
            raise BertforgeError(f"{flag} {p}: {'a folder, not a file' if Path(p).is_dir() else 'no such file'}")
    where = f" in {source_name(cfg.data)}" if cfg.data is not None else ""
    if need_train and train is None and not (kind.splits_eval_file and evalf is not None):
        raise BertforgeError(f"no training file found{where} (expected {kind.data_files('train')[0]}; "
                             "or pass --train FILE)")
    if not need_train and evalf is None:
        raise BertforgeError(f"no {split} file found{where} (expected {kind.data_files(split)[0]}; "
                             "or pass --eval FILE)")
    return train, evalf


def read_examples(cfg: FinetuneConfig, kind: TaskKind, split: str = "dev", need_train: bool = True,
                  files: tuple[Any, Any] | None = None) -> tuple[list, list]:
    """The (train, eval) examples, checked: files exist, columns present, examples present and labelled.
    `files`: (train, eval) as `resolve_files` returned them (else resolved here)."""
    train_file, eval_file = files if files is not None else resolve_files(cfg, kind, split, need_train)
    train = kind.read(train_file) if need_train and train_file is not None else []
    if train_file is not None and need_train:
        kind.check(train, train_file)
    evaluation = kind.read(eval_file) if eval_file is not None else []
    if eval_file is not None:
        kind.check(evaluation, eval_file)
    train, evaluation = kind.split(train, evaluation, eval_file, training=need_train)
    limit = lambda xs, n: xs if n is None else xs[:n]  # noqa: E731
    return limit(train, cfg.train_limit), limit(evaluation, cfg.eval_limit)


def encode_data(cfg: FinetuneConfig, kind: TaskKind, train: list, evaluation: list, tokenizer) -> TaskData:
    """Model rows of the training examples and an evaluation closure over the eval examples."""
    train_rows = []
    if train:  # only what model(**batch) takes (tagging's word_index stays behind)
        train_rows = [{k: v for k, v in r.items() if k in TRAIN_KEYS} for r in kind.encode(train, tokenizer).rows]
    evaluate, chance = None, {}
    if evaluation:
        enc = kind.encode(evaluation, tokenizer)
        if kind.name == "classify" and not kind.regression:
            chance = chance_scores([int(r["labels"]) for r in enc.rows], kind.num_labels)

        def evaluate(model: nn.Module) -> dict[str, float]:
            return kind.evaluate(model, enc, cfg.eval_batch_size, cfg.progress)

    return TaskData(kind.name, kind.labels, kind.main_metric, train_rows, evaluate, kind, chance)


def prepare(cfg: FinetuneConfig, tokenizer, split: str = "dev", need_train: bool = True,
            labels: list[str] | None = None, task_info: dict | None = None) -> TaskData:
    """Read, check and encode the task's data. `labels` / `task_info` (from a saved model) fix the label list and
    the task's settings."""
    kind = kind_for(cfg, task_info, labels)
    train, evaluation = read_examples(cfg, kind, split, need_train)
    return encode_data(cfg, kind, train, evaluation, tokenizer)


# ---- training ----------------------------------------------------------------------------------------------------
@dataclass
class FinetuneResult:
    runs: list[dict[str, Any]]  # per run: seed, best metrics, out dir, train examples/s
    main_metric: str
    summary: dict[str, float]  # median, min, max, std of the main metric over the runs
    model_dir: Path  # cfg.out: the final model (the best run's best checkpoint)


def summarize(values: list[float]) -> dict[str, float]:
    return {"median": float(statistics.median(values)), "min": float(min(values)), "max": float(max(values)),
            "std": float(statistics.pstdev(values)) if len(values) > 1 else 0.0, "n": len(values)}


# What a resume may change: how long to train, and how fast to evaluate. Everything else in run_options() shapes
# the checkpoints (or which one is best), so a resume that changes it is refused.
MAY_CHANGE = ("epochs", "max_steps", "eval_batch_size", "device", "compile")


def _file_identity(source: Any) -> list:
    """[absolute path, size, mtime_ns]: changes when the file is edited or replaced (make's notion of "changed"); a
    saved dataset's folder by its files; a hub dataset by its name."""
    if not isinstance(source, (str, os.PathLike)):
        return [source_name(source)]
    path = Path(source)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return [str(path.resolve()), sum(f.stat().st_size for f in files),
            max((f.stat().st_mtime_ns for f in files), default=0)]


def run_options(cfg: FinetuneConfig, model_dir: Path, train_file: Any,
                eval_file: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(options, fingerprint) recorded in OUT/run_options.json, keyed by the CLI option that sets them (a refused
    resume names the key as --key). Paths are absolute, so a resume from another folder counts as the same run."""
    def absolute(p: Any) -> str | None:
        return None if p is None else str(Path(p).resolve()) if isinstance(p, (str, os.PathLike)) else source_name(p)

    options = {
        "task": cfg.task, "model": absolute(model_dir), "train": absolute(train_file), "eval": absolute(eval_file),
        "data_config": cfg.data_config,
        "text_col": cfg.text_col, "text_pair_col": cfg.text_pair_col, "label_col": cfg.label_col,
        "labels": ",".join(cfg.labels) or None, "max_seq_len": cfg.max_seq_len, "doc_stride": cfg.doc_stride,
        "max_query_length": cfg.max_query_length,
        "source_col": cfg.source_col, "target_col": cfg.target_col, "max_target_len": cfg.max_target_len,
        "num_beams": cfg.num_beams,
        "train_limit": cfg.train_limit, "limit": cfg.eval_limit, "batch_size": cfg.batch_size, "lr": cfg.lr,
        "warmup_ratio": cfg.warmup_ratio, "weight_decay": cfg.weight_decay, "seed": cfg.seed, "runs": cfg.runs,
        "freeze": cfg.freeze, "features": cfg.features if cfg.freeze else None,
        "head": cfg.head if cfg.freeze else None, "precision": cfg.precision,
        "no_group_by_length": not cfg.group_by_length,
        "epochs": cfg.epochs, "max_steps": cfg.max_steps, "method": cfg.method,
        "eval_batch_size": cfg.eval_batch_size, "device": cfg.device, "compile": cfg.compile,
    }
    weights = [model_dir / n for n in ("config.json", "model.safetensors", "pytorch_model.bin")]
    fingerprint = {"model": [_file_identity(p) for p in weights if p.is_file()]}
    for name, path in (("train", train_file), ("eval", eval_file)):
        if path is not None:
            fingerprint[name] = _file_identity(path)
    return options, fingerprint


def default_lr(folder: ModelFolder) -> float:
    """The peak learning rate when --lr is not given: the family's (`Family.finetune_lr`): the BERT paper's 3e-5
    for the encoders' tasks and BART (fairseq's BART fine-tuning rate); 1e-4 for T5, whose usual AdamW fine-tuning
    rates run 1e-4..3e-4 (its paper used Adafactor at 1e-3) and which barely moves at 3e-5."""
    cfg = folder.model_config
    return cfg.family.finetune_lr if cfg is not None else Family.finetune_lr


def finetune(cfg: FinetuneConfig, *, overwrite: bool = False) -> FinetuneResult:
    """Fine-tune `cfg.runs` times (seeds seed, seed+1, ...); the best run's best checkpoint ends in `cfg.out`.

    With several runs the model at OUT is the run with the best main metric (the BERT paper's choice among
    restarts); the reported summary is still the median and spread over all runs. OUT must be new or empty
    unless `cfg.resume` (continue it) or `overwrite` (delete the earlier run first); see the module docstring."""
    folder = ModelFolder.open(cfg.model)
    if cfg.lr is None:
        cfg = dataclasses.replace(cfg, lr=default_lr(folder))
    cfg = dataclasses.replace(cfg, precision=cfg.training_precision)
    kind = kind_for(cfg)
    check_model_fits(cfg, kind, folder)
    files = resolve_files(cfg, kind)
    options, fingerprint = run_options(cfg, folder.path, *files)
    with claim_output_dir(cfg.out, resume=cfg.resume, overwrite=overwrite, options=options,
                          fingerprint=fingerprint, may_change=MAY_CHANGE, what="--out"):
        return _finetune_claimed(cfg, folder, kind, files)


def fit_task_length(kind: TaskKind, model: "str | Path | ModelFolder", flag: str | None = "--max-seq-len") -> None:
    """The positions rule (config.positions) for a task's input length, `kind.max_len`: chosen by `flag`, or
    recorded in the model's config.json (a fine-tuned model), it must fit the model's positions; the default is
    shortened to them. flag=None: the length came from the model's own config.json."""
    from bertforge.config.positions import check_length, fit_length
    from bertforge.tasks.config import default_max_len

    folder = ModelFolder.open(model)
    mcfg, model_dir = folder.model_config, folder.path
    if mcfg is None:  # the BiLSTM student: no positions
        return
    saved = (folder.task or {}).get("max_seq_len")
    if saved is not None and kind.max_len == saved:
        check_length(kind.max_len, mcfg, model_dir, f"{model_dir / 'config.json'}: max_seq_len")
    elif flag is not None and kind.max_len != default_max_len(kind.name):
        check_length(kind.max_len, mcfg, model_dir, flag)
    else:
        kind.max_len = fit_length(kind.max_len, mcfg)


def check_model_fits(cfg: FinetuneConfig, kind: TaskKind, folder: ModelFolder) -> None:
    """Before any work: an input length the model's position table cannot hold (an IndexError at the first long
    text otherwise), and a model fine-tuned for a task of another kind (a head of the wrong shape otherwise)."""
    fit_task_length(kind, folder)
    model_dir = folder.path
    task = folder.task
    if task is not None and task.get("kind") not in (None, kind.name):
        words = {"classify": "classification", "regress": "regression", "tag": "tagging", "qa": "question answering",
                 "choice": "multiple-choice", "seq2seq": "sequence-to-sequence"}
        n = len(folder.labels or [])
        held = "a regression" if task.get("kind") == "regress" else f"{n} labels" if n else words.get(task.get("kind"))
        raise BertforgeError(f"{model_dir} was fine-tuned for {task.get('name')} ({held}); {cfg.task} is a "
                             f"{words.get(kind.name, kind.name)} task, so its head does not fit: fine-tune the "
                             "pretrained model it came from")


def _budget(cfg: FinetuneConfig) -> dict[str, Any]:
    return {"epochs": None if cfg.max_steps else cfg.epochs, "max_steps": cfg.max_steps}


def _finetune_claimed(cfg: FinetuneConfig, folder: ModelFolder, kind: TaskKind,
                      files: tuple[Path | None, Path | None]) -> FinetuneResult:
    """The job, once OUT is ours."""
    train, evaluation = read_examples(cfg, kind, files=files)  # every data problem surfaces before the model
    tokenizer = folder.tokenizer()
    data = encode_data(cfg, kind, train, evaluation, tokenizer)
    if data.evaluate is None:
        log.warning("no evaluation file: the last checkpoint is kept as the model")
    out = Path(cfg.out)
    runs = []
    for r in range(cfg.runs):
        run_dir = out if cfg.runs == 1 else out / f"run-{r}"
        done = run_dir / "run_result.json"
        if cfg.resume and done.is_file():  # a finished run of an interrupted --runs job
            record = json.loads(done.read_text(encoding="utf-8"))
            if record.get("budget", _budget(cfg)) == _budget(cfg):
                runs.append(record)
                continue  # else a longer --epochs/--max-steps: the trainer continues from its last checkpoint
        train = train_frozen_head if cfg.method == "frozen-head" else train_one
        runs.append(train(cfg, folder, tokenizer, data, run_dir, cfg.seed + r))
        atomic_write_text(done, json.dumps(runs[-1], indent=2) + "\n")
        warn_near_chance(cfg.task, runs[-1]["best"], data.chance)
    values = [run["best"][data.main_metric] for run in runs if data.main_metric in run["best"]]
    summary = summarize(values) if values else {}
    best_run = max(range(len(runs)), key=lambda i: runs[i]["best"].get(data.main_metric, -math.inf))
    if cfg.runs > 1:
        install_model(Path(runs[best_run]["out"]), out, move=False)
    atomic_write_text(out / "results.json", json.dumps(
        {"task": cfg.task, "main_metric": data.main_metric, "summary": summary, "runs": runs,
         "best_run": best_run, "config": json.loads(json.dumps(dataclasses.asdict(cfg), default=str))},
        indent=2) + "\n")
    return FinetuneResult(runs, data.main_metric, summary, out)


def train_loader(cfg: FinetuneConfig, rows: list, collate_fn: Callable, seed: int):
    """The training batches: shuffled at `seed`, each epoch anew; length-grouped unless --no-group-by-length (the
    benchmark hands this very plan to transformers' Trainer)."""
    from bertforge.training import ResumableLoader

    lengths = [row_length(r) for r in rows] if cfg.group_by_length else None
    return ResumableLoader(rows, cfg.batch_size, collate_fn=collate_fn, shuffle=True, seed=seed,
                           group_by_length=lengths)


def train_one(cfg: FinetuneConfig, folder: ModelFolder, tokenizer, data: TaskData, run_dir: Path,
              seed: int) -> dict[str, Any]:
    """One fine-tuning run into `run_dir` (its model ends in run_dir itself); returns its record."""
    from bertforge.training import Trainer, TrainConfig, set_seed

    kind = data.task
    remove_stale_temp_dirs(run_dir)  # e.g. .tmp-best-PID of a killed run (OUT is claimed: its writer is gone)
    set_seed(seed)  # the head's initialisation depends on the seed too
    freeze = {"features": cfg.features, "head": cfg.head} if cfg.freeze else None
    model, missing = kind.build(folder, freeze)
    before = {k: v.clone() for k, v in model.bert.state_dict().items()} if cfg.freeze else None
    loader = train_loader(cfg, data.train_rows, kind.collate(tokenizer.pad_token_id), seed)
    per_epoch = len(loader)
    epochs, eval_epochs = cfg.plan_epochs(len(data.train_rows))  # small data: more epochs (FinetuneConfig)
    every = per_epoch * eval_epochs if cfg.max_steps is None else min(per_epoch, cfg.max_steps)

    def save_fn(m: nn.Module, d: Path) -> None:  # kind.info() now: SQuAD's threshold is the latest evaluation's
        kind.save(m, d, tokenizer)

    tc = TrainConfig(out_dir=run_dir, lr=cfg.lr, weight_decay=cfg.weight_decay, warmup_ratio=cfg.warmup_ratio,
                     max_steps=cfg.max_steps, num_epochs=None if cfg.max_steps else epochs,
                     precision=cfg.precision, eval_every=every if data.evaluate else None,
                     save_every=every if cfg.save_checkpoints else None, keep_checkpoints=1, seed=seed,
                     device=cfg.device, compile=cfg.compile, progress=cfg.progress, plot=False, resume=cfg.resume, overwrite=False,
                     best_metric=data.main_metric if data.evaluate else None, log_every=max(1, min(50, every)),
                     extra={"task": cfg.task}, report_to=cfg.report_to, logging_dir=cfg.logging_dir)
    trainer = Trainer(model, loader, tc, eval_fn=data.evaluate, save_fn=save_fn, load_fn=kind.load_into)
    history = trainer.train()
    # the Trainer keeps the best model in run_dir/best while it trains; the finished run's model is run_dir itself
    if data.evaluate is None:  # nothing to choose by: the final model is the one kept
        save_fn(model, run_dir / "best")
    if (run_dir / "best").is_dir():  # (a resumed, already finished run has moved it before)
        for sub in getattr(kind, "model_dirs", ()):  # folders a kind saves beside its model (before config.json)
            install_dir(run_dir / "best" / sub, run_dir / sub)
        install_model(run_dir / "best", run_dir, move=True)
        shutil.rmtree(run_dir / "best")
    if before is not None:
        changed = [k for k, v in model.bert.state_dict().items() if not torch.equal(v.cpu(), before[k])]
        if changed:
            raise RuntimeError(f"feature-based mode changed encoder weights: {changed[:3]}")
    evals = [h for h in history if h.get("split") == "eval"]
    best = {}
    if evals:
        best = max(evals, key=lambda h: h.get(data.main_metric, -math.inf))
    # throughput from the trainer's own step timer (optimizer steps only: no eval, no checkpoint writes)
    step_sum, step_count = trainer._step_time
    examples_per_s = cfg.batch_size * step_count / step_sum if step_sum > 0 else None
    seconds = next((h["elapsed_s"] for h in reversed(history) if "elapsed_s" in h), None)
    return {"seed": seed, "out": str(run_dir), "steps": trainer.step, "budget": _budget(cfg),
            "best": {k: v for k, v in best.items() if k != "split"}, "elapsed_seconds": seconds,
            "train_examples_per_s": examples_per_s, "train_examples": len(data.train_rows),
            "missing_at_init": [m for m in missing if not m.startswith("bert.")]}


def train_frozen_head(cfg: FinetuneConfig, folder: ModelFolder, tokenizer, data: TaskData, run_dir: Path,
                      seed: int) -> dict[str, Any]:
    """`method="frozen-head"`: a logistic regression on the frozen pooled embeddings, saved as the classifier of
    an ordinary model folder in `run_dir` (`tasks.fewshot`); returns the run's record, as `train_one` does."""
    import time

    from bertforge.device import move_model, resolve_device

    kind = data.task
    started = time.perf_counter()
    model, _ = kind.build(folder, None)
    move_model(model, resolve_device(cfg.device), f"--model {cfg.model}")
    fit_frozen_head(model.eval(), data.train_rows, tokenizer.pad_token_id, cfg.eval_batch_size, cfg.progress)
    best = data.evaluate(model) if data.evaluate is not None else {}
    kind.save(model.cpu(), run_dir, tokenizer)
    atomic_write_text(run_dir / "best_metrics.json", json.dumps(best, indent=2) + "\n")
    seconds = time.perf_counter() - started
    return {"seed": seed, "out": str(run_dir), "steps": 0, "budget": _budget(cfg), "method": cfg.method,
            "best": best, "elapsed_seconds": seconds, "train_examples_per_s": None,
            "train_examples": len(data.train_rows), "missing_at_init": []}


# ---- evaluate a fine-tuned model ---------------------------------------------------------------------------------
def evaluate_model(model_path: str | Path, cfg: FinetuneConfig, split: str = "dev") -> dict[str, float]:
    """Metrics of a fine-tuned directory on the task's `split` (dev, or test where a folder has one)."""
    from bertforge.device import resolve_device
    from bertforge.device import autocast, check_precision, compile_module, move_model

    device = resolve_device(cfg.device)  # a missing GPU or an impossible precision: before any reading
    precision = cfg.precision or "fp32"  # evaluation is exact unless asked otherwise
    check_precision(precision, device, allowed=("fp32", "bf16", "fp16"))
    folder = ModelFolder.open(model_path)
    task, labels = saved_task(folder)
    if task.get("kind") != cfg.kind:
        raise BertforgeError(f"{folder.path} was fine-tuned for {task.get('name')} ({task.get('kind')}), "
                             f"not a {cfg.kind} task like {cfg.task}")
    kind = kind_for(cfg, task, labels)
    check_model_fits(cfg, kind, folder)  # an --max-seq-len beyond the positions
    _, evaluation = read_examples(cfg, kind, split, need_train=False)  # checked before the model is loaded
    data = encode_data(cfg, kind, [], evaluation, folder.tokenizer())
    model = kind.load(folder)
    compile_module(move_model(model, device, f"--model {cfg.model}"), cfg.compile)
    with autocast(device, precision):
        return data.evaluate(model)  # type: ignore[misc]
