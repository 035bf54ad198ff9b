"""Task distillation: a fine-tuned teacher's soft targets train a smaller student on the same task.

    loss = alpha * soft + (1 - alpha) * hard
    soft = KL(teacher_T || student_T) * T^2   (classification, tagging; Hinton et al.)
         | MSE(student logits, teacher logits) (regression, and the BiLSTM student: Tang et al. 2019)
    hard = the task loss on the gold labels (rows without labels, e.g. augmented ones, add no hard loss)

Students: `layers:N` (the teacher's family and width, N layers taken evenly from the teacher, its embeddings,
pooler and head copied: DistilBERT's initialisation for a task model), `bilstm` (bertforge.model.bilstm), or a
directory holding a pretrained encoder (e.g. `bertforge distill general`'s output; its vocabulary must be the
teacher's). The teacher runs once per unique input (`TeacherCache`), not once per epoch, on the rows of each
first-epoch batch as the loader yields it (so the first epoch costs the teacher one batch a step, and a resumed run
computes every row in the same company as the uninterrupted one: bit-exact). The output folder is a
normal fine-tuned model folder: `bertforge predict` / `evaluate` work on it.
"""
from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge.config.arguments import (COUNT, COUNT0, EPOCHS, FRACTION, LENGTH, POSITIVE, SEED, STEPS, check_args,
                                        maybe)
from bertforge.config.positions import check_length
from bertforge.model.checkpoint import load_pretrained, read_tensors
from bertforge.distillation.init import check_same_vocab
from bertforge.model.bilstm import BiLSTMStudent, augment, student_from_teacher_embeddings
from bertforge.distillation.losses import TeacherCache, soft_target_loss
from bertforge.errors import BertforgeError
from bertforge.io.write import atomic_write_text
from bertforge.model.heads import task_loss
from bertforge.io.rundir import claim_output_dir
from bertforge.tasks.batching import TRAIN_KEYS, forward_rows, make_collate, row_length
from bertforge.tasks.config import TASK_KINDS, FinetuneConfig
from bertforge.tasks.finetune import encode_data, fit_task_length, read_examples, resolve_files
from bertforge.model.folder import ModelFolder
from bertforge.tasks.folders import install_model, saved_task
from bertforge.tasks.kinds import kind_for
from bertforge.tasks.models import build_model, init_from_pretrained, load_task_model, save_task_model
from bertforge.tokenization import Tokenizer

DISTILLABLE_KINDS = ("classify", "regress", "tag")
TEACHER_BLOCK = 128  # the most rows the teacher runs at once


@dataclass
class TaskDistillConfig:
    teacher: str | Path
    task: str
    data: Any  # a folder of splits, a hub dataset id or one (training) file
    out: str | Path
    student: str = "layers:3"  # layers:N | bilstm | DIR
    alpha: float = 0.5  # weight of the soft loss (0: the student learns from the labels only)
    temperature: float = 2.0
    epochs: float = 3.0
    max_steps: int | None = None
    lr: float | None = None  # None: 5e-5 for transformers, 1e-3 for the BiLSTM
    batch_size: int = 32
    seed: int = 42
    train_limit: int | None = None
    eval_limit: int | None = None
    max_seq_len: int | None = None
    text_col: str | None = None  # None: the teacher's columns where the data has them, else the usual names
    text_pair_col: str | None = None
    label_col: str | None = None
    data_config: str | None = None  # a hub dataset's configuration
    augment: int = 0  # BiLSTM: augmented variants per example (the paper used 20)
    p_mask: float = 0.1
    p_ng: float = 0.25
    bilstm_hidden: int = 300
    teacher_precision: str = "fp32"  # fp32 | bf16
    precision: str | None = None  # training autocast; None: as finetune (bf16 where native) for transformer
    # students, fp32 for the BiLSTM (its recurrent state in bf16 is unmeasured; its training is cheap anyway)
    device: str = "auto"
    save_every: int | None = None  # checkpoint every N steps (default: at each evaluation, i.e. once per epoch)
    resume: bool = False  # continue the interrupted run in `out` from its latest checkpoint
    overwrite: bool = False
    progress: bool = False
    report_to: tuple[str, ...] = ()  # trackers besides metrics.jsonl (TrainConfig.report_to)
    logging_dir: Path | None = None  # TensorBoard's event folder (default: OUT/runs)
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_args(vars(self), **TASK_BOUNDS)  # the command line's bounds, for the API and a config built in code


