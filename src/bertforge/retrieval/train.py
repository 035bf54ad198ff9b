"""Training a retriever's towers on the shared Trainer (checkpoints, exact resume, bf16, progress): DPR's batches
(each question, its positive and its hard negatives; every other passage of the batch a negative) or ICT's
(`retrieval.ict`: a sentence and the block it came from)."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

import torch

from bertforge.embedding.modules import Dense, SentenceEncoder
from bertforge.model.checkpoint import load_pretrained
from bertforge.retrieval.dpr import RetrievalExample, _normal
from bertforge.retrieval.towers import PASSAGE_DIR, QUESTION_DIR, BiEncoder, save_retriever
from bertforge.training import ResumableLoader, TrainConfig, Trainer


class _Tokenize:
    """A tower's tokenisation alone (what a batch needs; picklable for loader processes without the weights)."""

    def __init__(self, tower: SentenceEncoder):
        t = tower.transformer
        self.tokenizer, self.max_len, self.lower = t.tokenizer, t.max_seq_length, t.do_lower_case

    def __call__(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        texts = [s.strip().lower() if self.lower else s.strip() for s in texts]
        return self.tokenizer(texts, max_length=self.max_len, padding="longest", truncation=True,
                              return_tensors="pt")


class RetrievalCollator:
    """Examples -> one batch: the questions, then the passages (the positives in question order, then each
    question's first `hard_negatives` negatives), `targets` (question i's positive: passage i) and `same` (the other
    copies of question i's positive, which are not negatives for it)."""

    def __init__(self, model: BiEncoder, hard_negatives: int = 0):
        self.question = _Tokenize(model.question)
        self.passage = _Tokenize(model.passage_tower)
        self.hard_negatives = hard_negatives

    def __call__(self, examples: list[RetrievalExample]) -> dict[str, torch.Tensor]:
        passages = [ex.positive for ex in examples]
        for ex in examples:
            passages.extend(ex.negatives[:self.hard_negatives])
        keys = [_normal(p) for p in passages]
        n = len(examples)
        same = torch.tensor([[j != i and keys[j] == keys[i] for j in range(len(passages))] for i in range(n)],
                            dtype=torch.bool)
        batch = {f"q_{k}": v for k, v in self.question([ex.question for ex in examples]).items()}
        batch.update({f"p_{k}": v for k, v in self.passage(passages).items()})
        batch["targets"] = torch.arange(n)
        if same.any():
            batch["same"] = same
        return batch


def fit(model: BiEncoder, dataset: Sequence, out_dir: str | Path, collate: Callable[[list], dict] | None = None,
        hard_negatives: int = 0, epochs: float | None = 1.0, max_steps: int | None = None,
        time_budget: str | float | None = None, batch_size: int = 16, lr: float = 2e-5,
        warmup_ratio: float = 0.1, seed: int = 0, progress: bool = True, device: str = "auto",
        precision: str = "fp32", compile: bool | None = None, report_to: tuple[str, ...] = (),
        logging_dir: str | Path | None = None, resume: bool = False, save_every: int | None = None,
        log_every: int = 10, extra: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], Trainer]:
    """Train `model` in place on `dataset` (examples `collate` batches; default: DPR's `RetrievalCollator`) and save
    it to `out_dir` as a retriever folder (`retrieval.towers`). Returns (history, trainer)."""
    collate = collate or RetrievalCollator(model, hard_negatives)
    loader = ResumableLoader(dataset, batch_size, collate_fn=collate, shuffle=True, seed=seed,
                             drop_last=len(dataset) >= batch_size)  # a short last batch has fewer negatives
    if max_steps is not None or time_budget is not None:
        length = {"max_steps": max_steps, "time_budget_s": time_budget}
    else:
        length = {"num_epochs": epochs}
    cfg = TrainConfig(out_dir=out_dir, lr=lr, warmup_ratio=warmup_ratio, seed=seed, progress=progress,
                      report_to=report_to, logging_dir=logging_dir, device=device, precision=precision,
                      compile=compile, resume=resume, save_every=save_every, log_every=log_every,
                      extra=extra or {}, **length)
    trainer = Trainer(model, loader, cfg, save_fn=_save, load_fn=_load)
    model.train()
    history = trainer.train()
    model.eval()
    save_retriever(model, out_dir)
    return history, trainer


def _save(model: BiEncoder, directory: Path) -> None:
    save_retriever(model, directory, dpr=False)


def _load_tower(tower: SentenceEncoder, directory: Path) -> None:
    load_pretrained(tower.transformer.bert, directory)
    for idx, module in enumerate(tower):
        if isinstance(module, Dense):
            module.load_state_dict(Dense.load(directory / f"{idx}_Dense").state_dict())


def _load(model: BiEncoder, directory: Path) -> None:
    directory = Path(directory)
    _load_tower(model.question, directory / QUESTION_DIR)
    if model.passage is not None:
        _load_tower(model.passage, directory / PASSAGE_DIR)
