"""Training the open-QA reader (`bertforge finetune --task open-qa`): questions -> the top k passages of a frozen
index -> reader rows -> the one fine-tuning loop (`tasks.finetune.train_one`: the Trainer, its checkpoints, exact
resume, the best model by exact match in OUT).

Questions: `{"question", "answer": [...]}` rows (NQ-open's layout; "answers" too, or one string) in any format
`io.tables` reads, or a SQuAD v1.1 file (its questions and answer texts; the contexts are not used: the passages
come from the index). Retrieval is a function handed in by the public API (`retrieve(questions, k) -> hits`), which
keeps this room below the index it searches. Training questions none of whose k passages holds an answer are left
out (DPR's choice: nothing to learn the span from), with a warning that counts them; evaluation keeps every question
(one whose passages miss the answer counts as wrong: end-to-end exact match). The retriever stays frozen, unless
`train_retriever` (ORQA / REALM: the question encoder trained with the reader, `retrieval.orqa_train`, handed
in as `train_fn`; retrieval then happens inside each step).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.io.rundir import claim_output_dir
from bertforge.io.tables import file_format, json_document, open_table, source_name, value
from bertforge.io.write import atomic_write_text
from bertforge.model.checkpoint import load_pretrained
from bertforge.model.folder import ModelFolder
from bertforge.retrieval.reader import KIND, Reader, save_reader
from bertforge.retrieval.reader_features import collate_questions
from bertforge.retrieval.reading import best_answers, encode_questions, hit_fields, reader_logits
from bertforge.tasks.metrics import normalize_answer, token_f1

log = logging.getLogger(__name__)
Retrieve = Callable[[list[str], int], list[list[Any]]]


@dataclass
class Question:
    qid: str
    question: str
    answers: list[str]


DEFAULT_READER_EPOCHS = 3.0


@dataclass
class OpenQAConfig:
    """One reader training job; the field names are `FinetuneConfig`'s where they mean the same."""

    model: str | Path
    out: str | Path
    train: Any
    eval: Any = None
    k: int = 8                      # passages read per question (training and evaluation)
    max_seq_len: int = 256          # tokens per (question, title, passage) row
    max_answer_len: int = 30        # tokens an answer span may have
    epochs: float = 3.0             # None (the public finetune's default) reads as DEFAULT_READER_EPOCHS
    max_steps: int | None = None
    lr: float | None = None
    batch_size: int = 4             # questions per step (each brings k rows)
    eval_batch_size: int = 8        # questions per evaluation forward pass
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    seed: int = 42
    train_limit: int | None = None
    eval_limit: int | None = None
    precision: str | None = None
    device: str = "auto"
    compile: bool | None = None
    progress: bool = True
    resume: bool = False
    report_to: tuple[str, ...] = ()
    logging_dir: Path | None = None
    group_by_length: bool = True
    save_checkpoints: bool = True
    hints: dict[str, Any] = field(default_factory=dict)  # the index / retriever, recorded in config.json
    train_retriever: bool = False   # the question encoder trained with the reader (retrieval.orqa)
    # what `tasks.finetune.train_one` reads besides: no feature-based mode, one run
    task: str = KIND
    freeze: bool = False
    features: str = "concat_last4"
    head: str = "linear"
    runs: int = 1

    def __post_init__(self) -> None:
        if self.epochs is None:  # the public finetune's "not given": a reader's own default
            self.epochs = DEFAULT_READER_EPOCHS
        for name in ("k", "max_seq_len", "max_answer_len", "epochs", "max_steps", "lr", "batch_size",
                     "eval_batch_size", "train_limit", "eval_limit"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise BertforgeError(f"{name}: must be positive, got {v}")

    def plan_epochs(self, train_rows: int) -> tuple[float, int]:
        """(epochs, evaluate every N epochs), as `FinetuneConfig.plan_epochs` answers `train_one`: the epochs asked
        for, evaluating after each."""
        return float(self.epochs), 1


# ---- questions -----------------------------------------------------------------------------------------------------
def read_questions(source: Any) -> list[Question]:
    """Questions with their answer strings (see the module docstring); one line naming the row without either."""
    if isinstance(source, (str, os.PathLike)) and file_format(source) == "json":
        data = json_document(source)
        if isinstance(data, dict) and isinstance(data.get("data"), list) and data["data"] \
                and isinstance(data["data"][0], dict) and "paragraphs" in data["data"][0]:
            from bertforge.tasks.squad import read_squad

            return [Question(ex.qid, ex.question, list(dict.fromkeys(a.text for a in ex.answers)))
                    for ex in read_squad(source) if ex.answers]
    table = open_table(source)
    out = []
    for n, row in enumerate(table, 1):
        question = value(row, "question")
        if not isinstance(question, str) or not question.strip():
            raise BertforgeError(f"{row.where}: empty question")
        raw = row.get("answer", row.get("answers"))
        if isinstance(raw, dict):  # SQuAD's flat rows: {"text": [...], "answer_start": [...]}
            raw = raw.get("text")
        answers = [raw] if isinstance(raw, str) else list(raw) if isinstance(raw, (list, tuple)) else []
        answers = [str(a) for a in answers if str(a).strip()]
        if not answers:
            raise BertforgeError(f"{row.where}: no answer (expected 'answer': [\"...\"], or 'answers')")
        qid = str(row["id"]) if row.get("id") is not None else str(n)
        out.append(Question(qid, question.strip(), answers))
    if not out:
        raise BertforgeError(f"{table.name}: no questions")
    return out


def retrieve_passages(retrieve: Retrieve, questions: Sequence[Question], k: int) -> list[list[dict]]:
    """The top `k` passages of each question, as `hit_fields` dicts."""
    hits = retrieve([q.question for q in questions], k)
    return [[hit_fields(h) for h in hs] for hs in hits]


# ---- the kind object train_one drives ------------------------------------------------------------------------------
class OpenQAKind:
    """What `tasks.finetune.train_one` asks of a task kind: build, collate, save, load_into."""

    name = KIND
    main_metric = "exact_match"

    def __init__(self, cfg: OpenQAConfig):
        self.cfg = cfg

    def info(self) -> dict[str, Any]:
        return {"name": KIND, "max_seq_len": self.cfg.max_seq_len, "k": self.cfg.k,
                "max_answer_len": self.cfg.max_answer_len, **self.cfg.hints}

    def build(self, folder: ModelFolder, freeze: Any = None) -> tuple[nn.Module, list[str]]:
        return Reader.from_encoder(folder)

    def collate(self, pad_id: int):
        return collate_questions(pad_id)

    def save(self, model: nn.Module, directory: Path, tokenizer: Any) -> None:
        save_reader(model, directory, tokenizer, self.info())

    def load_into(self, model: nn.Module, directory: Path) -> None:
        load_pretrained(model, directory)


def evaluate_reader(model: nn.Module, tokenizer, questions: Sequence[Question], passages: Sequence[Sequence[dict]],
                    cfg: OpenQAConfig, encoded: list | None = None) -> dict[str, float]:
    """End-to-end exact match and F1 of the top answer against any gold answer (SQuAD-normalised, as the open-QA
    papers score), and the share of questions with an answer in their k passages (as read: after truncation)."""
    encoded = encoded or encode_questions(tokenizer, [q.question for q in questions], passages, cfg.max_seq_len,
                                          [q.answers for q in questions])
    logits = reader_logits(model, [x for _, x in encoded], tokenizer.pad_token_id, cfg.eval_batch_size,
                           cfg.progress)
    em = f1 = found = 0.0
    for q, hits, (rows, x), (s, e, sel) in zip(questions, passages, encoded, logits):
        pred = best_answers(rows, hits, s, e, sel, max_answer_len=cfg.max_answer_len)["answer"]
        em += max(float(normalize_answer(pred) == normalize_answer(a)) for a in q.answers)
        f1 += max(token_f1(pred, a) for a in q.answers)
        found += float(len(x["spans"]) > 0)
    n = max(1, len(questions))
    return {"exact_match": 100 * em / n, "f1": 100 * f1 / n, "answer_recall": 100 * found / n}


# ---- the job -------------------------------------------------------------------------------------------------------
def finetune_reader(cfg: OpenQAConfig, retrieve: Retrieve | None, *, overwrite: bool = False,
                    train_fn: Callable | None = None) -> dict[str, Any]:
    """Train a reader into `cfg.out` (claimed as finetune claims it: resume / overwrite, recorded options);
    returns the run's record (tasks.finetune.train_one's, with `main_metric`). `train_fn(cfg, folder, train
    questions, eval questions) -> record`: another training inside the claimed OUT (with `cfg.train_retriever`:
    `orqa_train.train_joint`, the question encoder trained too; `retrieve` is then unused)."""
    from bertforge.tasks.finetune import _file_identity, default_lr

    folder = ModelFolder.open(cfg.model)
    if cfg.lr is None:
        cfg = dataclasses.replace(cfg, lr=default_lr(folder))
    if cfg.precision is None:
        from bertforge.device import default_precision

        cfg = dataclasses.replace(cfg, precision=default_precision(cfg.device))
    mcfg = folder.model_config
    if mcfg is not None and cfg.max_seq_len > mcfg.max_position_embeddings:
        raise BertforgeError(f"max_seq_len {cfg.max_seq_len} is over the model's {mcfg.max_position_embeddings} "
                             "positions")
    train_q = read_questions(cfg.train)[: cfg.train_limit]  # data problems before any model work
    eval_q = read_questions(cfg.eval)[: cfg.eval_limit] if cfg.eval is not None else []
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(cfg).items()
               if k not in ("progress", "resume", "report_to", "logging_dir", "out")}
    options.update(train=source_name(cfg.train), eval=source_name(cfg.eval) if cfg.eval is not None else None,
                   model=str(folder.path.resolve()), hints=json.dumps(cfg.hints, sort_keys=True, default=str))
    fingerprint = {"model": [_file_identity(p) for p in (folder.path / "config.json",
                                                         folder.path / "model.safetensors") if p.is_file()]}
    for name, src in (("train", cfg.train), ("eval", cfg.eval)):
        if src is not None:
            fingerprint[name] = _file_identity(src)
    with claim_output_dir(cfg.out, resume=cfg.resume, overwrite=overwrite, options=options, fingerprint=fingerprint,
                          may_change=("epochs", "max_steps", "eval_batch_size", "device", "compile"), what="--out"):
        if train_fn is not None:
            return _finish(cfg, train_fn(cfg, folder, train_q, eval_q))
        return _train(cfg, folder, retrieve, train_q, eval_q)