# The bounds of the numeric fields (`bertforge.config.arguments`; the parser's flags use the same).
TASK_BOUNDS = {"alpha": FRACTION, "temperature": POSITIVE, "epochs": EPOCHS, "max_steps": maybe(STEPS),
               "lr": maybe(POSITIVE), "batch_size": COUNT, "seed": SEED, "train_limit": maybe(COUNT),
               "eval_limit": maybe(COUNT), "max_seq_len": maybe(LENGTH), "augment": COUNT0, "p_mask": FRACTION,
               "p_ng": FRACTION, "bilstm_hidden": COUNT, "save_every": maybe(COUNT)}


# What a resume may change: how long to train and where; everything else shapes the checkpoints.
MAY_CHANGE = ("epochs", "max_steps", "device", "progress", "save_every")


def pick_layers(n_teacher: int, n_student: int) -> list[int]:
    """`n_student` teacher layers spread evenly, starting at 0 (6 -> 3 gives 0, 2, 4: every other layer)."""
    if not 1 <= n_student <= n_teacher:
        raise BertforgeError(f"--student layers:{n_student}: must be between 1 and the teacher's {n_teacher} layers")
    return [math.floor(i * n_teacher / n_student) for i in range(n_student)]


def layer_student(teacher: nn.Module, kind: str, num_labels: int, n_layers: int) -> nn.Module:
    """A task model of the teacher's family with `n_layers` of its layers; everything else copied."""
    keep = pick_layers(teacher.config.num_hidden_layers, n_layers)
    student = build_model(teacher.config.replace(num_hidden_layers=n_layers), kind, num_labels)
    state = teacher.state_dict()
    renamed = {}
    for name, tensor in state.items():
        if name.startswith("bert.encoder.layer."):
            index, rest = name[len("bert.encoder.layer."):].split(".", 1)
            if int(index) not in keep:
                continue
            name = f"bert.encoder.layer.{keep.index(int(index))}.{rest}"
        renamed[name] = tensor
    student.load_state_dict(renamed)
    return student


class Distiller(nn.Module):
    """The Trainer's model: the student (the only parameters) plus the loss mixing; the teacher sits in `cache`."""

    def __init__(self, student: nn.Module, cache: TeacherCache | None, kind: str, alpha: float, temperature: float,
                 soft_kind: str):
        super().__init__()
        self.student, self.kind, self.alpha, self.temperature, self.soft_kind = student, kind, alpha, temperature, soft_kind
        self.cache = cache

    def forward(self, input_ids, attention_mask, labels, labelled, index, token_type_ids=None) -> dict[str, Any]:
        logits = self.student(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)["logits"]
        out: dict[str, Any] = {}
        loss = logits.sum() * 0.0
        has = labelled.bool()
        if self.alpha < 1.0 and bool(has.any()):
            hard = task_loss(logits[has], labels[has], regression=self.kind == "regress")
            out["hard_loss"] = hard.detach()
            loss = loss + (1.0 - self.alpha) * hard
        if self.alpha > 0.0 and self.cache is not None:
            ids = index.tolist()
            teacher = self.cache.get(ids, ids)
            mask = None
            if self.kind == "tag":  # teacher rows are trimmed to their length: pad back, score real tokens only
                t = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
                for j, row in enumerate(teacher):
                    t[j, :row.shape[0]] = row.to(logits.device)
                mask = attention_mask.bool()
            else:
                t = torch.stack(teacher).to(logits.device)
            soft = soft_target_loss(logits, t, self.soft_kind, self.temperature, mask)
            out["soft_loss"] = soft.detach()
            loss = loss + self.alpha * soft
        out["loss"] = loss
        return out


def _student(cfg: TaskDistillConfig, teacher: nn.Module, teacher_tok: Tokenizer, teacher_dir: Path, kind: str,
             num_labels: int, folder: ModelFolder | None = None) -> nn.Module:
    """The student `cfg.student` names; `folder`: its model folder, when already opened."""
    spec = cfg.student
    if spec == "bilstm":
        return student_from_teacher_embeddings(teacher, kind, num_labels, teacher_tok.pad_token_id,
                                               hidden_size=cfg.bilstm_hidden)
    if spec.startswith("layers:"):
        try:
            n = int(spec.split(":", 1)[1])
        except ValueError:
            raise BertforgeError(f"--student {spec}: expected layers:N (N an integer), bilstm or a directory") from None
        return layer_student(teacher, kind, num_labels, n)
    folder = ModelFolder.open(folder or spec, "--student")
    check_same_vocab(teacher_tok, teacher_dir, folder)
    student, _ = init_from_pretrained(folder, kind, num_labels)
    return student


