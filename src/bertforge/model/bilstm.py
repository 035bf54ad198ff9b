"""The BiLSTM student of Tang et al. (2019), "Distilling Task-Specific Knowledge from BERT into Simple Neural Networks".

A one-layer bidirectional LSTM over the teacher's word pieces (embeddings initialised from the teacher's input
embeddings), a ReLU MLP on the sentence vector (last forward state ++ first backward state) or, for tagging, on
every token. It saves with its own config.json (`model_type: bertforge-bilstm`, the task fields `predict` and
`evaluate` read) and the teacher's tokenizer. `augment` is the paper's data augmentation: each piece masked with
probability p_mask, and with probability p_ng an n-gram (n in 1..5) sampled from the masked example.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.io.write import write_json
from bertforge.model.checkpoint import read_tensors, write_tensors
from bertforge.model.folder import BILSTM_MODEL_TYPE as MODEL_TYPE
from bertforge.model.folder import ModelFolder
from bertforge.model.heads import task_output

ARCHITECTURE = "BertforgeBiLSTM"


@dataclass
class BiLSTMConfig:
    vocab_size: int
    embedding_dim: int
    num_labels: int
    kind: str = "classify"  # classify | regress | tag
    hidden_size: int = 300  # per direction (the paper's 300)
    mlp_size: int = 400
    dropout: float = 0.1
    pad_token_id: int = 0


class BiLSTMStudent(nn.Module):
    """Embedding -> BiLSTM -> MLP. `forward(**batch)` returns {"logits"} (+ "loss" given labels), like task models."""

    def __init__(self, cfg: BiLSTMConfig):
        super().__init__()
        if cfg.kind not in ("classify", "regress", "tag"):
            raise BertforgeError(f"the BiLSTM student does classify, regress and tag tasks, not {cfg.kind!r}")
        self.config, self.kind, self.num_labels = cfg, cfg.kind, cfg.num_labels
        self.embeddings = nn.Embedding(cfg.vocab_size, cfg.embedding_dim, padding_idx=cfg.pad_token_id)
        self.lstm = nn.LSTM(cfg.embedding_dim, cfg.hidden_size, batch_first=True, bidirectional=True)
        self.dropout = nn.Dropout(cfg.dropout)
        self.mlp = nn.Sequential(nn.Linear(2 * cfg.hidden_size, cfg.mlp_size), nn.ReLU(), nn.Dropout(cfg.dropout),
                                 nn.Linear(cfg.mlp_size, cfg.num_labels))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None) -> dict[str, Any]:
        b, t = input_ids.shape
        lengths = (attention_mask.sum(1) if attention_mask is not None
                   else torch.full((b,), t, device=input_ids.device)).clamp(min=1).cpu()
        x = self.dropout(self.embeddings(input_ids))
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, (h, _) = self.lstm(packed)
        if self.kind == "tag":
            feats, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=t)
        else:
            feats = torch.cat([h[0], h[1]], dim=-1)  # last forward state ++ last backward state (at token 0)
        logits = self.mlp(self.dropout(feats))
        return task_output(logits, labels, self.kind)

    @property
    def architecture(self) -> str:
        return ARCHITECTURE

    def save_pretrained(self, path: str | Path, labels: list[str] | None, task: dict[str, Any],
                        tokenizer: Any = None) -> Path:
        """model.safetensors, then config.json (the task fields `saved_task` reads), then the tokenizer."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        write_tensors(path / "model.safetensors",
                      {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()})
        if tokenizer is not None:
            tokenizer.save_pretrained(path)
        config: dict[str, Any] = {"model_type": MODEL_TYPE, "architectures": [ARCHITECTURE],
                                  "bilstm": asdict(self.config), "bertforge_task": dict(task, kind=self.kind)}
        if self.kind != "regress":
            names = labels or [f"LABEL_{i}" for i in range(self.num_labels)]
            config.update(id2label={str(i): n for i, n in enumerate(names)},
                          label2id={n: i for i, n in enumerate(names)}, num_labels=len(names))
        write_json(path / "config.json", config, sort_keys=True)
        return path


