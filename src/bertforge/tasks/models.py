"""Fine-tuning models: an encoder (`.bert`) plus a task head named as Hugging Face names it.

| class | head | HF class it loads in |
|---|---|---|
| `SequenceClassifier` | `dropout` + `classifier` (H -> num_labels) on the pooled output | `BertForSequenceClassification` |
| `TokenClassifier` | `dropout` + `classifier` (H -> num_labels) on every token | `BertForTokenClassification` |
| `QuestionAnswering` | `qa_outputs` (H -> 2: start, end logits) | `BertForQuestionAnswering` |
| `MultipleChoice` | `dropout` + `classifier` (H -> 1) on each choice's pooled output, softmax across choices | `BertForMultipleChoice` |
| `FeatureModel` | frozen encoder, layer mix (`mix`), optional `lstm`, `classifier` | (bertforge only) |

The pooled output is BERT's tanh([CLS]) pooler. A model without one (DistilBERT, ELECTRA, a checkpoint whose file has
no pooler weights, or a sentence-transformers folder, whose pooler its training never touched) pools by the mean of
the last layer over real tokens instead. A family whose sequence classifier
reads the first token (`Family.sequence_head`: RoBERTa's) has no pooler but `FirstTokenClassificationHead`, HF's
`RobertaClassificationHead` (`classifier.dense` -> tanh -> `classifier.out_proj` on <s>), so it loads in
`RobertaForSequenceClassification`.
One whose head owns its pooler (`OWN_POOLER`: DeBERTa's ContextPooler, dense -> GELU on [CLS], stored as `pooler.`)
builds the encoder with that pooler for sequence classification and multiple choice, pretrained or not.
The task heads whose transformers class has another layout (`Family.hf_task_heads` leaves them out: DistilBERT's and
ELECTRA's sequence-classification and multiple-choice heads, all of ModernBERT's, whose classifier has a
dense-act-norm block first), and a BERT-style sequence or choice head that pools by the mean (no pooler), are saved
as `architectures=["Bertforge<Class>"]` (e.g. `BertforgeSequenceClassifier`):
load them with bertforge, never with a transformers class (which would drop our head and use a random one).

Every `forward(**batch)` returns a dict with `logits` and, when `labels` are given, `loss` (the shared Trainer's
contract). Task metadata (label names, task, pooling, QA null threshold) travels in config.json.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.model.checkpoint import hf_name, load_pretrained, read_state_dict, save_pretrained
from bertforge.config import ModelConfig
from bertforge.errors import BertforgeError
from bertforge.families import ENCODER
from bertforge.families.family import CANONICAL_ENCODER, FIRST_TOKEN, OWN_POOLER, POOLER, SLIDING_WINDOW, TASK_HEADS
from bertforge.model.heads import mean_pool, task_output
from bertforge.model import Encoder, load_weights
from bertforge.model.dropout import Dropout
from bertforge.model.sparse.layout import task_global_mask
from bertforge.model.bilstm import load_bilstm
from bertforge.model.folder import ModelFolder
from bertforge.model.onnx import OnnxModel
from bertforge.tasks.folders import saved_task

HEAD_KINDS = TASK_HEADS
FEATURE_MODES = ("last", "second_last", "sum_last4", "concat_last4", "weighted")
HEADS = ("linear", "bilstm")


def encoder_config(cfg: ModelConfig, kind: str) -> ModelConfig:
    """`cfg` as HF builds the encoder for `kind`: no pooler (add_pooling_layer=False) for tagging, QA and a
    first-token sequence classifier (RoBERTa's), whose heads do not read it; always one for the sequence and
    multiple-choice heads of a family whose head owns its pooler (DeBERTa's ContextPooler: initialised afresh when
    the checkpoint has none)."""
    head = cfg.family.sequence_head
    if head == OWN_POOLER and kind in ("classify", "regress", "choice"):
        return cfg if cfg.use_pooler else cfg.replace(use_pooler=True)
    no_pooler = kind in ("tag", "qa") or (kind in ("classify", "regress") and head == FIRST_TOKEN)
    return cfg.replace(use_pooler=False) if no_pooler and cfg.use_pooler else cfg


class _TaskModel(nn.Module):
    """Shared plumbing: the encoder, the pooled vector, and the task metadata saved with the model."""

    kind: str = ""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.bert = Encoder(cfg)
        drop = cfg.extra.get("classifier_dropout")
        self.dropout = Dropout(cfg.hidden_dropout_prob if drop is None else drop)

    def encode(self, input_ids, attention_mask=None, token_type_ids=None):
        if token_type_ids is not None and self.config.type_vocab_size < 2:
            # one segment (RoBERTa): a pair's second segment is marked by its separator alone, whatever type ids
            # the tokenizer gave it (a WordPiece tokenizer gives 1, which indexes past a 1-row table)
            token_type_ids = None
        # Longformer: the global tokens transformers' Longformer task classes set when given none ([CLS]; the
        # question for QA; the endings for multiple choice; none for tagging: `sparse.task_global_mask`)
        glob = (task_global_mask(input_ids, self.kind, self.config.extra.get("sep_token_id", 2))
                if self.config.family.sparse_attention == SLIDING_WINDOW else None)
        return self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                         global_attention_mask=glob)

    def pooled(self, out, attention_mask) -> torch.Tensor:
        """BERT's pooler when the encoder has one, else mean pooling (see the module docstring)."""
        if out.pooler_output is not None:
            return out.pooler_output
        return mean_pool(out.last_hidden_state, attention_mask)

    @property
    def architecture(self) -> str:
        """The HF class name when HF's class has exactly our layout, else a bertforge-only name (see the docstring).
        A pooler-head family's sentence head that pools by the mean (no pooler) is bertforge's: transformers' class
        would read a random pooler instead."""
        name = self.config.family.task_architecture(self.kind, type(self).__name__)
        if (self.kind in ("classify", "regress", "choice") and self.config.family.sequence_head == POOLER
                and self.bert.pooler is None):
            return "Bertforge" + type(self).__name__
        return name

    def _init_head(self, *modules: nn.Module) -> None:
        for m in modules:
            self.bert._init_weights(m)


class FirstTokenClassificationHead(nn.Module):
    """The first-token sequence head (transformers' `RobertaClassificationHead`) on the <s> vector: dropout, dense,
    tanh, dropout, out_proj (BERT's pooler maths, moved)."""

    def __init__(self, hidden_size: int, num_labels: int, dropout: nn.Dropout):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.dropout = dropout
        self.out_proj = nn.Linear(hidden_size, num_labels)

    def forward(self, first_token: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.dense(self.dropout(first_token)))
        return self.out_proj(self.dropout(x))


class SequenceClassifier(_TaskModel):
    """Sentence (pair) classification, or regression with `num_labels=1` and MSE loss.

    A first-token family (RoBERTa's) uses `FirstTokenClassificationHead`, HF's `RobertaClassificationHead` (its
    encoder is built without a pooler, as HF builds it).
    """

    kind = "classify"

    def __init__(self, cfg: ModelConfig, num_labels: int, regression: bool = False):
        super().__init__(cfg)
        if regression and num_labels != 1:
            raise BertforgeError(f"regression needs num_labels=1, got {num_labels}")
        self.kind = "regress" if regression else "classify"
        self.num_labels = num_labels
        self.first_token_head = cfg.family.sequence_head == FIRST_TOKEN
        if self.first_token_head:
            self.classifier: nn.Module = FirstTokenClassificationHead(cfg.hidden_size, num_labels, self.dropout)
            self._init_head(self.classifier.dense, self.classifier.out_proj)
        else:
            self.classifier = nn.Linear(cfg.hidden_size, num_labels)
            self._init_head(self.classifier)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None) -> dict[str, Any]:
        out = self.encode(input_ids, attention_mask, token_type_ids)
        if self.first_token_head:
            logits = self.classifier(out.last_hidden_state[:, 0])
        else:
            logits = self.classifier(self.dropout(self.pooled(out, attention_mask)))
        return task_output(logits, labels, self.kind)


