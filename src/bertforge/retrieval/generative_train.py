"""The training jobs of generative open QA on the shared Trainer: `finetune --task rag` (the question tower and the
generator, `retrieval.rag_train`) and `finetune --task fid` (the generator only, over passages retrieved once by a
frozen retriever: Fusion-in-Decoder, `retrieval.fid`).

Questions are `{"question", "answer": [...]}` rows or a SQuAD file (`reader_train.read_questions`); a question with
several answers trains on each (one row per answer). Outputs:

    rag: OUT/config.json + OUT/model.safetensors   transformers' RAG layout (RagTokenForGeneration /
         OUT/question_encoder_tokenizer/, OUT/generator_tokenizer/          RagSequenceForGeneration load it)
         OUT/question/                             the question tower as trained (a sentence-transformers folder)
         OUT/rag.json                              marginalisation, k, the index and retriever it was trained with
    fid: OUT/ a generator folder (config.json, model.safetensors, tokenizer) + OUT/fid.json (k, input length, index)
"""
from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.io.write import atomic_write_text
from bertforge.retrieval.rag import MARGINALISATIONS

log = logging.getLogger(__name__)
RAG_FILE, FID_FILE = "rag.json", "fid.json"
RAG_FORMAT, FID_FORMAT = "bertforge-rag", "bertforge-fid"
TASKS = ("rag", "fid")


@dataclass
class GenerativeConfig:
    """One generative open-QA training job."""

    generator: str | Path
    out: str | Path
    train: Any
    task: str = "rag"
    k: int = 5                      # passages per question (the RAG paper trains with 5 or 10)
    marginalise: str = "token"      # rag: "token" (RAG-Token) or "sequence" (RAG-Sequence)
    freeze_retriever: bool = False  # rag: keep the question tower as it is
    max_source_len: int = 300       # generator tokens per context (transformers' max_combined_length)
    max_target_len: int = 32        # answer tokens
    epochs: float = 3.0
    max_steps: int | None = None
    lr: float = 3e-5
    batch_size: int = 8             # questions per step (each brings k contexts)
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    seed: int = 42
    train_limit: int | None = None
    precision: str = "fp32"
    device: str = "auto"
    progress: bool = True
    overwrite: bool = False
    hints: dict[str, Any] = field(default_factory=dict)  # the index / retriever, recorded

    def __post_init__(self) -> None:
        if self.epochs is None:  # the public finetune's "not given"
            self.epochs = 3.0
        if self.task not in TASKS:
            raise BertforgeError(f"task: expected one of {', '.join(TASKS)} (got {self.task!r})")
        if self.marginalise not in MARGINALISATIONS:
            raise BertforgeError(f"marginalise: expected one of {', '.join(MARGINALISATIONS)} "
                                 f"(got {self.marginalise!r})")
        for name in ("k", "max_source_len", "max_target_len", "epochs", "max_steps", "lr", "batch_size",
                     "train_limit"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise BertforgeError(f"{name}: must be positive, got {v}")


def question_rows(questions: list) -> list[dict]:
    """One training row per (question, answer)."""
    return [{"qidx": i, "question": q.question, "answer": a} for i, q in enumerate(questions) for a in q.answers]


def _claim(out: Path, overwrite: bool) -> None:
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise BertforgeError(f"out: {out} is not empty (overwrite=True starts over)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def _train(cfg: GenerativeConfig, model: nn.Module, rows: list[dict], collate: Callable,
           save_fn: Callable[[nn.Module, Path], None]) -> dict[str, Any]:
    from bertforge.training import ResumableLoader, Trainer, TrainConfig, set_seed

    set_seed(cfg.seed)
    loader = ResumableLoader(rows, cfg.batch_size, collate_fn=collate, shuffle=True, seed=cfg.seed)
    tc = TrainConfig(out_dir=cfg.out, lr=cfg.lr, weight_decay=cfg.weight_decay, warmup_ratio=cfg.warmup_ratio,
                     max_steps=cfg.max_steps, num_epochs=None if cfg.max_steps else cfg.epochs,
                     precision=cfg.precision, save_every=None, keep_checkpoints=1, seed=cfg.seed, device=cfg.device,
                     compile=False, progress=cfg.progress, plot=False, overwrite=True, loader_workers=0,
                     log_every=1, extra={"task": cfg.task})
    trainer = Trainer(model, loader, tc, save_fn=save_fn)
    history = trainer.train()
    save_fn(trainer.model, Path(cfg.out))
    shutil.rmtree(Path(cfg.out) / "checkpoints", ignore_errors=True)  # the model is OUT itself
    losses = [h["loss"] for h in history if "loss" in h and h.get("split") != "eval"]
    record = {"task": cfg.task, "out": str(cfg.out), "steps": trainer.step, "train_rows": len(rows),
              "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
              "config": json.loads(json.dumps(dataclasses.asdict(cfg), default=str))}
    atomic_write_text(Path(cfg.out) / "results.json", json.dumps(record, indent=2) + "\n")
    return record


# ---- RAG ---------------------------------------------------------------------------------------------------------
def save_rag(model: nn.Module, out: Path, tokenizer: Any, cfg: GenerativeConfig) -> None:
    """The trained RAG (a `RagTrainer`) as transformers' RAG folder plus the question tower bertforge reads."""
    from bertforge.io.write import write_json
    from bertforge.retrieval.rag_folder import save_rag_folder
    from bertforge.retrieval.towers import QUESTION_DIR, _dot_similarity, dpr_layout_problem, export_dpr_towers

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tower = model.tower
    tower.save_pretrained(out / QUESTION_DIR)
    _dot_similarity(out / QUESTION_DIR)
    with tempfile.TemporaryDirectory(dir=out, prefix=".tmp-rag-") as tmp:
        generator = model.generator.save_pretrained(Path(tmp) / "generator", tokenizer)
        if dpr_layout_problem(tower) is None:
            question = export_dpr_towers(tower, tower, Path(tmp) / "towers")["question_encoder"]
        else:  # its BERT-layout weights go in; transformers' DPR question encoder reads them at [CLS]
            question = out / QUESTION_DIR
        save_rag_folder(out, question, generator, settings={
            "n_docs": cfg.k, "retrieval_vector_size": tower.dim, "max_combined_length": cfg.max_source_len})
    write_json(out / RAG_FILE, {"format": RAG_FORMAT, "marginalise": cfg.marginalise, "k": cfg.k,
                                "question": QUESTION_DIR, "max_source_len": cfg.max_source_len,
                                "max_target_len": cfg.max_target_len, **cfg.hints})


def finetune_rag(cfg: GenerativeConfig, tower: nn.Module, generator: nn.Module, tokenizer: Any, vectors: Any,
                 titles: list[str], texts: list[str], questions: list) -> dict[str, Any]:
    """Train RAG (see retrieval.rag_train) into `cfg.out`; returns the run's record."""
    from bertforge.retrieval.rag_train import RagTrainer, rag_collate
    from bertforge.retrieval.towers import dpr_layout_problem

    problem = dpr_layout_problem(tower)
    if problem is not None:
        log.warning("the question tower has no DPR layout (%s): the RAG folder holds its encoder, which "
                    "transformers reads at [CLS]; bertforge reads OUT/question as trained", problem)
    _claim(Path(cfg.out), cfg.overwrite)
    rows = question_rows(questions)
    model = RagTrainer(tower, generator, tokenizer, vectors, titles, texts, [q.question for q in questions],
                       k=cfg.k, marginalise=cfg.marginalise, max_source_len=cfg.max_source_len,
                       freeze_retriever=cfg.freeze_retriever)
    collate = rag_collate(tower, generator, tokenizer, cfg.max_target_len)
    return _train(cfg, model, rows, collate, lambda m, d: save_rag(m, d, tokenizer, cfg))


# ---- Fusion-in-Decoder -----------------------------------------------------------------------------------------
def fid_rows(generator: nn.Module, tokenizer: Any, questions: list, passages: list[list[dict]], k: int,
             max_source_len: int, max_target_len: int) -> list[dict]:
    """One row per (question, answer): its k inputs `fid_input(question, title, text)` (a missing passage is an
    empty one) and the answer's ids."""
    from bertforge.retrieval.fid import fid_input
    from bertforge.retrieval.rag_train import source_ids

    rows = []
    for q, hits in zip(questions, passages):
        hits = list(hits)[:k] + [{"title": "", "text": ""}] * max(0, k - len(hits))
        inputs = [source_ids(generator, tokenizer, fid_input(q.question, h["title"], h["text"]), max_source_len)
                  for h in hits]
        for a in q.answers:
            rows.append({"inputs": inputs, "labels": source_ids(generator, tokenizer, a, max_target_len)})
    return rows


def fid_collate(pad: int):
    from bertforge.retrieval.rag_train import pad_rows

    def collate(rows: list[dict]) -> dict[str, torch.Tensor]:
        ids, mask = pad_rows([x for r in rows for x in r["inputs"]], pad)
        labels, lmask = pad_rows([r["labels"] for r in rows], pad)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels.masked_fill(lmask == 0, -100)}

    return collate