def load_bilstm(path: "str | Path | ModelFolder") -> tuple[BiLSTMStudent, dict[str, Any], list[str] | None]:
    """(model in eval mode, task info, label names), as `tasks.models.load_task_model` returns them."""
    folder = ModelFolder.open(path).require("bilstm", verb="a BiLSTM student")
    path, config = folder.path, folder.config
    try:
        cfg = BiLSTMConfig(**config["bilstm"])
    except (KeyError, TypeError) as err:
        raise BertforgeError(f"{path / 'config.json'}: bad 'bilstm' section ({err})") from None
    model = BiLSTMStudent(cfg)
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise BertforgeError(f"{path}: no model.safetensors")
    state = read_tensors(weights)
    missing = sorted(set(model.state_dict()) - set(state))
    if missing:
        raise BertforgeError(f"{weights}: tensor {missing[0]!r} is missing")
    model.load_state_dict(state)
    return model.eval(), folder.task, folder.labels


def student_from_teacher_embeddings(teacher: nn.Module, kind: str, num_labels: int, pad_token_id: int,
                                    hidden_size: int = 300, mlp_size: int = 400,
                                    dropout: float = 0.1) -> BiLSTMStudent:
    """A BiLSTM whose word-piece embeddings start as the teacher's input embeddings (projected size E)."""
    emb = teacher.bert.embeddings.word_embeddings.weight
    cfg = BiLSTMConfig(vocab_size=emb.shape[0], embedding_dim=emb.shape[1], num_labels=num_labels, kind=kind,
                       hidden_size=hidden_size, mlp_size=mlp_size, dropout=dropout, pad_token_id=pad_token_id)
    student = BiLSTMStudent(cfg)
    with torch.no_grad():
        student.embeddings.weight.copy_(emb.detach().float())
    return student


def augment(rows: list[dict[str, torch.Tensor]], n_iter: int, mask_id: int, special_ids: set[int],
            p_mask: float = 0.1, p_ng: float = 0.25, seed: int = 0, ngrams: bool = True) -> list[dict]:
    """Tang et al.'s augmentation: `n_iter` unlabelled variants per row (duplicates dropped, originals excluded).

    Each non-special piece becomes [MASK] with probability p_mask; then, with probability p_ng (sentence tasks
    only: `ngrams`), the variant is cut to a random n-gram (n in 1..5) of its pieces, kept between the specials.
    Tagging rows keep their length (labels align by position); their variants carry no labels either way."""
    rng = np.random.default_rng(seed)
    seen = {r["input_ids"].numpy().tobytes() for r in rows}
    out = []
    for row in rows:
        ids = row["input_ids"].numpy()
        inner = np.array([i not in special_ids for i in ids.tolist()])
        for _ in range(n_iter):
            new = ids.copy()
            new[inner & (rng.random(len(ids)) < p_mask)] = mask_id
            positions = np.flatnonzero(inner)
            if ngrams and len(positions) > 1 and rng.random() < p_ng:
                n = int(rng.integers(1, min(5, len(positions)) + 1))
                start = int(rng.integers(0, len(positions) - n + 1))
                keep = np.concatenate([np.flatnonzero(~inner[:positions[0]]),  # leading specials ([CLS])
                                       positions[start:start + n],
                                       np.arange(positions[-1] + 1, len(ids))])  # trailing specials ([SEP])
                new = new[keep]
            key = new.tobytes()
            if key in seen:
                continue
            seen.add(key)
            t = torch.from_numpy(new.astype(np.int64))
            aug = {"input_ids": t, "attention_mask": torch.ones_like(t), "token_type_ids": torch.zeros_like(t)}
            if "token_type_ids" in row and len(new) == len(ids):
                aug["token_type_ids"] = row["token_type_ids"].clone()
            out.append(aug)
    return out