class TokenClassifier(_TaskModel):
    """One label per token (NER); labels of -100 (continuation sub-tokens, specials, padding) are ignored."""

    kind = "tag"

    def __init__(self, cfg: ModelConfig, num_labels: int):
        super().__init__(cfg)
        self.num_labels = num_labels
        self.classifier = nn.Linear(cfg.hidden_size, num_labels)
        self._init_head(self.classifier)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None) -> dict[str, Any]:
        out = self.encode(input_ids, attention_mask, token_type_ids)
        logits = self.classifier(self.dropout(out.last_hidden_state))
        return task_output(logits, labels)


class QuestionAnswering(_TaskModel):
    """Extractive QA: start and end logits per token; the loss is the mean of the two cross-entropies."""

    kind = "qa"

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        del self.dropout  # HF's BertForQuestionAnswering has no dropout before qa_outputs
        self.qa_outputs = nn.Linear(cfg.hidden_size, 2)
        self._init_head(self.qa_outputs)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, start_positions=None,
                end_positions=None) -> dict[str, Any]:
        out = self.encode(input_ids, attention_mask, token_type_ids)
        # unmasked, like HF: the post-processing only ever considers context tokens
        start, end = self.qa_outputs(out.last_hidden_state).float().unbind(-1)
        result: dict[str, Any] = {"start_logits": start, "end_logits": end}
        if start_positions is not None and end_positions is not None:
            # positions outside the window (clamped to T) are ignored, as in HF
            t = start.shape[1]
            sp, ep = start_positions.clamp(0, t), end_positions.clamp(0, t)
            result["loss"] = (F.cross_entropy(start, sp, ignore_index=t) + F.cross_entropy(end, ep, ignore_index=t)) / 2
        return result


