"""The open-domain QA reader (DPR's reader, Karpukhin et al. 2020; the marginal loss of ORQA, Lee et al. 2019): one
encoder reads `[CLS] question [SEP] title [SEP] passage [SEP]` for each of a question's k retrieved passages and
gives, per passage, start and end logits over its tokens and a passage-selection logit from [CLS].

    model = Reader.from_encoder("runs/bert")             # heads initialised; or load_reader("runs/reader")
    out = model(**batch)                                  # batch: [B, K, L] rows from retrieval.reader_features
    out["loss"], out["passage_loss"], out["span_loss"]

Training loss, per question (its K passages; `marginal_loss`):
  passage loss = -log sum over the passages holding an answer of softmax_K(selection)
  span loss    = -log sum over every (passage, start, end) whose text matches an answer (SQuAD-normalised) of
                 p(start) p(end), each a softmax over that passage's own tokens
Passages without an answer are the negatives of the selection softmax. A question none of whose passages holds an
answer adds nothing (the training data drops such questions first, as DPR does).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.families import ENCODER
from bertforge.model.checkpoint import load_pretrained, save_pretrained
from bertforge.model.folder import ModelFolder
from bertforge.tasks.models import _TaskModel, encoder_config

KIND = "open-qa"  # config.json's bertforge_task.kind of a saved reader
ARCHITECTURE = "BertforgeReader"  # no transformers class has the selection head: load it with bertforge
NEG = -1e9  # a logit that softmax turns into an exact 0 in fp32, without the NaNs of -inf in an empty row


class Reader(_TaskModel):
    """An encoder (`.bert`), `qa_outputs` (H -> 2: start, end) on every token and `qa_classifier` (H -> 1) on
    [CLS] (DPR's names)."""

    kind = "qa"  # how the encoder is built and which tokens a sparse-attention family makes global: the question's

    def __init__(self, cfg):
        super().__init__(cfg)
        del self.dropout  # as the span reader: no dropout before the heads
        self.qa_outputs = nn.Linear(cfg.hidden_size, 2)
        self.qa_classifier = nn.Linear(cfg.hidden_size, 1)
        self._init_head(self.qa_outputs, self.qa_classifier)

    @property
    def architecture(self) -> str:
        return ARCHITECTURE

    @classmethod
    def from_encoder(cls, path: "str | Path | ModelFolder") -> tuple["Reader", list[str]]:
        """A reader whose encoder (and heads, when the folder is a reader) come from `path`; (model, missing)."""
        folder = ModelFolder.open(path)
        cfg = encoder_config(folder.config_for(ENCODER, verb="a reader"), "qa")
        model = cls(cfg.replace(extra=dict(cfg.extra)))
        return model, load_pretrained(model, folder.path)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, span_mask=None, passage_mask=None,
                spans=None, **_: Any) -> dict[str, Any]:
        """`input_ids` [B, K, L] (or [K, L]: one question); `span_mask` [B, K, L]: the tokens an answer may start or
        end on (the passage's); `passage_mask` [B, K]: real passages (padding False); `spans` [B, S, 3]: (passage,
        start, end) of every answer occurrence, -1 rows padding. Returns start / end logits [B, K, L] (outside
        `span_mask` set to a large negative), selection logits [B, K], and the loss when `spans` is given."""
        one = input_ids.dim() == 2
        if one:
            input_ids, attention_mask, token_type_ids, span_mask, passage_mask, spans = (
                None if t is None else t.unsqueeze(0)
                for t in (input_ids, attention_mask, token_type_ids, span_mask, passage_mask, spans))
        b, k, t = input_ids.shape
        flat = lambda x: None if x is None else x.reshape(b * k, t)  # noqa: E731
        hidden = self.encode(flat(input_ids), flat(attention_mask), flat(token_type_ids)).last_hidden_state
        start, end = self.qa_outputs(hidden).float().view(b, k, t, 2).unbind(-1)
        select = self.qa_classifier(hidden[:, 0]).float().view(b, k)
        if span_mask is not None:
            start, end = start.masked_fill(~span_mask.bool(), NEG), end.masked_fill(~span_mask.bool(), NEG)
        if passage_mask is not None:
            select = select.masked_fill(~passage_mask.bool(), NEG)
        out: dict[str, Any] = {"start_logits": start, "end_logits": end, "select_logits": select}
        if spans is not None:
            passage, span = marginal_loss(start, end, select, spans)
            out.update(loss=passage + span, passage_loss=passage.detach(), span_loss=span.detach())
        if one:
            out = {k: v.squeeze(0) if k.endswith("_logits") else v for k, v in out.items()}
        return out


def marginal_loss(start: torch.Tensor, end: torch.Tensor, select: torch.Tensor,
                  spans: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(passage loss, span loss), each the mean over the questions that have an answer span (see the module
    docstring). `start` / `end` [B, K, L] logits (non-passage tokens already masked), `select` [B, K], `spans`
    [B, S, 3] long (passage, start token, end token; rows of -1 are padding)."""
    b = start.shape[0]
    valid = spans[..., 0] >= 0  # [B, S]
    has = valid.any(-1)  # questions with at least one answer occurrence
    if not bool(has.any()):
        zero = select.sum() * 0.0  # keeps the graph: a batch without answers trains nothing
        return zero, zero
    p, s, e = spans.clamp(min=0).unbind(-1)
    rows = torch.arange(b, device=spans.device)[:, None].expand_as(p)
    log_start, log_end = start.log_softmax(-1), end.log_softmax(-1)
    log_select = select.log_softmax(-1)
    span_lp = (log_start[rows, p, s] + log_end[rows, p, e]).masked_fill(~valid, NEG)  # [B, S]
    # the passages that hold an answer: every passage named by a valid span
    holds = torch.zeros_like(select, dtype=torch.bool)
    holds[rows[valid], p[valid]] = True
    passage_lp = log_select.masked_fill(~holds, NEG)
    passage_loss = -torch.logsumexp(passage_lp, -1)[has].mean()
    span_loss = -torch.logsumexp(span_lp, -1)[has].mean()
    return passage_loss, span_loss


# ---- saving and loading --------------------------------------------------------------------------------------------
def save_reader(model: Reader, path: str | Path, tokenizer: Any, info: dict[str, Any]) -> Path:
    """An HF-layout folder (config.json with bertforge_task {kind: open-qa, max_seq_len, and the index / retriever
    it was trained with, as hints}, model.safetensors, the tokenizer)."""
    return save_pretrained(model, path, model.config, architecture=ARCHITECTURE, tokenizer=tokenizer,
                           extra_config={"bertforge_task": dict(info, kind=KIND)})


def load_reader(path: "str | Path | ModelFolder", flag: str = "--reader") -> tuple[Reader, Any, dict[str, Any]]:
    """(reader in eval mode, its tokenizer, its bertforge_task record) from a folder `save_reader` wrote."""
    folder = ModelFolder.open(path, flag)
    task = folder.task or {}
    if task.get("kind") != KIND:
        what = f"a {task.get('kind')} model" if task else "not a fine-tuned reader"
        raise BertforgeError(f"{flag} {folder.path}: {what}; train one with `bertforge finetune --task open-qa`")
    model, missing = Reader.from_encoder(folder)
    head = [m for m in missing if not m.startswith("bert.")]
    if head:
        raise BertforgeError(f"{flag} {folder.path}: the reader's heads are missing from the checkpoint "
                             f"({', '.join(head[:3])})")
    return model.eval(), folder.tokenizer(), task
