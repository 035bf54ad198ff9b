"""Heads on top of the encoder, with Hugging Face's BERT names, and the pooling and loss every task shares.

The MLM head projects to the vocabulary only at the positions it is given: in a small model the vocabulary
projection (H x 30k) costs more than the whole encoder, and only ~15% of positions carry a label. Its training loss
(`vocab_loss`) takes the projection and the cross-entropy as one step; `masked_lm_loss` is the plain one.
`mean_pool` and `task_loss` are the one mean pooling and the one classification / regression loss choice, used by
fine-tuning (`bertforge.tasks.models`), the cross-encoder and sentence embeddings.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.model.checkpoint import load_pretrained, save_pretrained
from bertforge.config import ModelConfig
from bertforge.errors import BertforgeError
from bertforge.families import ENCODER
from bertforge.model import Encoder, XLNetEncoder, activation
from bertforge.model.folder import ModelFolder


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of token vectors over real (unpadded) positions: [B, T, H] -> [B, H].

    The count is clamped at 1e-9 as sentence-transformers does, so its vectors are reproduced exactly.
    """
    if attention_mask is None:
        return hidden.mean(1)
    m = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)


def task_loss(logits: torch.Tensor, labels: torch.Tensor, regression: bool = False) -> torch.Tensor:
    """MSE for regression (one output), else cross-entropy over the last axis, ignoring labels of -100.

    Computed in fp32 whatever the autocast dtype. Covers sequence ([B, C]), token ([B, T, C]) and multiple-choice
    ([B, choices]) logits alike.
    """
    if regression:
        return F.mse_loss(logits.squeeze(-1).float(), labels.float())
    return F.cross_entropy(logits.float().flatten(0, -2), labels.long().flatten(), ignore_index=-100)


def task_output(logits: torch.Tensor, labels: torch.Tensor | None, kind: str = "") -> dict[str, Any]:
    """What every task model's forward returns: its logits, and the `task_loss` of them when labels are given."""
    result: dict[str, Any] = {"logits": logits}
    if labels is not None:
        result["loss"] = task_loss(logits, labels, regression=kind == "regress")
    return result


class LMTransform(nn.Module):
    """dense (H -> E) -> activation -> LayerNorm(E), before the tied vocabulary projection."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.embedding_size, bias=cfg.head_bias)
        # the family's (RoBERTa's lm_head and ELECTRA's generator hard-code erf GELU), else hidden_act (ModernBERT's
        # classifier_activation, which bertforge keeps equal to it)
        self.act = activation(cfg.family.mlm_head_act or cfg.hidden_act)
        self.LayerNorm = nn.LayerNorm(cfg.embedding_size, eps=cfg.layer_norm_eps, bias=cfg.norm_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(x)))


class MaskedLMHead(nn.Module):
    def __init__(self, cfg: ModelConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = LMTransform(cfg)
        self.decoder = nn.Linear(cfg.embedding_size, cfg.vocab_size, bias=False)
        self.decoder.weight = word_embeddings.weight  # tied, as in every BERT-family checkpoint
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size)) if cfg.decoder_bias else None
        nn.init.normal_(self.transform.dense.weight, 0.0, cfg.initializer_range)
        if self.transform.dense.bias is not None:
            nn.init.zeros_(self.transform.dense.bias)

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [N, V] at the True entries of the bool mask `positions` [B, T]; [B, T, V] when it is None."""
        if positions is not None:
            hidden = hidden[positions]
        return F.linear(self.transform(hidden), self.decoder.weight, self.bias)