class MultipleChoice(_TaskModel):
    """Scores each (context, ending) pair with H -> 1 on its pooled output; softmax across the choices."""

    kind = "choice"

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.classifier = nn.Linear(cfg.hidden_size, 1)
        self._init_head(self.classifier)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None) -> dict[str, Any]:
        b, c, t = input_ids.shape
        flat = lambda x: None if x is None else x.reshape(b * c, t)  # noqa: E731
        out = self.encode(flat(input_ids), flat(attention_mask), flat(token_type_ids))
        logits = self.classifier(self.dropout(self.pooled(out, flat(attention_mask)))).view(b, c)
        return task_output(logits, labels)


# ---- feature-based mode (BERT paper, section 5.3) -----------------------------------------------------------------
class ScalarMix(nn.Module):
    """ELMo's scalar mix: gamma * sum_j softmax(w)_j * layer_j, over the embeddings output and every layer."""

    def __init__(self, num_layers: int):
        super().__init__()
        self.weights = nn.Parameter(torch.zeros(num_layers))
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, layers: tuple[torch.Tensor, ...]) -> torch.Tensor:
        w = self.weights.softmax(0)
        return self.gamma * sum(wi * h for wi, h in zip(w, layers))


class FeatureModel(nn.Module):
    """A frozen encoder whose hidden states feed a small trained head (tagging or sentence classification).

    `features`: last | second_last | sum_last4 | concat_last4 | weighted (learned scalar mix of all layers).
    `head`: linear, or bilstm (a 2-layer BiLSTM of 768 units per direction in the paper; `lstm_hidden` here).
    Sentence classification mean-pools the head's token vectors over real tokens. The encoder stays in eval mode
    (no dropout) and gets no gradients, so its weights are exactly the pretrained ones.
    """

    def __init__(self, cfg: ModelConfig, kind: str, num_labels: int, features: str = "concat_last4",
                 head: str = "linear", lstm_hidden: int = 256, dropout: float = 0.1):
        super().__init__()
        if features not in FEATURE_MODES:
            raise BertforgeError(f"unknown --features {features!r} (choose from {', '.join(FEATURE_MODES)})")
        if head not in HEADS:
            raise BertforgeError(f"unknown --head {head!r} (choose from {', '.join(HEADS)})")
        if kind not in ("classify", "regress", "tag"):
            raise BertforgeError(f"feature-based mode supports classify, regress and tag tasks, not {kind!r}")
        if cfg.num_hidden_layers < 4 and features in ("sum_last4", "concat_last4"):
            raise BertforgeError(f"--features {features} needs at least 4 layers (the model has {cfg.num_hidden_layers})")
        self.config, self.kind, self.num_labels = cfg, kind, num_labels
        self.features, self.head = features, head
        self.bert = Encoder(cfg)
        self.bert.requires_grad_(False)
        h = cfg.hidden_size
        dim = 4 * h if features == "concat_last4" else h
        self.mix = ScalarMix(cfg.num_hidden_layers + 1) if features == "weighted" else None
        self.dropout = Dropout(dropout)
        self.lstm = (nn.LSTM(dim, lstm_hidden, num_layers=2, bidirectional=True, batch_first=True, dropout=dropout)
                     if head == "bilstm" else None)
        self.classifier = nn.Linear(2 * lstm_hidden if self.lstm is not None else dim, num_labels)

    def train(self, mode: bool = True) -> "FeatureModel":
        super().train(mode)
        self.bert.eval()  # frozen features: never dropout inside the encoder
        return self

    def token_features(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.Tensor:
        with torch.no_grad():
            hs = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                           output_hidden_states=True).hidden_states
        if self.features == "last":
            return hs[-1]
        if self.features == "second_last":
            return hs[-2]
        if self.features == "sum_last4":
            return torch.stack(hs[-4:]).sum(0)
        if self.features == "concat_last4":
            return torch.cat(hs[-4:], dim=-1)
        return self.mix(hs)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None) -> dict[str, Any]:
        x = self.dropout(self.token_features(input_ids, attention_mask, token_type_ids))
        if self.lstm is not None:
            lengths = (attention_mask.sum(1) if attention_mask is not None
                       else torch.full((x.shape[0],), x.shape[1], device=x.device)).cpu()
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            x, _ = self.lstm(packed)
            x, _ = nn.utils.rnn.pad_packed_sequence(x, batch_first=True, total_length=input_ids.shape[1])
            x = self.dropout(x)
        if self.kind != "tag":
            x = mean_pool(x, attention_mask)
        logits = self.classifier(x)
        return task_output(logits, labels, self.kind)

    @property
    def architecture(self) -> str:
        return "BertforgeFeatureModel"


