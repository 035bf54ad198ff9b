"""General (task-agnostic) distillation: DistilBERT's triple loss on a raw-text corpus.

    loss = alpha_ce * KL(teacher_T || student_T) * T^2   (soft MLM targets, every real token or the masked ones)
         + alpha_mlm * MLM cross-entropy                 (the student's own masked-LM loss)
         + alpha_cos * (1 - cos(h_student, h_teacher))    (last hidden states, real tokens)

Defaults are DistilBERT's (Sanh et al. 2019, and its training script): 5 / 2 / 1 and T = 2; the student keeps
every other teacher layer (`bertforge.distillation.init`). The teacher is frozen and runs under `inference_mode`
(optionally in bf16). The corpus is read with `bertforge.data.corpus`, tokenised with the teacher's tokenizer and
packed into [CLS] ... [SEP] blocks of `seq_len`; 5 % of the blocks (at least one) are held out for MLM accuracy,
or, with `heldout_corpus`, the blocks of those files (text neither the student nor, if kept out of its
pretraining, the teacher has seen). Training runs in bf16 autocast where the hardware computes bf16 natively.
The output is a DistilBERT masked LM (`DistilBertForMaskedLM` loads it).
"""
from __future__ import annotations

import itertools
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.config.positions import check_length, fit_length
from bertforge.data.corpus import iter_documents
from bertforge.data.dataset import Collator
from bertforge.data.masking import Masker
from bertforge.distillation.init import check_same_vocab, student_from_teacher
from bertforge.distillation.losses import cosine_loss, kd_loss
from bertforge.errors import BertforgeError
from bertforge.io.write import atomic_write_text
from bertforge.model.folder import ModelFolder
from bertforge.model.heads import MaskedLM
from bertforge.io.rundir import claim_output_dir
from bertforge.tokenization import Tokenizer


DEFAULT_SEQ_LEN = 128


@dataclass
class GeneralDistillConfig:
    teacher: str | Path
    corpus: list[str]
    out: str | Path
    student_layers: int | None = None  # None: half the teacher's
    student_init: str | Path | None = None  # a MaskedLM directory to start from instead of the teacher's layers
    random_init: bool = False  # the same student shape, randomly initialised (the "from scratch" baseline)
    alpha_ce: float = 5.0
    alpha_mlm: float = 2.0
    alpha_cos: float = 1.0
    temperature: float = 2.0
    ce_positions: str = "all"  # all (DistilBERT) | masked (cheaper: the vocabulary projection at 15 % of tokens)
    seq_len: int | None = None  # None: 128, or the teacher's positions if fewer
    batch_size: int = 32
    lr: float = 5e-4
    max_steps: int | None = None
    time_budget: str | None = None
    heldout_fraction: float = 0.05
    heldout_corpus: list[str] | None = None  # held-out text of its own instead of the corpus' last 5 %
    text_col: str | None = None  # the text column of the corpus' tables (None: the usual names; jsonl: "text")
    max_blocks: int | None = None
    teacher_precision: str = "fp32"
    precision: str | None = None  # training autocast; None: bf16 where the CPU / GPU computes it natively, else fp32
    seed: int = 0
    device: str = "auto"
    save_every: int | None = None  # checkpoint every N steps (default: only at the end)
    resume: bool = False  # continue the interrupted run in `out` from its latest checkpoint
    overwrite: bool = False
    progress: bool = False
    report_to: tuple[str, ...] = ()  # trackers besides metrics.jsonl (TrainConfig.report_to)
    logging_dir: Path | None = None  # TensorBoard's event folder (default: OUT/runs)


# What a resume may change: how long to train and where; everything else shapes the checkpoints.
MAY_CHANGE = ("max_steps", "time_budget", "device", "progress", "save_every")