def save_fid(model: nn.Module, out: Path, tokenizer: Any, cfg: GenerativeConfig) -> None:
    from bertforge.io.write import write_json

    model.generator.save_pretrained(out, tokenizer)
    write_json(Path(out) / FID_FILE, {"format": FID_FORMAT, "k": cfg.k, "max_source_len": cfg.max_source_len,
                                      "max_target_len": cfg.max_target_len, **cfg.hints})


def finetune_fid(cfg: GenerativeConfig, generator: nn.Module, tokenizer: Any, questions: list,
                 passages: list[list[dict]]) -> dict[str, Any]:
    """Train a Fusion-in-Decoder generator over each question's top k `passages` into `cfg.out`."""
    from bertforge.retrieval.fid import FusionInDecoder

    _claim(Path(cfg.out), cfg.overwrite)
    rows = fid_rows(generator, tokenizer, questions, passages, cfg.k, cfg.max_source_len, cfg.max_target_len)
    model = FusionInDecoder(generator, cfg.k)
    return _train(cfg, model, rows, fid_collate(generator.config.pad_token_id),
                  lambda m, d: save_fid(m, d, tokenizer, cfg))


def read_generative(path: str | Path) -> tuple[str | None, dict[str, Any]]:
    """("rag" | "fid" | None, the record) of a generator folder bertforge trained."""
    p = Path(path)
    for kind, name in (("rag", RAG_FILE), ("fid", FID_FILE)):
        if (p / name).is_file():
            return kind, json.loads((p / name).read_text(encoding="utf-8"))
    return None, {}