# ---- building, saving, loading -------------------------------------------------------------------------------------
def build_model(cfg: ModelConfig, kind: str, num_labels: int = 2, freeze: dict[str, Any] | None = None) -> nn.Module:
    """A fresh task model of `kind` on an encoder of `cfg` (weights initialised; load a checkpoint next)."""
    if kind not in HEAD_KINDS:
        raise BertforgeError(f"unknown task kind {kind!r} (choose from {', '.join(HEAD_KINDS)})")
    if freeze:
        return FeatureModel(cfg, kind, num_labels, **freeze)
    cfg = encoder_config(cfg, kind)
    if kind in ("classify", "regress"):
        return SequenceClassifier(cfg, num_labels, regression=kind == "regress")
    if kind == "tag":
        return TokenClassifier(cfg, num_labels)
    if kind == "qa":
        return QuestionAnswering(cfg)
    return MultipleChoice(cfg)


def task_config(model: nn.Module, labels: list[str] | None, task: dict[str, Any]) -> dict[str, Any]:
    """The config.json fields HF reads (id2label with string keys, label2id, problem_type) plus bertforge's task."""
    kind = model.kind
    out: dict[str, Any] = {"bertforge_task": dict(task, kind=kind)}
    if kind in ("classify", "regress", "tag"):
        names = labels if labels is not None else ["LABEL_0"]
        out["id2label"] = {str(i): name for i, name in enumerate(names)}
        out["label2id"] = {name: i for i, name in enumerate(names)}
        out["num_labels"] = len(names)
    if kind == "classify":
        out["problem_type"] = "single_label_classification"
    elif kind == "regress":
        out["problem_type"] = "regression"
    return out