def pack_corpus(paths: list[str], tok: Tokenizer, seq_len: int, max_blocks: int | None = None,
                text_col: str | None = None) -> list[np.ndarray]:
    """The corpus as [CLS] pieces [SEP] blocks of `seq_len` ids (documents concatenated, the last short block kept;
    `text_col`: the text column of its tables, `bertforge.data.corpus.iter_documents`)."""
    if seq_len < 8:
        raise BertforgeError(f"--seq-len {seq_len}: must be at least 8")
    width, blocks, buf = seq_len - 2, [], []
    documents = iter_documents(paths, text_col=text_col)  # read as far as the blocks need: --max-blocks stops early
    while texts := [d.text for d in itertools.islice(documents, 1000)]:
        for ids in tok.encode_ids(texts):
            buf.extend(ids)
            while len(buf) >= width:
                blocks.append(np.array([tok.cls_token_id, *buf[:width], tok.sep_token_id], np.int64))
                buf = buf[width:]
                if max_blocks and len(blocks) >= max_blocks:
                    return blocks
    if len(buf) >= 4:
        blocks.append(np.array([tok.cls_token_id, *buf, tok.sep_token_id], np.int64))
    return blocks


class GeneralDistiller(nn.Module):
    """The Trainer's model: the student's parameters only; the teacher is held outside the module tree."""

    def __init__(self, student: MaskedLM, teacher: MaskedLM | None, cfg: GeneralDistillConfig):
        super().__init__()
        self.student = student
        self._teacher = [teacher]  # a list: not a sub-module, so not optimised, saved or moved by the Trainer
        self.cfg = cfg

    def forward(self, input_ids, attention_mask, mlm_labels, token_type_ids=None) -> dict[str, Any]:
        cfg, teacher = self.cfg, self._teacher[0]
        masked = mlm_labels.ne(-100)
        ce_rows = masked if cfg.ce_positions == "masked" else attention_mask.bool()
        s_hidden = self.student.bert(input_ids, attention_mask).last_hidden_state
        head = self.student.cls.predictions
        s_logits = head(s_hidden, ce_rows)  # [N, V] at the rows the soft loss reads (the masked ones among them)
        mlm_logits = s_logits[masked[ce_rows]]
        loss = s_hidden.sum() * 0.0
        out: dict[str, Any] = {}
        if cfg.alpha_mlm:
            mlm = torch.nn.functional.cross_entropy(mlm_logits.float(), mlm_labels[masked])
            loss, out["mlm_loss"] = loss + cfg.alpha_mlm * mlm, mlm.detach()
        out["mlm_accuracy"] = (mlm_logits.detach().argmax(-1) == mlm_labels[masked]).float().mean()
        if teacher is not None and (cfg.alpha_ce or cfg.alpha_cos):
            with torch.inference_mode():
                t_hidden = teacher.bert(input_ids, attention_mask).last_hidden_state
                t_logits = teacher.cls.predictions(t_hidden, ce_rows) if cfg.alpha_ce else None
            t_hidden = t_hidden.float().clone()  # out of inference mode: usable in the student's graph
            if cfg.alpha_ce:
                ce = kd_loss(s_logits, t_logits.float().clone(), cfg.temperature)
                loss, out["ce_loss"] = loss + cfg.alpha_ce * ce, ce.detach()
            if cfg.alpha_cos:
                cos = cosine_loss(s_hidden, t_hidden, attention_mask)
                loss, out["cos_loss"] = loss + cfg.alpha_cos * cos, cos.detach()
        out["loss"] = loss
        return out


