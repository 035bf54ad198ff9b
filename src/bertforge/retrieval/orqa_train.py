"""The job behind `finetune --task open-qa --train-retriever` (the model and loss: `retrieval.orqa`): the reader's
own training (`reader_train.finetune_reader`: the claimed OUT, resume, the one fine-tuning loop, the best model by
exact match) with a task kind whose model is the reader and the question tower together, whose rows are the
questions (retrieval happens inside each step) and whose saved folder holds the question tower in `question/`.

Evaluation retrieves each evaluation question's top k with the question tower as it is at that moment.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.io.tables import source_name
from bertforge.model.checkpoint import load_pretrained
from bertforge.model.folder import ModelFolder
from bertforge.retrieval.orqa import QUESTION_DIR, OrqaModel, encode_passage_rows, load_question_into, \
    question_collate, save_question
from bertforge.retrieval.reader import KIND, Reader, save_reader
from bertforge.retrieval.reader_train import OpenQAConfig, OpenQAKind, Question, evaluate_reader

log = logging.getLogger(__name__)


@dataclass
class JointRetrieval:
    """What the question tower is trained against: the tower (trainable), the index's vectors
    (`rag_train.PassageVectors`), its passages, and the fingerprint of the model that built the index."""

    tower: nn.Module
    vectors: Any
    titles: list[str]
    texts: list[str]
    index_fingerprint: str | None = None


class OrqaKind(OpenQAKind):
    """The reader's task kind, with the question tower inside the model and beside it in the saved folder."""

    model_dirs = (QUESTION_DIR,)  # tasks.finetune.train_one installs these with the best model

    def __init__(self, cfg: OpenQAConfig, joint: JointRetrieval, tokenizer: Any, questions: list[Question]):
        super().__init__(cfg)
        self.joint, self.tokenizer, self.questions = joint, tokenizer, questions

    def info(self) -> dict[str, Any]:
        return {**super().info(), "question": QUESTION_DIR, "train_retriever": True,
                "index_fingerprint": self.joint.index_fingerprint}

    def build(self, folder: ModelFolder, freeze: Any = None) -> tuple[nn.Module, list[str]]:
        reader, missing = Reader.from_encoder(folder)
        j = self.joint
        model = OrqaModel(reader, j.tower, j.vectors, j.titles, j.texts, self.tokenizer,
                          [q.question for q in self.questions], [q.answers for q in self.questions],
                          k=self.cfg.k, max_seq_len=self.cfg.max_seq_len)
        return model, missing

    def collate(self, pad_id: int):
        return question_collate(self.joint.tower, [q.question for q in self.questions])

    def save(self, model: nn.Module, directory: Path, tokenizer: Any) -> None:
        save_question(model.question, directory)  # first: a folder whose config.json is written is complete
        save_reader(model.reader, directory, tokenizer, self.info())

    def load_into(self, model: nn.Module, directory: Path) -> None:
        load_pretrained(model.reader, directory)
        load_question_into(model.question, directory)


@torch.no_grad()
def retrieve_rows(tower: nn.Module, vectors: Any, questions: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows [N, k], scores [N, k]) of each question's top k, searched with the tower's raw vectors."""
    q = tower.encode(questions, normalize=False, progress=False)
    rows = vectors.search(q, k)
    scores = np.einsum("nd,nkd->nk", q, vectors.vectors(rows))
    return rows, scores


def train_joint(cfg: OpenQAConfig, folder: ModelFolder, joint: JointRetrieval, train_q: list[Question],
                eval_q: list[Question]) -> dict[str, Any]:
    """Train the reader and the question tower into `cfg.out` (claimed by the caller); the run's record."""
    from bertforge.tasks.finetune import TaskData, train_one

    tokenizer = folder.tokenizer()
    tower = joint.tower
    texts = [q.question for q in train_q]
    was = tower.training
    tower.eval()
    rows, _ = retrieve_rows(tower, joint.vectors, texts, cfg.k)
    encoded = encode_passage_rows(tokenizer, texts, rows, joint.titles, joint.texts, cfg.max_seq_len,
                                  [q.answers for q in train_q])
    tower.train(was)
    found = sum(1 for _, x in encoded if len(x["spans"]))
    if not found:
        raise BertforgeError(f"--train {source_name(cfg.train)}: no question has an answer in its top {cfg.k} "
                             "passages with the starting question encoder; nothing to train on (a larger -k, or "
                             "another index)")
    if found < len(encoded):
        log.warning("%d of %d training questions have no answer in their %d passages at the start; they train "
                    "nothing until the question encoder brings one in", len(encoded) - found, len(encoded), cfg.k)
    ids = tower.tokenizer.encode_ids(texts)
    train_rows = [{"input_ids": torch.tensor(i, dtype=torch.long), "qidx": n} for n, i in enumerate(ids)]
    kind = OrqaKind(cfg, joint, tokenizer, train_q)

    def evaluate(model: nn.Module) -> dict[str, float]:
        q_rows, scores = retrieve_rows(model.question, joint.vectors, [q.question for q in eval_q], cfg.k)
        passages = [[{"id": str(r), "title": joint.titles[r], "text": joint.texts[r], "retrieval_score": float(s)}
                     for r, s in zip(row, srow)] for row, srow in zip(q_rows.tolist(), scores.tolist())]
        return evaluate_reader(model.reader, tokenizer, eval_q, passages, cfg)

    if not eval_q:
        log.warning("no evaluation questions: the last checkpoint is kept as the reader")
    data = TaskData(KIND, None, kind.main_metric, train_rows, evaluate if eval_q else None, kind)  # type: ignore
    torch.manual_seed(cfg.seed)
    record = train_one(cfg, folder, tokenizer, data, Path(cfg.out), cfg.seed)  # type: ignore[arg-type]
    record["questions"] = {"train": len(train_q), "train_answerable_at_start": found, "eval": len(eval_q)}
    return record