def distill_task(cfg: TaskDistillConfig, run_on: Any = None) -> dict[str, Any]:
    """Distil the fine-tuned teacher in `cfg.teacher` into `cfg.student` on `cfg.task`; returns the run record.
    `run_on`: the torch.device the caller resolved, `cfg.precision` checked against it (the API's placement)."""
    from bertforge.device import check_precision, default_precision, move_model, resolve_device
    from bertforge.training import ResumableLoader, Trainer, TrainConfig, set_seed

    if cfg.task not in TASK_KINDS:
        raise BertforgeError(f"--task {cfg.task}: unknown task (choose from {', '.join(sorted(TASK_KINDS))})")
    device = run_on  # the device and precision: decided once, before any file is read
    if device is None:
        device = resolve_device(cfg.device)
        if cfg.precision is not None:
            check_precision(cfg.precision, device, allowed=("fp32", "bf16"))
    out = Path(cfg.out)
    if cfg.resume and (out / "results.json").is_file():  # before any long work
        raise BertforgeError(f"--out {out}: this run has finished (results.json); there is nothing to resume")
    teacher_folder = ModelFolder.open(cfg.teacher, "--teacher")
    teacher_dir = teacher_folder.path
    saved, labels = saved_task(teacher_folder)
    kind_name = TASK_KINDS[cfg.task]
    if saved.get("kind") != kind_name or (saved.get("name") in TASK_KINDS and saved.get("name") != cfg.task):
        raise BertforgeError(f"--teacher {teacher_dir} was fine-tuned for {saved.get('name')} ({saved.get('kind')}), "
                             f"not for {cfg.task} ({kind_name}); give a teacher fine-tuned on this task")
    if kind_name not in DISTILLABLE_KINDS:
        raise BertforgeError(f"--task {cfg.task}: task distillation supports {', '.join(DISTILLABLE_KINDS)} tasks, not {kind_name}")
    fcfg = FinetuneConfig(task=cfg.task, model=teacher_dir, out=cfg.out, data=cfg.data, max_seq_len=cfg.max_seq_len,
                          text_col=cfg.text_col, text_pair_col=cfg.text_pair_col, label_col=cfg.label_col,
                          data_config=cfg.data_config, train_limit=cfg.train_limit, eval_limit=cfg.eval_limit, progress=cfg.progress,
                          batch_size=cfg.batch_size)
    kind = kind_for(fcfg, saved, labels)
    fit_task_length(kind, teacher_folder)  # the positions rule: the teacher's positions, then a student folder's
    student_folder = None
    if cfg.student != "bilstm" and not cfg.student.startswith("layers:"):  # a model folder (or Hub id)
        student_folder = ModelFolder.open(cfg.student, "--student")
        if student_folder.model_config is not None:
            check_length(kind.max_len, student_folder.model_config, cfg.student, "--max-seq-len")
    files = resolve_files(fcfg, kind)
    train, evaluation = read_examples(fcfg, kind, files=files)  # every data problem before any model is loaded
    tokenizer = teacher_folder.tokenizer()
    teacher, _, _ = load_task_model(teacher_folder)
    teacher = move_model(teacher, device, f"--teacher {teacher_dir}")  # out of GPU memory: one line
    if cfg.teacher_precision == "bf16":
        teacher.to(torch.bfloat16)
    set_seed(cfg.seed)
    student = _student(cfg, teacher, tokenizer, teacher_dir, kind_name, kind.num_labels, student_folder)
    bilstm = isinstance(student, BiLSTMStudent)
    precision = cfg.precision or ("fp32" if bilstm else default_precision(device))
    data = encode_data(fcfg, kind, train, evaluation, tokenizer)
    rows = [{k: v for k, v in r.items() if k in TRAIN_KEYS} | {"labelled": torch.tensor(1)} for r in data.train_rows]
    n_aug = 0
    if bilstm and cfg.augment > 0:
        extra = augment(rows, cfg.augment, tokenizer.mask_token_id, tokenizer.special_ids, cfg.p_mask, cfg.p_ng,
                        seed=cfg.seed, ngrams=kind_name != "tag")
        for r in extra:  # a placeholder label of the right shape; `labelled` = 0 keeps it out of the hard loss
            like = rows[0]["labels"]
            r["labels"] = (torch.full_like(r["input_ids"], -100) if kind_name == "tag" else torch.zeros_like(like))
            r["labelled"] = torch.tensor(0)
        rows += extra
        n_aug = len(extra)
    for i, r in enumerate(rows):
        r["index"] = torch.tensor(i)

    def teacher_logits(indices: list[int]) -> list[torch.Tensor]:
        return [o["logits"] for o in forward_rows(teacher, [rows[i] for i in indices], tokenizer.pad_token_id,
                                                  TEACHER_BLOCK, ("logits",), progress=False)]

    loader = ResumableLoader(rows, cfg.batch_size, collate_fn=make_collate(tokenizer.pad_token_id), shuffle=True,
                             seed=cfg.seed, group_by_length=[row_length(r) for r in rows])
    # blocks = the first epoch's batches: a row's logits never depend on which batch asked first (a resume is
    # bit-exact), and the first epoch computes only the rows it trains on
    cache = (TeacherCache(teacher_logits, total=len(rows), blocks=loader.epoch_batches(0))
             if cfg.alpha > 0 else None)
    soft_kind = "regress" if bilstm or kind_name == "regress" else kind_name
    model = Distiller(student, cache, kind_name, cfg.alpha, cfg.temperature, soft_kind)
    info = kind.info() | {"distilled_from": str(teacher_dir), "student": cfg.student, "alpha": cfg.alpha,
                          "temperature": cfg.temperature}

    def save_fn(m: nn.Module, d: Path) -> None:
        if isinstance(m.student, BiLSTMStudent):
            m.student.save_pretrained(d, kind.labels, info, tokenizer)
        else:
            save_task_model(m.student, d, kind.labels, info, tokenizer=tokenizer)

    def load_fn(m: nn.Module, d: Path) -> None:  # reads what save_fn wrote (checkpoints, the best model)
        if isinstance(m.student, BiLSTMStudent):
            m.student.load_state_dict(read_tensors(Path(d) / "model.safetensors"))
        elif missing := load_pretrained(m.student, d):
            raise BertforgeError(f"{d}: checkpoint lacks {missing[0]}")

    evaluate = (lambda m: data.evaluate(m.student)) if data.evaluate else None  # noqa: E731
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in cfg.__dict__.items()
               if k not in ("overwrite", "resume", "report_to", "logging_dir", "extra")} | {"precision": precision}
    with claim_output_dir(out, resume=cfg.resume, overwrite=cfg.overwrite, options=options, may_change=MAY_CHANGE):
        every = len(loader) if cfg.max_steps is None else min(len(loader), cfg.max_steps)
        lr = cfg.lr if cfg.lr is not None else (1e-3 if bilstm else 5e-5)
        tc = TrainConfig(out_dir=out, lr=lr, max_steps=cfg.max_steps, num_epochs=None if cfg.max_steps else cfg.epochs,
                         eval_every=every if evaluate else None, save_every=cfg.save_every or every,
                         keep_checkpoints=1, resume=cfg.resume, seed=cfg.seed, precision=precision,
                         device=cfg.device, progress=cfg.progress, plot=False, overwrite=False,
                         best_metric=data.main_metric if evaluate else None, log_every=max(1, min(50, every)),
                         weight_decay=0.0 if bilstm else 0.01, extra={"task": cfg.task, "distill": True},
                         report_to=cfg.report_to, logging_dir=cfg.logging_dir)
        trainer = Trainer(model, loader, tc, eval_fn=evaluate, save_fn=save_fn, load_fn=load_fn, device=device)
        history = trainer.train()
        if evaluate is None:
            save_fn(model, out / "best")
        install_model(out / "best", out, move=True)
        shutil.rmtree(out / "best", ignore_errors=True)
        shutil.rmtree(out / "checkpoints", ignore_errors=True)  # finished: nothing left to resume
        evals = [h for h in history if h.get("split") == "eval"]
        best = max(evals, key=lambda h: h.get(data.main_metric, -math.inf)) if evals else {}
        record = {"task": cfg.task, "student": cfg.student, "alpha": cfg.alpha, "temperature": cfg.temperature,
                  "precision": precision,
                  "steps": trainer.step, "train_examples": len(data.train_rows), "augmented_examples": n_aug,
                  "teacher_rows_computed": cache.computed if cache else 0,
                  "teacher_batches": cache.calls if cache else 0, "main_metric": data.main_metric,
                  "best": {k: v for k, v in best.items() if k != "split"},
                  "student_parameters": sum(p.numel() for p in student.parameters()),
                  "teacher_parameters": sum(p.numel() for p in teacher.parameters())}
        atomic_write_text(out / "results.json", json.dumps(record, indent=2) + "\n")
    return record
