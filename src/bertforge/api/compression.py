"""Smaller and faster models: `distill` (a student from a teacher: DistilBERT's general distillation, or task
distillation from a fine-tuned teacher), `prune` (remove the least important attention heads), `quantize` (dynamic
int8) and `export` (ONNX, checked in onnxruntime).

    bertforge.distill("runs/sst2", "glue/SST-2", task="sst2", out="runs/sst2-small", student="layers:3")
    bertforge.distill("runs/pretrain-bert", "corpus.txt", out="runs/distil", max_steps=2000)
    bertforge.prune("runs/sst2", "glue/SST-2", task="sst2", out="runs/sst2-pruned", fraction=0.3).speedup
    bertforge.export("runs/sst2", "runs/sst2-onnx", int8=True).fp32_max_abs_diff
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bertforge.api.inputs import corpus_files, device_for, make_config, model_name, placement, read_history, trackers
from bertforge.api.results import DistillResult, ExportResult, PruneResult, QuantizeResult
from bertforge.config.arguments import (BOOL, COUNT, COUNT0, DATA, DEVICE, INNER_FRACTION, MODEL, OPEN_FRACTION, OPSET,
                                        PATH, POSITIVE, SEED, STEPS, TEXT, built_student, check_args, choice, maybe)
from bertforge.errors import ArgumentError, BertforgeError


def distill(teacher: Any, data: Any = None, *, out: Any, task: str | None = None, texts: Any = None,
            text_col: str | None = None, max_steps: int | None = None, batch_size: int = 32, lr: float | None = None,
            seed: int | None = None, device: str = "auto", precision: str | None = None, progress: bool = True,
            report_to: Any = None, logging_dir: Any = None, resume: bool = False, overwrite: bool = False,
            revision: str | None = None, **options: Any) -> DistillResult:
    """Distil `teacher` (a folder or Hub id) into a smaller student saved in `out`.

    With `task` (the teacher's task: sst2, stsb, conll, or a kind name): task distillation on `data` (as
    `finetune` takes it), the student learning the teacher's soft targets (`student`: "layers:N" of the
    teacher's layers, "bilstm", or a pretrained encoder folder with the teacher's vocabulary; `alpha`,
    `temperature`, `epochs`, `augment`, ... as `bertforge.distillation.task.TaskDistillConfig`).
    Without: DistilBERT's general distillation of a masked LM on a corpus (`data`: files or a table in memory, or
    `texts`), for `max_steps` or `time_budget` (`student_layers`, `student_init`, `alpha_ce`, `alpha_mlm`,
    `alpha_cos`, ... as `bertforge.distillation.general.GeneralDistillConfig`)."""
    from bertforge.distillation.general import GeneralDistillConfig, distill_general
    from bertforge.distillation.task import TASK_BOUNDS, TaskDistillConfig, distill_task

    check_args(locals(), teacher=MODEL, data=maybe(DATA), out=PATH, task=maybe(TEXT), text_col=maybe(TEXT),
               max_steps=maybe(STEPS), batch_size=COUNT, lr=maybe(POSITIVE), seed=maybe(SEED), device=DEVICE,
               precision=maybe(TEXT), progress=BOOL, resume=BOOL, overwrite=BOOL, revision=maybe(TEXT))
    check_args(options, **{k: v for k, v in TASK_BOUNDS.items() if k in options and task is not None})
    if task is not None and (texts is not None or data is None):
        raise ArgumentError("data: task distillation reads examples: give data (a folder of splits, a file, a "
                            "table)")
    # as on every verb: the device and precision decided once, then each model name resolved once, then the data
    where = placement(device, precision, ("fp32", "bf16")) if task is not None else None
    given: dict[str, Any] = dict(teacher=model_name(teacher, revision, "teacher="), out=out, max_steps=max_steps,
                                 batch_size=batch_size, device=device, precision=precision, progress=progress,
                                 resume=resume, overwrite=overwrite, **trackers(report_to, logging_dir))
    given.update({k: v for k, v in (("lr", lr), ("seed", seed)) if v is not None})  # else the mode's default
    if options.get("student_init") is not None:
        options["student_init"] = model_name(options["student_init"], revision, "student_init=")
    if task is not None:
        student = options.get("student")
        if student is not None and not built_student(student):  # a folder or Hub id, at `revision` like the rest
            options["student"] = model_name(student, revision, "student=")
        config = make_config(TaskDistillConfig, "distill task", dict(given, task=task, data=data, text_col=text_col),
                             options)
        record = distill_task(config, where.device)
        metrics = dict(record.get("best", {}))
    else:
        files, column = corpus_files(data, texts, text_col)
        if files is None:
            raise BertforgeError("general distillation reads a corpus: give data (files) or texts")
        config = make_config(GeneralDistillConfig, "distill general", dict(given, corpus=files, text_col=column),
                             options)
        record = distill_general(config)
        metrics = {"mlm_accuracy": record.get("heldout_mlm_accuracy")}
    return DistillResult(Path(out), metrics, read_history(out), record)


def prune(model: Any, data: Any, *, task: str, out: Any, fraction: float, step: float = 0.1,
          max_examples: int = 2000, finetune_steps: int = 0, lr: float = 2e-5, eval: Any = None,
          batch_size: int = 32, seed: int = 0, device: str = "auto", progress: bool = True, overwrite: bool = False,
          revision: str | None = None, data_config: str | None = None, text_col: Any = None,
          text_pair_col: Any = None, label_col: Any = None) -> PruneResult:
    """Remove the `fraction` of `model`'s attention heads (a model fine-tuned for `task`: a folder or Hub id) least
    important to its loss on `data` (Michel et al. 2019: the gradient of a head mask), `step` of them per round,
    scored on the first `max_examples` of the train split (of a folder of splits, a saved or Hub dataset; or of one
    file); then re-fine-tune for `finetune_steps` (at `lr`) and save the smaller model to `out` with its report
    (OUT/pruning.json). Metrics and timings are taken before and after on `eval` (default: the dev split of
    `data`, or the `data` file). `out` holding an earlier run is refused unless `overwrite`."""
    check_args(locals(), model=MODEL, data=DATA, task=TEXT, out=PATH, fraction=INNER_FRACTION, step=OPEN_FRACTION,
               max_examples=COUNT, finetune_steps=COUNT0, lr=POSITIVE, eval=maybe(DATA), batch_size=COUNT, seed=SEED,
               device=DEVICE, progress=BOOL, overwrite=BOOL, revision=maybe(TEXT), data_config=maybe(TEXT),
               text_col=maybe(TEXT), text_pair_col=maybe(TEXT), label_col=maybe(TEXT))
    from bertforge.distillation.prune import prune_heads

    run_on = device_for(device)
    record = prune_heads(model_name(model, revision), data, task=task, out=out, fraction=fraction, step=step,
                         max_examples=max_examples, finetune_steps=finetune_steps, lr=lr, eval=eval,
                         batch_size=batch_size, seed=seed, device=run_on, progress=progress, overwrite=overwrite,
                         columns=dict(data_config=data_config, text_col=text_col, text_pair_col=text_pair_col,
                                      label_col=label_col))
    return PruneResult(Path(out), **record)


def quantize(model: Any, out: Any, *, overwrite: bool = False, revision: str | None = None) -> QuantizeResult:
    """Write a copy of `model` (an encoder, sentence encoder, or classify / regress / tag / qa model) whose Linear
    layers hold int8 weights (torch's dynamic quantisation, run by `embed`, `predict` and `evaluate` on the CPU)
    to `out`; returns its agreement with the fp32 model and the weights' sizes."""
    from bertforge.distillation.compress import quantize as run

    check_args(locals(), model=MODEL, out=PATH, overwrite=BOOL, revision=maybe(TEXT))
    record = run(model_name(model, revision), out, overwrite=overwrite)
    return QuantizeResult(**{**record, "out": Path(record["out"])})


def export(model: Any, out: Any, *, format: str = "onnx", int8: bool = False, opset: int = 17,
           overwrite: bool = False, revision: str | None = None) -> ExportResult:
    """Export `model` (an encoder, sentence encoder or task model) to `out`/model.onnx (and model.int8.onnx with
    `int8`), kept only if onnxruntime matches PyTorch to 1e-4; `out` also gets the tokenizer and config, so `embed`,
    `predict` and `evaluate` run it. Needs the `export` extra (onnx, onnxruntime)."""
    from bertforge.distillation.compress import export_onnx

    check_args(locals(), model=MODEL, out=PATH, format=choice("onnx"), int8=BOOL, opset=OPSET, overwrite=BOOL,
               revision=maybe(TEXT))
    record = export_onnx(model_name(model, revision), out, int8=int8, opset=opset, overwrite=overwrite)
    return ExportResult(Path(out), **record)