def _train(cfg: OpenQAConfig, folder: ModelFolder, retrieve: Retrieve, train_q: list[Question],
           eval_q: list[Question]) -> dict[str, Any]:
    from bertforge.tasks.finetune import TaskData, train_one

    tokenizer = folder.tokenizer()
    kind = OpenQAKind(cfg)
    encoded = encode_questions(tokenizer, [q.question for q in train_q], retrieve_passages(retrieve, train_q, cfg.k),
                               cfg.max_seq_len, [q.answers for q in train_q])
    rows = [x for _, x in encoded if len(x["spans"])]
    if len(rows) < len(encoded):
        log.warning("%d of %d training questions have no answer in their %d passages and are left out",
                    len(encoded) - len(rows), len(encoded), cfg.k)
    if not rows:
        raise BertforgeError(f"--train {source_name(cfg.train)}: no question has an answer in its top {cfg.k} "
                             "passages; nothing to train the reader on (a larger -k, or another index)")
    evaluate = None
    if eval_q:
        eval_passages = retrieve_passages(retrieve, eval_q, cfg.k)
        eval_encoded = encode_questions(tokenizer, [q.question for q in eval_q], eval_passages, cfg.max_seq_len,
                                        [q.answers for q in eval_q])

        def evaluate(model: nn.Module) -> dict[str, float]:
            return evaluate_reader(model, tokenizer, eval_q, eval_passages, cfg, eval_encoded)
    else:
        log.warning("no evaluation questions: the last checkpoint is kept as the reader")
    data = TaskData(KIND, None, kind.main_metric, rows, evaluate, kind)  # type: ignore[arg-type]
    torch.manual_seed(cfg.seed)
    record = train_one(cfg, folder, tokenizer, data, Path(cfg.out), cfg.seed)  # type: ignore[arg-type]
    record["questions"] = {"train": len(train_q), "train_used": len(rows), "eval": len(eval_q)}
    return _finish(cfg, record)


def _finish(cfg: OpenQAConfig, record: dict[str, Any]) -> dict[str, Any]:
    """The run's record with its main metric, written to OUT/results.json."""
    kind = OpenQAKind(cfg)
    record["main_metric"] = kind.main_metric
    atomic_write_text(Path(cfg.out) / "results.json", json.dumps(
        {"task": KIND, "main_metric": kind.main_metric, "runs": [record],
         "config": json.loads(json.dumps(dataclasses.asdict(cfg), default=str))}, indent=2) + "\n")
    if record["best"]:
        best = record["best"].get(kind.main_metric, math.nan)
        log.info("open-qa reader: best exact match %.2f", best)
    return record
