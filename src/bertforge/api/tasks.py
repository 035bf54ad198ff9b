"""Fine-tuning, evaluation and prediction on tasks: `finetune`, `evaluate`, `predict`.

    result = bertforge.finetune("bert-base-uncased", "glue/SST-2", task="sst2", out="runs/sst2", epochs=3)
    result.metrics                                  # {"accuracy": 0.92, ...}: the best evaluation
    bertforge.evaluate(result.out, "glue/SST-2", task="sst2")
    bertforge.predict(result.out, ["a gripping film", "dull"])   # [{"label": "1", "score": ..., ...}, ...]

Data is a folder of splits, one file, a saved or Hub dataset, or data in memory (a list of strings or dicts, a
DataFrame, a pyarrow Table, a datasets Dataset or a dict of split -> data); `text_col` / `text_pair_col` /
`label_col` name its columns (default: the usual names).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bertforge.api.inputs import make_config, model_name, read_history, trackers
from bertforge.api.results import FinetuneResult
from bertforge.config.arguments import (BOOL, COUNT, DATA, DEVICE, EPOCHS, MODEL, PATH, POSITIVE, SEED, STEPS, TEXT,
                                        check_args, maybe)
from bertforge.errors import ArgumentError
from bertforge.tasks.config import FIELD_BOUNDS, FinetuneConfig as _Defaults  # torch-free: finetune's defaults


def finetune(model: Any, data: Any = None, *, task: str, out: Any, train: Any = None, eval: Any = None,
             data_config: str | None = None, text_col: Any = None, text_pair_col: Any = None, label_col: Any = None,
             epochs: float | None = _Defaults.epochs, max_steps: int | None = _Defaults.max_steps,
             lr: float | None = _Defaults.lr, batch_size: int = _Defaults.batch_size, seed: int = _Defaults.seed,
             runs: int = _Defaults.runs, device: str = _Defaults.device, precision: str | None = None,
             progress: bool = True, report_to: Any = None, logging_dir: Any = None, resume: bool = False,
             overwrite: bool = False, revision: str | None = None, **options: Any) -> FinetuneResult:
    """Fine-tune `model` (a folder or Hub id) on `task` (sst2, mrpc, conll, squad, ..., or a generic kind:
    classify, regress, tag, qa, choice, seq2seq) with the BERT paper's recipe; the best checkpoint ends in `out`.
    `epochs` None: 3, or more on small data (at least 200 optimizer steps; `FinetuneConfig.plan_epochs`).
    `method="frozen-head"` (classification): a logistic regression on the frozen sentence embeddings instead.

    `data`: a folder of splits (train.*, dev.* / validation.*), a saved DatasetDict, a Hub dataset id (with
    `data_config`), one training file, or data in memory (a dict of split -> data, or one table); `train` / `eval`
    name a split's data directly. `options`: any other field of `bertforge.tasks.config.FinetuneConfig`
    (eval_batch_size, max_seq_len, warmup_ratio, weight_decay, train_limit, eval_limit, freeze, features, head,
    labels, group_by_length, doc_stride, max_query_length, source_col, target_col, max_target_len, num_beams,
    compile, method). `report_to`: trackers besides metrics.jsonl (tensorboard, mlflow). `out` holding an earlier run is
    refused unless `resume` or `overwrite`."""
    from bertforge.tasks.finetune import FinetuneConfig, finetune as run

    check_args(locals(), model=MODEL, data=maybe(DATA), task=TEXT, out=PATH, train=maybe(DATA), eval=maybe(DATA),
               data_config=maybe(TEXT), text_col=maybe(TEXT), text_pair_col=maybe(TEXT), label_col=maybe(TEXT),
               epochs=maybe(EPOCHS), max_steps=maybe(STEPS), lr=maybe(POSITIVE), batch_size=COUNT, seed=SEED,
               runs=COUNT, device=DEVICE, precision=maybe(TEXT), progress=BOOL, resume=BOOL, overwrite=BOOL,
               revision=maybe(TEXT))
    check_args(options, **{k: v for k, v in FIELD_BOUNDS.items() if k in options})  # FinetuneConfig's, first
    tracked = trackers(report_to, logging_dir)  # a missing tracker library: one line before any work
    if task.lower().replace("-", "").replace("_", "") == "openqa":  # the reader over retrieved passages
        return _finetune_open_qa(model, data, out, train, eval, epochs, max_steps, lr, batch_size, seed, device,
                                 precision, progress, resume, overwrite, revision, tracked, options)
    if task.lower() in ("rag", "fid"):  # generative open QA over retrieved passages (docs/rag.md)
        from bertforge.api.generative_qa import finetune_generative

        run = finetune_generative(model, task=task.lower(), out=out, train=train if train is not None else data,
                                  epochs=epochs, max_steps=max_steps, lr=lr, batch_size=batch_size, seed=seed,
                                  device=device, precision=precision, progress=progress, overwrite=overwrite,
                                  revision=revision, **options)
        metrics = {"loss": run["last_loss"]}
        return FinetuneResult(Path(out), metrics, read_history(out), run, task=run["task"], main_metric="loss",
                              summary={}, runs=[run], precision=run["config"]["precision"])
    if data is None and train is None:
        raise ArgumentError("data=None, train=None: give data (a folder of splits, a file, data in memory) or train")
    cfg = make_config(FinetuneConfig, "finetune", dict(
        task=task, model=model_name(model, revision), out=out, data=data, train=train, eval=eval,
        data_config=data_config, text_col=text_col, text_pair_col=text_pair_col, label_col=label_col, epochs=epochs,
        max_steps=max_steps, lr=lr, batch_size=batch_size, seed=seed, runs=runs, device=device, precision=precision,
        progress=progress, resume=resume, **tracked), options)
    done = run(cfg, overwrite=overwrite)
    best = max(done.runs, key=lambda r: r["best"].get(done.main_metric, -math.inf))
    metrics = dict(best["best"])
    precision = cfg.training_precision
    record = {"out": str(done.model_dir), "task": cfg.task, "main_metric": done.main_metric, "metrics": metrics,
              "summary": done.summary, "precision": precision, "runs": done.runs}
    return FinetuneResult(done.model_dir, metrics, read_history(best["out"]), record, task=cfg.task,
                          main_metric=done.main_metric, summary=done.summary, runs=done.runs, precision=precision)


def _finetune_open_qa(model, data, out, train, eval, epochs, max_steps, lr, batch_size, seed, device, precision,
                      progress, resume, overwrite, revision, tracked, options) -> FinetuneResult:
    """finetune(task="open-qa"): `options` carry index, retriever, k, train_retriever and the reader's settings
    (bertforge.retrieval.reader_train.OpenQAConfig); `data` is the training questions when `train` is not given."""
    from bertforge.api.reading import finetune_open_qa

    options = {k: v for k, v in options.items() if v is not None or k in ("index", "retriever")}
    run = finetune_open_qa(model, out=out, train=train if train is not None else data, eval=eval, epochs=epochs,
                           max_steps=max_steps, lr=lr, batch_size=batch_size, seed=seed, device=device,
                           precision=precision, progress=progress, resume=resume, overwrite=overwrite,
                           revision=revision, **tracked, **options)
    metrics = dict(run["best"])
    main = run["main_metric"]
    summary = {"median": metrics[main], "min": metrics[main], "max": metrics[main], "std": 0.0, "n": 1} \
        if main in metrics else {}
    record = {"out": str(out), "task": "open-qa", "main_metric": main, "metrics": metrics, "summary": summary,
              "runs": [run]}
    return FinetuneResult(Path(out), metrics, read_history(out), record, task="open-qa", main_metric=main,
                          summary=summary, runs=[run], precision=precision or "")


def evaluate(model: Any, data: Any = None, *, task: str, eval: Any = None, split: str = "dev",
             data_config: str | None = None, text_col: Any = None, text_pair_col: Any = None, label_col: Any = None,
             batch_size: int = _Defaults.eval_batch_size, limit: int | None = None, device: str = _Defaults.device,
             precision: str | None = None,
             progress: bool = False, revision: str | None = None, **options: Any) -> dict[str, float]:
    """The metrics of a fine-tuned model (a `finetune` output folder, or a Hub id) on `task`'s `split` (dev or
    test) of `data` (as `finetune` takes it), or on `eval`: {"accuracy": ..., "f1": ...} by task. `precision`:
    fp32 (default: exact), bf16, fp16 (GPU). `options`: max_seq_len, compile, and the seq2seq / SQuAD settings
    of `finetune`."""
    from bertforge.tasks.finetune import FinetuneConfig, evaluate_model

    check_args(locals(), model=MODEL, data=maybe(DATA), task=TEXT, eval=maybe(DATA), split=TEXT,
               data_config=maybe(TEXT), text_col=maybe(TEXT), text_pair_col=maybe(TEXT), label_col=maybe(TEXT),
               batch_size=COUNT, limit=maybe(COUNT), device=DEVICE, precision=maybe(TEXT), progress=BOOL,
               revision=maybe(TEXT))
    if data is None and eval is None:
        raise ArgumentError("data=None, eval=None: give data (a folder of splits, a file, data in memory) or eval")
    name = model_name(model, revision)
    cfg = make_config(FinetuneConfig, "evaluate", dict(
        task=task, model=name, out=".", data=data, eval=eval, data_config=data_config, text_col=text_col,
        text_pair_col=text_pair_col, label_col=label_col, eval_batch_size=batch_size, eval_limit=limit,
        device=device, precision=precision, progress=progress), options)
    return evaluate_model(name, cfg, split=split)


def predict(model: Any, inputs: Any, *, text_col: Any = None, text_pair_col: Any = None,
            data_split: str | None = None, data_config: str | None = None, batch_size: int = 64,
            device: str = "auto", precision: str = "fp32", compile: bool = False, progress: bool = False,
            revision: str | None = None, out: Any = None) -> list[dict[str, Any]]:
    """Predictions of a fine-tuned model (its task is read from its config.json), one record per input row, in
    order: label, score and probabilities (classification), score (regression), tokens and tags (tagging), answer,
    span and score (QA), the chosen ending and probabilities (multiple choice), the generated text (seq2seq).

    `inputs`: a list of strings (one text each) or dicts, a DataFrame, a pyarrow Table, a datasets Dataset, or a
    file (csv, tsv, jsonl, json, parquet; a text file is one input a line), a saved or Hub dataset (its
    `data_split` / `data_config`). `out`: also write the records to this file as JSON lines (atomically; checked
    to be writable before the model is loaded)."""
    from bertforge.tasks.predict import predict as run, write_jsonl

    check_args(locals(), model=MODEL, inputs=DATA, text_col=maybe(TEXT), text_pair_col=maybe(TEXT),
               data_split=maybe(TEXT), data_config=maybe(TEXT), batch_size=COUNT, device=DEVICE, precision=TEXT,
               compile=maybe(BOOL), progress=BOOL, revision=maybe(TEXT), out=maybe(PATH))
    if out is not None:
        from bertforge.io.write import prepare_output_file

        prepare_output_file(out, what="out")
    records = run(model_name(model, revision), inputs, batch_size=batch_size, device=device, progress=progress,
                  precision=precision, compile=compile, text_col=text_col, text_pair_col=text_pair_col,
                  split=data_split, config=data_config)
    if out is not None:
        write_jsonl(records, out)
    return records