def masked_lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy and accuracy over the selected positions (logits [N, V], targets [N]); 0 when N == 0."""
    if targets.numel() == 0:  # a batch with nothing masked still has to take part in backward (DDP)
        zero = logits.sum() * 0.0
        return zero, zero.detach()
    logits = logits.float()  # the softmax in fp32 under autocast; argmax on fp32 is also far faster on CPU than bf16
    loss = F.cross_entropy(logits, targets)
    acc = (logits.detach().argmax(-1) == targets).float().mean()
    return loss, acc


_BLOCK_ELEMENTS = 1 << 21  # logits per vocabulary block on the CPU (8 MB in fp32), see _ProjectedCrossEntropy
_MIN_BLOCK = 1024          # block widths are multiples of this (rows of unaligned width multiply 10% slower)


class _ProjectedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of softmax(x W^T + b) against `targets`, with the gradient computed in the forward pass.

    The logits' gradient is softmax - one-hot, which the forward has in hand once it has the softmax: computing it
    there, in place, saves the log-softmax output, its backward pass and the zero-filled one-hot tensor that
    `F.cross_entropy` allocates (four [N, V] passes of memory traffic). On the CPU the vocabulary is also taken in
    blocks of about 2M logits: a [N, V] product with a short inner dimension (H) runs at 60% of the matmul rate
    of the blocks, and blocks under glibc's 32 MB mmap ceiling are reused between steps instead of being mapped
    and faulted in afresh. The head's forward and backward in a bert-mini step (N = 614, fp32): 332 -> 191 ms.
    Same numbers as F.linear + F.cross_entropy (the test suite checks loss and gradients); under autocast the
    projection and its backward run in the autocast dtype and the softmax in fp32, as they do there."""

    @staticmethod
    def forward(ctx, x, weight, bias, targets):  # type: ignore[override]
        n, vocab = x.shape[0], weight.shape[0]
        step = max(_MIN_BLOCK, _BLOCK_ELEMENTS // n // _MIN_BLOCK * _MIN_BLOCK) if x.device.type == "cpu" else vocab
        starts = range(0, vocab, step)
        rows = torch.arange(n, device=x.device)
        picked = torch.zeros(n, device=x.device)
        blocks, tops, args, where = [], [], [], []
        for lo in starts:
            logits = F.linear(x, weight[lo:lo + step], None if bias is None else bias[lo:lo + step])
            z = logits.float()  # fp32 softmax; a copy under autocast, the same buffer in fp32
            inside = (targets >= lo) & (targets < lo + z.shape[1])  # the rows whose target is in this block ...
            column = (targets - lo).clamp(0, z.shape[1] - 1)       # ... and its column there
            picked = torch.where(inside, z[rows, column], picked)
            top, arg = z.max(-1)
            blocks.append(z)
            tops.append(top)
            args.append(arg + lo)
            where.append((inside, column))
        top, first = torch.stack(tops, 1).max(-1)  # the first block holding the row's maximum, as argmax picks
        acc = (torch.stack(args, 1).gather(1, first[:, None]).squeeze(1) == targets).float().mean()
        top = top[:, None]
        total = sum(z.sub_(top).exp_().sum(-1, keepdim=True) for z in blocks)
        loss = (total.log() + top).squeeze(-1).sub(picked).mean()
        scale = 1.0 / (total * n)
        grads = []
        for z, (inside, column) in zip(blocks, where):
            z.mul_(scale)  # softmax / N ...
            z[rows, column] -= inside.float() / n  # ... minus one-hot / N
            grads.append(z.to(logits.dtype))  # the projection's dtype (bf16 under autocast)
        ctx.save_for_backward(x, weight, *grads)
        ctx.step, ctx.has_bias = step, bias is not None
        ctx.mark_non_differentiable(acc)
        return loss, acc

    @staticmethod
    def backward(ctx, grad_loss, _grad_acc):  # type: ignore[override]
        x, weight, *grads = ctx.saved_tensors
        dtype, step = grads[0].dtype, ctx.step
        need_x, need_w, need_b, _ = ctx.needs_input_grad
        grad_x = grad_w = grad_b = None
        if need_x:
            grad_x = sum(d @ weight[i * step:(i + 1) * step].to(dtype) for i, d in enumerate(grads))
            grad_x = (grad_x * grad_loss).to(x.dtype)
        if need_w:
            scaled_x = (x * grad_loss).to(dtype)  # the incoming scale on the small side of the product
            grad_w = torch.empty(weight.shape, dtype=dtype, device=weight.device)
            for i, d in enumerate(grads):
                torch.mm(d.t(), scaled_x, out=grad_w[i * step:(i + 1) * step])
            grad_w = grad_w.to(weight.dtype)
        if need_b and ctx.has_bias:
            grad_b = torch.cat([d.sum(0) for d in grads]).mul(grad_loss).to(weight.dtype)
        return grad_x, grad_w, grad_b, None


def vocab_loss(head: MaskedLMHead, hidden: torch.Tensor, positions: torch.Tensor,
               targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`masked_lm_loss(head(hidden, positions), targets)` without keeping the [N, V] logits around for backward:
    the MLM head's transform, then the tied vocabulary projection and the cross-entropy as one step
    (`_ProjectedCrossEntropy`) when a gradient is wanted."""
    x = head.transform(hidden[positions])
    if targets.numel() == 0 or not torch.is_grad_enabled():
        return masked_lm_loss(F.linear(x, head.decoder.weight, head.bias), targets)
    return _ProjectedCrossEntropy.apply(x, head.decoder.weight, head.bias, targets)


class SentenceRelationHead(nn.Linear):
    """Classifier on the pooled [CLS] output: NSP (0 = IsNext), SOP (0 = in order), or StructBERT's three-way
    sentence structure (0 = next, 1 = previous, 2 = other document)."""

    def __init__(self, cfg: ModelConfig, n_classes: int = 2):
        super().__init__(cfg.hidden_size, n_classes)
        nn.init.normal_(self.weight, 0.0, cfg.initializer_range)
        nn.init.zeros_(self.bias)


class ReplacedTokenHead(nn.Module):
    """ELECTRA's discriminator: one logit per token, > 0 meaning 'replaced'."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.act = activation(cfg.hidden_act)
        self.dense_prediction = nn.Linear(cfg.hidden_size, 1)
        for lin in (self.dense, self.dense_prediction):
            nn.init.normal_(lin.weight, 0.0, cfg.initializer_range)
            nn.init.zeros_(lin.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.dense_prediction(self.act(self.dense(hidden))).squeeze(-1)


class PreTrainingHeads(nn.Module):
    """HF's `cls` module: `cls.predictions` (MLM) and, for NSP/SOP, `cls.seq_relationship`."""

    def __init__(self, cfg: ModelConfig, word_embeddings: nn.Embedding, sentence_relation: bool):
        super().__init__()
        self.predictions = MaskedLMHead(cfg, word_embeddings)
        self.seq_relationship = SentenceRelationHead(cfg) if sentence_relation else None


class MaskedLM(nn.Module):
    """Encoder + MLM head: what fill-mask and MLM evaluation need (BertForMaskedLM layout)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if not cfg.family.masked_lm_pooler:  # *ForMaskedLM checkpoints carry no pooler (BigBird's do)
            cfg = cfg.replace(use_pooler=False)
        self.config = cfg
        self.bert = Encoder(cfg)
        self.cls = PreTrainingHeads(cfg, self.bert.embeddings.word_embeddings, sentence_relation=False)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, positions=None,
                global_attention_mask=None) -> torch.Tensor:
        hidden = self.bert(input_ids, attention_mask, token_type_ids,
                           global_attention_mask=global_attention_mask).last_hidden_state
        return self.cls.predictions(hidden, positions)

    @classmethod
    def from_pretrained(cls, path: "str | Path | ModelFolder", revision: str | None = None) -> "MaskedLM":
        folder = ModelFolder.open(path, revision=revision)
        cfg = folder.config_for(ENCODER, verb="a masked LM")
        if "mlm" not in cfg.family.head_classes:
            with_mlm = [name for name, fam in cfg.families().items() if "mlm" in fam.head_classes]
            raise BertforgeError(f"{folder.path}: a {cfg.family.hf_prefix} checkpoint (model_type {cfg.model_type}) "
                                 f"has no masked LM head, so it is not a masked LM"
                                 + (": it predicts a position from its query stream, never a [MASK] token"
                                    if cfg.family.streams == 2 else "")
                                 + f"; fill-mask needs a {', '.join(with_mlm)} MLM")
        model = cls(cfg)
        load_pretrained(model, folder.path, require=("cls.predictions.",))
        return model.eval()

    def save_pretrained(self, path: str | Path, tokenizer=None) -> None:
        save_pretrained(self, path, self.config, architecture=self.config.family.head_classes["mlm"],
                        tokenizer=tokenizer)


class PreTrainingModel(nn.Module):
    """Encoder + MLM head + optional NSP/SOP head (BertForPreTraining / AlbertForPreTraining layout).

    Returns raw logits; the objectives (losses, masking) live in `bertforge.pretraining`.
    """

    def __init__(self, cfg: ModelConfig, sentence_relation: bool = True):
        super().__init__()
        self.config = cfg
        self.bert = Encoder(cfg)
        self.cls = PreTrainingHeads(cfg, self.bert.embeddings.word_embeddings, sentence_relation)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, positions=None):
        out = self.bert(input_ids, attention_mask, token_type_ids)
        mlm = self.cls.predictions(out.last_hidden_state, positions)
        rel = (self.cls.seq_relationship(out.pooler_output)
               if self.cls.seq_relationship is not None and out.pooler_output is not None else None)
        return mlm, rel

    def save_pretrained(self, path: str | Path, tokenizer=None) -> None:
        heads = self.config.family.head_classes
        # a sentence-relation head is saved as the family's *ForPreTraining where transformers has one (BERT,
        # ALBERT); RoBERTa's and ELECTRA's have none: their masked LM class (which ignores the extra head)
        with_relation = self.cls.seq_relationship is not None and "pretraining" in heads
        save_pretrained(self, path, self.config, architecture=heads["pretraining" if with_relation else "mlm"],
                        tokenizer=tokenizer)


class ReplacedTokenDetector(nn.Module):
    """ELECTRA discriminator: encoder + per-token replaced/original logit (ElectraForPreTraining layout)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.bert = Encoder(cfg)
        self.discriminator_predictions = ReplacedTokenHead(cfg)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.Tensor:
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        return self.discriminator_predictions(hidden)

    def save_pretrained(self, path: str | Path, tokenizer=None) -> None:
        save_pretrained(self, path, self.config, architecture=self.config.family.head_classes["rtd"],
                        tokenizer=tokenizer)


class XLNetLM(nn.Module):
    """XLNet encoder + its LM head, a Linear tied to the word embeddings (XLNetLMHeadModel layout: `transformer.*`,
    `lm_loss.bias`). Logits at the query stream's targets when given perm_mask / target_mapping, else per token."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.bert = XLNetEncoder(cfg)
        self.lm_loss = nn.Linear(cfg.hidden_size, cfg.vocab_size)
        self.lm_loss.weight = self.bert.word_embedding.weight
        nn.init.zeros_(self.lm_loss.bias)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, perm_mask=None, target_mapping=None,
                mems=None) -> torch.Tensor:
        hidden = self.bert(input_ids, attention_mask, token_type_ids, perm_mask, target_mapping, mems)
        return self.lm_loss(hidden.last_hidden_state)

    @classmethod
    def from_pretrained(cls, path: "str | Path | ModelFolder", revision: str | None = None) -> "XLNetLM":
        folder = ModelFolder.open(path, revision=revision)
        model = cls(folder.config_for(ENCODER, verb="an XLNet language model"))
        load_pretrained(model, folder.path, require=("lm_loss.",))
        return model.eval()

    def save_pretrained(self, path: str | Path, tokenizer=None) -> None:
        save_pretrained(self, path, self.config, architecture=self.config.family.head_classes["lm"],
                        tokenizer=tokenizer)
