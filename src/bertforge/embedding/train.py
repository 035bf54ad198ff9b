"""Fine-tune a SentenceEncoder with one of the losses in `bertforge.embedding.losses`, on the shared Trainer."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from bertforge.model.checkpoint import load_pretrained, read_tensors, write_tensors
from bertforge.embedding.data import Dataset, Example
from bertforge.embedding.losses import ENTAILMENT, SoftmaxLoss, make_loss
from bertforge.embedding.modules import Dense, SentenceEncoder
from bertforge.errors import BertforgeError
from bertforge.training import ResumableLoader, TrainConfig, Trainer

# Which example kinds each loss can learn from.
LOSS_KINDS = {"cosine": {"scored"}, "softmax": {"nli"}, "triplet": {"triplet"}, "mnrl": {"pair", "triplet", "nli"}}


class BiEncoderTrainingModel(nn.Module):
    """SentenceEncoder + loss; `forward(**batch)` embeds each text column and returns {"loss"}."""

    def __init__(self, encoder: SentenceEncoder, loss: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.loss = loss

    def forward(self, labels: torch.Tensor | None = None, **columns: torch.Tensor) -> dict[str, torch.Tensor]:
        n = sum(1 for k in columns if k.startswith("input_ids_"))
        embeddings = [self.encoder.embed_features({"input_ids": columns[f"input_ids_{i}"],
                                                   "attention_mask": columns[f"attention_mask_{i}"],
                                                   "token_type_ids": columns[f"token_type_ids_{i}"]})
                      for i in range(n)]
        return {"loss": self.loss(embeddings, labels)}


class Collator:
    """Examples -> one tokenised tensor group per text column (+ labels)."""

    def __init__(self, encoder: SentenceEncoder, label_scale: float = 1.0):
        self.encoder, self.label_scale = encoder, label_scale

    def __call__(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        batch: dict[str, torch.Tensor] = {}
        for col in range(len(examples[0].texts)):
            feats = self.encoder.tokenize([ex.texts[col] for ex in examples])
            batch.update({f"{k}_{col}": v for k, v in feats.items()})
        if examples[0].label is not None:
            batch["labels"] = torch.tensor([ex.label / self.label_scale if isinstance(ex.label, float) else ex.label
                                            for ex in examples])
        return batch


def prepare(dataset: Dataset, loss_name: str) -> tuple[Dataset, float]:
    """Check the data suits the loss; NLI rows for MNRL become (premise, entailed hypothesis) pairs.

    Returns the dataset and the label scale (cosine loss: scores above 1 are divided by 5, the STS range).
    """
    if dataset.kind not in LOSS_KINDS[loss_name]:
        raise BertforgeError(f"loss {loss_name!r} needs {' or '.join(sorted(LOSS_KINDS[loss_name]))} examples, "
                             f"the training file holds {dataset.kind} examples")
    if loss_name == "mnrl" and dataset.kind == "nli":
        dataset = Dataset([Example(ex.texts) for ex in dataset.examples if ex.label == ENTAILMENT], "pair")
    scale = 1.0
    if loss_name == "cosine":
        top = max(float(ex.label) for ex in dataset.examples)
        scale = 5.0 if top > 1.0 else 1.0
        for ex in dataset.examples:
            ex.label = float(ex.label)
    return dataset, scale


def fit(encoder: SentenceEncoder, dataset: Dataset, out_dir: str | Path, loss: str = "cosine",
        epochs: float = 1.0, batch_size: int = 16, lr: float = 2e-5, warmup_ratio: float = 0.1,
        max_steps: int | None = None, seed: int = 0, num_labels: int = 3, progress: bool = True,
        eval_fn: Callable[[SentenceEncoder], dict[str, float]] | None = None, report_to: tuple[str, ...] = (),
        logging_dir: str | Path | None = None, device: str = "auto", precision: str = "fp32",
        compile: bool | None = None) -> list[dict[str, Any]]:
    """Train `encoder` in place, save it (sentence-transformers layout) to `out_dir`, return the history.
    `device`, `precision` (fp32 or bf16 autocast) and `compile` as in `TrainConfig`.

    Checkpoints (for exact resume) go to out_dir/checkpoints; the loss head (SoftmaxLoss classifier) is kept in
    them but not in the final model, as in sentence-transformers.
    """
    dataset, scale = prepare(dataset, loss)
    loss_module = make_loss(loss, encoder.dim, num_labels)
    model = BiEncoderTrainingModel(encoder, loss_module)
    loader = ResumableLoader(dataset, batch_size, collate_fn=Collator(encoder, scale), shuffle=True, seed=seed,
                             drop_last=loss == "mnrl")  # MNRL: a short last batch has too few negatives
    cfg = TrainConfig(out_dir=out_dir, lr=lr, warmup_ratio=warmup_ratio, seed=seed, progress=progress,
                      report_to=report_to, logging_dir=logging_dir, device=device, precision=precision,
                      compile=compile,
                      **({"max_steps": max_steps} if max_steps else {"num_epochs": epochs}))
    trainer = Trainer(model, loader, cfg, save_fn=_save, load_fn=_load,
                      eval_fn=(lambda m: eval_fn(m.encoder)) if eval_fn else None)
    encoder.train()
    history = trainer.train()
    encoder.eval()
    encoder.save_pretrained(out_dir)
    encoder.source = Path(out_dir)
    return history


def _save(model: BiEncoderTrainingModel, directory: Path) -> None:
    model.encoder.save_pretrained(directory)
    if isinstance(model.loss, SoftmaxLoss) or any(True for _ in model.loss.parameters()):
        tensors = {k: v.detach().cpu().contiguous() for k, v in model.loss.state_dict().items()}
        write_tensors(Path(directory) / "loss_head.safetensors", tensors)


def _load(model: BiEncoderTrainingModel, directory: Path) -> None:
    directory = Path(directory)
    load_pretrained(model.encoder.transformer.bert, directory)
    for idx, module in enumerate(model.encoder):
        if isinstance(module, Dense):
            module.load_state_dict(Dense.load(directory / f"{idx}_Dense").state_dict())
    head = directory / "loss_head.safetensors"
    if head.is_file():
        model.loss.load_state_dict(read_tensors(head))