@torch.no_grad()
def mlm_accuracy(model: MaskedLM, batches: list[dict[str, torch.Tensor]]) -> float:
    """Accuracy of the masked-token predictions over fixed held-out batches."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    right = total = 0
    for b in batches:
        positions = b["mlm_labels"].ne(-100).to(device)
        logits = model(b["input_ids"].to(device), b["attention_mask"].to(device), positions=positions)
        right += int((logits.argmax(-1) == b["mlm_labels"].to(device)[positions]).sum())
        total += int(positions.sum())
    model.train(was)
    return right / max(total, 1)


def _check(cfg: GeneralDistillConfig) -> None:
    if cfg.ce_positions not in ("all", "masked"):
        raise BertforgeError(f"--ce-positions {cfg.ce_positions}: expected all or masked")
    if min(cfg.alpha_ce, cfg.alpha_mlm, cfg.alpha_cos) < 0 or not (cfg.alpha_ce or cfg.alpha_mlm or cfg.alpha_cos):
        raise BertforgeError("--alpha-ce / --alpha-mlm / --alpha-cos: must be >= 0 and not all 0")
    if cfg.max_steps is None and cfg.time_budget is None:
        raise BertforgeError("give --max-steps N or --time-budget DUR")
    if not 0.0 < cfg.heldout_fraction < 1.0:
        raise BertforgeError(f"--heldout-fraction {cfg.heldout_fraction}: must be between 0 and 1")
    from bertforge.device import check_precision

    for flag, value in (("--teacher-precision", cfg.teacher_precision), ("--precision", cfg.precision or "fp32")):
        check_precision(value, torch.device("cpu"), flag, allowed=("fp32", "bf16"))  # both run on either device


def distill_general(cfg: GeneralDistillConfig) -> dict[str, Any]:
    """Distil the masked LM in `cfg.teacher` into a DistilBERT student on `cfg.corpus`; returns the run record."""
    from bertforge.distillation.task import pick_layers
    from bertforge.training import ResumableLoader, Trainer, TrainConfig, parse_duration, set_seed
    from bertforge.device import default_precision

    _check(cfg)
    out = Path(cfg.out)
    if cfg.resume and (out / "results.json").is_file():  # before any long work
        raise BertforgeError(f"--out {out}: this run has finished (results.json); there is nothing to resume")
    if cfg.time_budget is not None:
        parse_duration(cfg.time_budget)  # a bad duration is refused before the corpus is read
    teacher_folder = ModelFolder.open(cfg.teacher, "--teacher")
    teacher_dir = teacher_folder.path
    tok = teacher_folder.tokenizer()
    student_folder = None if cfg.student_init is None else ModelFolder.open(cfg.student_init, "--student-init")
    if student_folder is not None:
        check_same_vocab(tok, teacher_dir, student_folder)
    teacher = MaskedLM.from_pretrained(teacher_folder)
    # the positions rule: trained (and recorded) at the length asked for, or refused; the default fits the teacher
    if cfg.seq_len is None:
        cfg.seq_len = fit_length(DEFAULT_SEQ_LEN, teacher.config)
    check_length(cfg.seq_len, teacher.config, teacher_dir, "--seq-len")
    if student_folder is not None and student_folder.model_config is not None:
        check_length(cfg.seq_len, student_folder.model_config, cfg.student_init, "--seq-len")
    if tok.vocab_size != teacher.config.vocab_size:
        raise BertforgeError(f"--teacher {teacher_dir}: its tokenizer has {tok.vocab_size} pieces but the model "
                             f"{teacher.config.vocab_size}")
    seq_len = cfg.seq_len
    blocks = pack_corpus(cfg.corpus, tok, seq_len, cfg.max_blocks, cfg.text_col)
    if len(blocks) < (1 if cfg.heldout_corpus else 2):
        raise BertforgeError(f"--corpus: too little text ({len(blocks)} block of {cfg.seq_len} pieces)")
    if cfg.heldout_corpus:
        train_blocks = blocks
        held_blocks = pack_corpus(cfg.heldout_corpus, tok, seq_len, text_col=cfg.text_col)
        if not held_blocks:
            raise BertforgeError(f"--heldout-corpus {' '.join(map(str, cfg.heldout_corpus))}: no text in it")
    else:
        n_held = max(1, int(len(blocks) * cfg.heldout_fraction))
        train_blocks, held_blocks = blocks[:-n_held], blocks[-n_held:]
    set_seed(cfg.seed)
    n_layers = cfg.student_layers or max(1, teacher.config.num_hidden_layers // 2)
    if student_folder is not None:
        student = MaskedLM.from_pretrained(student_folder)
    else:
        student = student_from_teacher(teacher, pick_layers(teacher.config.num_hidden_layers, n_layers))
        if cfg.random_init:
            student = MaskedLM(student.config)
    student.train()
    teacher.requires_grad_(False).eval()
    if cfg.teacher_precision == "bf16":
        teacher.to(torch.bfloat16)
    masker = Masker(tok.vocab_size, tok.mask_token_id, tok.special_ids)
    collate = Collator(masker, tok.pad_token_id, seed=cfg.seed)
    rows = [{"input_ids": b, "token_type_ids": np.zeros_like(b), "index": i} for i, b in enumerate(train_blocks)]
    held_rows = [{"input_ids": b, "token_type_ids": np.zeros_like(b), "index": i} for i, b in enumerate(held_blocks)]
    held = [Collator(masker, tok.pad_token_id, seed=cfg.seed + 1)(held_rows[i:i + 64])
            for i in range(0, len(held_rows), 64)]
    model = GeneralDistiller(student, teacher if not cfg.random_init or cfg.alpha_ce or cfg.alpha_cos else None, cfg)
    teacher_acc = mlm_accuracy(teacher, held)
    precision = cfg.precision or default_precision(cfg.device)
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in cfg.__dict__.items()
               if k not in ("overwrite", "resume", "report_to", "logging_dir")} | {"precision": precision}
    with claim_output_dir(out, resume=cfg.resume, overwrite=cfg.overwrite, options=options, may_change=MAY_CHANGE):
        loader = ResumableLoader(rows, cfg.batch_size, collate_fn=collate, shuffle=True, seed=cfg.seed)
        every = max(1, min(len(loader), cfg.max_steps or len(loader)))
        tc = TrainConfig(out_dir=out, lr=cfg.lr, max_steps=cfg.max_steps, time_budget_s=cfg.time_budget,
                         eval_every=every, save_every=cfg.save_every, keep_checkpoints=1, resume=cfg.resume,
                         seed=cfg.seed, device=cfg.device, precision=precision,
                         progress=cfg.progress, plot=False, overwrite=False, log_every=max(1, min(50, every)),
                         warmup_ratio=0.05, extra={"distill": "general"}, report_to=cfg.report_to,
                         logging_dir=cfg.logging_dir)
        # checkpoints hold the student's tensors (the Trainer's default save / load: the teacher is not a sub-module)
        trainer = Trainer(model, loader, tc, eval_fn=lambda m: {"mlm_accuracy": mlm_accuracy(m.student, held)})
        teacher_dev = next(model.parameters()).device
        teacher.to(teacher_dev)
        history = trainer.train()
        shutil.rmtree(out / "checkpoints", ignore_errors=True)  # finished: nothing left to resume
        student.save_pretrained(out, tokenizer=tok)
        evals = [h for h in history if h.get("split") == "eval"]
        record = {"steps": trainer.step, "train_blocks": len(train_blocks), "heldout_blocks": len(held_blocks),
                  "seq_len": cfg.seq_len, "student_layers": student.config.num_hidden_layers,
                  "init": "random" if cfg.random_init else (str(cfg.student_init) if cfg.student_init else "teacher"),
                  "alphas": [cfg.alpha_ce, cfg.alpha_mlm, cfg.alpha_cos], "temperature": cfg.temperature,
                  "precision": precision,
                  "heldout_mlm_accuracy": evals[-1]["mlm_accuracy"] if evals else None,
                  "teacher_heldout_mlm_accuracy": teacher_acc, "train_seconds": trainer.train_seconds}
        atomic_write_text(out / "results.json", json.dumps(record, indent=2) + "\n")
    return record