def save_task_model(model: nn.Module, path: str | Path, labels: list[str] | None, task: dict[str, Any],
                    tokenizer: Any = None) -> Path:
    """Write an HF directory that transformers' `<Family>For<Task>` loads with no missing or unexpected keys."""
    extra = task_config(model, labels, task)
    if isinstance(model, FeatureModel):
        extra["bertforge_task"].update(features=model.features, head=model.head,
                                       lstm_hidden=model.lstm.hidden_size if model.lstm is not None else None)
    return save_pretrained(model, path, model.config, architecture=model.architecture, tokenizer=tokenizer,
                           extra_config=extra)


def init_from_pretrained(path: "str | Path | ModelFolder", kind: str, num_labels: int = 2,
                         freeze: dict[str, Any] | None = None) -> tuple[nn.Module, list[str]]:
    """A task model whose encoder comes from the checkpoint at `path` (heads freshly initialised unless present).

    A checkpoint without pooler weights gets no pooler (mean pooling) rather than a random one: a random tanh
    pooler would make the classifier's input noise at the start of fine-tuning. Returns (model, missing names).
    """
    folder = ModelFolder.open(path)
    cfg = folder.config_for(ENCODER, verb="an encoder to fine-tune")
    tensors = read_state_dict(folder.path)
    state = tensors[0]
    pooler = hf_name(f"{CANONICAL_ENCODER}.pooler.dense.weight", cfg)  # the family's name for it (ALBERT's differs)
    if cfg.use_pooler and kind in ("classify", "regress", "choice") and not freeze:
        # a sentence-transformers folder (modules.json) carries a pooler its training never touched (only the
        # mean-pooled sentence embedding was trained: all-MiniLM-L6-v2's is near zero), so it pools by the mean
        if folder.holds == "sentence-encoder" or not any(
                k.endswith("pooler.dense.weight") or k.endswith(pooler) for k in state):
            cfg = cfg.replace(use_pooler=False)
    cfg = cfg.replace(extra=dict(cfg.extra))
    model = build_model(cfg, kind, num_labels, freeze)
    missing = load_pretrained(model, folder.path, tensors=tensors)
    if isinstance(model, SequenceClassifier) and model.first_token_head and "classifier.dense.weight" in missing:
        # start the head's dense layer from the pretrained pooler when there is one: the same maths as BERT's
        for end in ("weight", "bias"):
            key = next((k for k in state if k.endswith(f"pooler.dense.{end}")), None)
            if key is not None:
                with torch.no_grad():
                    getattr(model.classifier.dense, end).copy_(state[key])
                missing.remove(f"classifier.dense.{end}")
    return model, missing


def load_task_model(path: "str | Path | ModelFolder") -> tuple[nn.Module, dict[str, Any], list[str] | None]:
    """Load a fine-tuned directory written by `save_task_model` (or an opened model folder): (model in eval mode,
    task info, label names). An exported ONNX graph runs in onnxruntime, int8 weights as they were saved."""
    folder = ModelFolder.open(path)
    if folder.holds == "bilstm":  # a distilled BiLSTM student (bertforge distill task --student bilstm)
        return load_bilstm(folder)
    task, labels = saved_task(folder)
    if folder.graph is not None:  # `bertforge export`: the graph in onnxruntime, called like the model
        return OnnxModel(folder.graph).eval(), task, labels
    freeze = None
    if task.get("features"):
        freeze = {"features": task["features"], "head": task["head"], "lstm_hidden": task.get("lstm_hidden") or 256}
    model = build_model(folder.config_for(ENCODER, verb="a task model"), task["kind"], len(labels) if labels else 2,
                        freeze)
    model, missing = load_weights(model, folder)
    head_missing = [m for m in missing if not m.startswith("bert.")]
    if head_missing:
        raise BertforgeError(f"{folder.path}: the task head is missing from the checkpoint "
                             f"({', '.join(head_missing[:3])})")
    return model.eval(), task, labels
