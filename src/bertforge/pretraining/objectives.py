"""Pretraining objectives: models whose `forward(**batch)` returns {"loss", scalar metrics}.

Each objective subclasses (or holds) a `bertforge.model.heads` wrapper, so its parameters keep the canonical BERT names
(`bert.*`, `cls.*`) and `save_pretrained` writes a directory Hugging Face loads with no missing keys:

  MLMObjective(cfg, relation=None|"nsp"|"sop")  MLM (+ NSP / SOP)      -> BertForPreTraining / AlbertForPreTraining
  SpanBERTObjective(cfg)                         span MLM + SBO         -> BertForPreTraining (+ `sbo.*`, ignored by HF)
  ELECTRAObjective(cfg, embedding_sharing)       generator MLM + RTD    -> discriminator/ + generator/
  StructBERTObjective(cfg, word, sentence)       MLM + WSO and/or SSO   -> BertForMaskedLM (+ `sentence_structure.*`)
  PermutationLMObjective(cfg)                    XLNet's permutation LM -> XLNetLMHeadModel
  CausalLMObjective(cfg)                         next-token (GPT)       -> GPT2LMHeadModel
  LeftToRightObjective(cfg)                      next-token, BERT's LTR -> BertLMHeadModel (is_decoder=True)

`next_token_loss` is the causal LM's loss on its own, for any model with per-position vocabulary logits.

A batch is what `bertforge.data` collates: input_ids, token_type_ids, attention_mask, mlm_labels (-100 where not
masked; XLNet: the targets), optionally sentence_label (NSP/SOP/SSO), sbo_left / sbo_right / sbo_pos (span
boundaries), wso_labels (shuffled trigrams) and perm_rank (factorisation orders); the causal LM takes input_ids and
attention_mask only (`data.LMCollator`).
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.config import ModelConfig
from bertforge.families import RTD_HOST, RTD_OBJECTIVE
from bertforge.families.family import NARROW_GENERATOR, SLIDING_WINDOW
from bertforge.model.heads import (MaskedLM, PreTrainingModel, ReplacedTokenDetector, SentenceRelationHead, XLNetLM,
                                   masked_lm_loss, vocab_loss)
from bertforge.model import DecoderLM, activation, permutation_mask, target_mapping_of
from bertforge.model.sparse.layout import task_global_mask
from bertforge.pretraining.recipes import EMBEDDING_SHARING, OBJECTIVES, SENTENCE_OBJECTIVES

IGNORE = -100
PLM = "plm"  # XLNet's permutation language modelling
RELATIONS = (None, "nsp", "sop")


def _relation_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    loss = F.cross_entropy(logits.float(), labels)
    return loss, (logits.argmax(-1) == labels).float().mean().detach()


class MLMObjective(PreTrainingModel):
    """Masked LM, optionally with next-sentence prediction (BERT) or sentence-order prediction (ALBERT).

    Vocabulary logits are computed only at masked positions (the MLM head's `positions` mask): with a 30k
    vocabulary that projection is the largest matmul of a small model, and only ~15% of positions need it.
    """

    def __init__(self, cfg: ModelConfig, relation: str | None = None):
        if relation not in RELATIONS:
            raise ValueError(f"relation must be one of {RELATIONS}, got {relation!r}")
        super().__init__(cfg, sentence_relation=relation is not None)
        self.relation = relation

    def encode(self, input_ids, attention_mask=None, token_type_ids=None):
        # Longformer: [CLS] attends globally (as the fine-tuning models set it), so it sees the whole document
        glob = (task_global_mask(input_ids, "mlm", 0) if self.config.family.sparse_attention == SLIDING_WINDOW
                else None)
        return self.bert(input_ids, attention_mask, token_type_ids, global_attention_mask=glob)

    def forward(self, input_ids: torch.Tensor, mlm_labels: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, sentence_label: torch.Tensor | None = None,
                **_: Any) -> dict[str, torch.Tensor]:
        out = self.encode(input_ids, attention_mask, token_type_ids)
        positions = mlm_labels.ne(IGNORE)
        loss, acc = vocab_loss(self.cls.predictions, out.last_hidden_state, positions, mlm_labels[positions])
        result = {"mlm_loss": loss.detach(), "mlm_acc": acc}
        if self.relation is not None:
            if sentence_label is None:
                raise ValueError(f"the {self.relation.upper()} objective needs `sentence_label` in the batch")
            rel_loss, rel_acc = _relation_loss(self.cls.seq_relationship(out.pooler_output), sentence_label)
            loss = loss + rel_loss
            result.update({f"{self.relation}_loss": rel_loss.detach(), f"{self.relation}_acc": rel_acc})
        result["loss"] = loss
        return result

    @torch.no_grad()
    def predict_masked(self, input_ids, attention_mask=None, token_type_ids=None, positions=None) -> torch.Tensor:
        """Vocabulary logits at `positions` (fill-mask / evaluation)."""
        hidden = self.encode(input_ids, attention_mask, token_type_ids).last_hidden_state
        return self.cls.predictions(hidden, positions)

class SpanBoundaryHead(nn.Module):
    """SpanBERT's span-boundary objective: predict each span token from the two tokens just outside the span
    and its position inside the span: y = LN(GELU(W2 LN(GELU(W1 [x_left; x_right; p_rel])))), then the tied
    vocabulary projection. Saved as `sbo.*`; transformers ignores these tensors."""

    def __init__(self, cfg: ModelConfig, max_span_length: int = 32):
        super().__init__()
        h, e = cfg.hidden_size, cfg.embedding_size
        self.position_embeddings = nn.Embedding(max_span_length, h)
        self.dense1 = nn.Linear(3 * h, h)
        self.LayerNorm1 = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.dense2 = nn.Linear(h, e)
        self.LayerNorm2 = nn.LayerNorm(e, eps=cfg.layer_norm_eps)
        self.act = activation(cfg.hidden_act)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        for m in (self.position_embeddings, self.dense1, self.dense2):
            nn.init.normal_(m.weight, 0.0, cfg.initializer_range)
        nn.init.zeros_(self.dense1.bias)
        nn.init.zeros_(self.dense2.bias)

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, left: torch.Tensor, right: torch.Tensor,
                rel: torch.Tensor, decoder_weight: torch.Tensor) -> torch.Tensor:
        """Logits [N, V] for the N True entries of `positions` [B, T]; left/right/rel are [B, T] index tensors."""
        rows = torch.arange(hidden.shape[0], device=hidden.device)[:, None].expand_as(positions)[positions]
        x_left = hidden[rows, left[positions]]
        x_right = hidden[rows, right[positions]]
        p = self.position_embeddings(rel[positions].clamp(0, self.position_embeddings.num_embeddings - 1))
        y = self.LayerNorm1(self.act(self.dense1(torch.cat([x_left, x_right, p], dim=-1))))
        y = self.LayerNorm2(self.act(self.dense2(y)))
        return F.linear(y, decoder_weight, self.bias)


class SpanBERTObjective(MLMObjective):
    """Span masking + MLM + span-boundary objective (no NSP), as in SpanBERT (Joshi et al. 2020)."""

    def __init__(self, cfg: ModelConfig, max_span_length: int = 32):
        super().__init__(cfg, relation=None)
        self.sbo = SpanBoundaryHead(cfg, max_span_length)

    def forward(self, input_ids, mlm_labels, attention_mask=None, token_type_ids=None, sbo_left=None,
                sbo_right=None, sbo_pos=None, **_: Any) -> dict[str, torch.Tensor]:
        if sbo_left is None or sbo_right is None or sbo_pos is None:
            raise ValueError("the SBO objective needs sbo_left / sbo_right / sbo_pos (use span masking)")
        hidden = self.encode(input_ids, attention_mask, token_type_ids).last_hidden_state
        positions = mlm_labels.ne(IGNORE)
        targets = mlm_labels[positions]
        mlm, mlm_acc = vocab_loss(self.cls.predictions, hidden, positions, targets)
        # Masked tokens without a recorded boundary (left < 0) are left out of the SBO term.
        sbo_positions = positions & sbo_left.ge(0) & sbo_right.ge(0)
        sbo_logits = self.sbo(hidden, sbo_positions, sbo_left, sbo_right, sbo_pos,
                              self.cls.predictions.decoder.weight)
        sbo, sbo_acc = masked_lm_loss(sbo_logits, mlm_labels[sbo_positions])
        return {"loss": mlm + sbo, "mlm_loss": mlm.detach(), "mlm_acc": mlm_acc, "sbo_loss": sbo.detach(),
                "sbo_acc": sbo_acc}


def generator_config(disc: ModelConfig, divisor: int = 4) -> ModelConfig:
    """The generator of replaced-token detection, in the discriminator's family, as its `rtd_generator` says:
    NARROW (ELECTRA's): hidden, intermediate and heads divided by `divisor`, same embedding size (so the embeddings
    can be shared; an `embeddings_project` maps E to the smaller hidden size); SHALLOW (DeBERTa-v3's, a family that
    cannot factorise its embeddings): the same width and half the depth (He et al. 2023)."""
    if disc.family.rtd_generator != NARROW_GENERATOR:
        return disc.replace(num_hidden_layers=max(1, disc.num_hidden_layers // 2), use_pooler=False, extra={})
    hidden = max(disc.hidden_size // divisor, 16)
    heads = max(disc.num_attention_heads // divisor, 1)
    while hidden % heads:
        heads -= 1
    return disc.replace(hidden_size=hidden, num_attention_heads=heads,
                        intermediate_size=max(disc.intermediate_size // divisor, hidden),
                        embedding_size=disc.embedding_size, use_pooler=False, extra={})


GDES_DELTA = "gdes_delta.safetensors"  # the discriminator's own embedding tables (E_delta), for an exact resume


def rtd_config(cfg: ModelConfig) -> ModelConfig:
    """`cfg` in a family whose checkpoints hold a replaced-token detector: its own (ELECTRA's, DeBERTa's), or else
    the family that holds other families' (`families.RTD_HOST`: ELECTRA's layout, which names the generator's
    tensors `generator_*`), without a pooler."""
    if "rtd" in cfg.family.head_classes:
        return cfg
    return cfg.replace(model_type=RTD_HOST.model_type, use_pooler=False)


class GradientDisentangledEmbedding(nn.Module):
    """A table of the discriminator read as E_D = sg(E_G) + E_delta (He et al. 2023, gradient-disentangled embedding
    sharing): the generator's table without its gradient, plus a table of the discriminator's own that starts at
    zero. The RTD loss trains E_delta only; E_G learns from the generator's MLM loss alone, so the two losses no
    longer pull one table two ways. `source` is the generator's module, held outside this module's parameters."""

    def __init__(self, source: nn.Embedding):
        super().__init__()
        self._source = (source,)
        self.delta = nn.Parameter(torch.zeros_like(source.weight))
        self.padding_idx = source.padding_idx

    @property
    def weight(self) -> torch.Tensor:
        return self._source[0].weight.detach() + self.delta

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight, self.padding_idx)


class ELECTRAObjective(nn.Module):
    """Replaced-token detection (Clark et al. 2020; He et al. 2023 for DeBERTa-v3).

    The generator (a small MaskedLM: `generator_config`) is trained with MLM. Replacements are sampled from its
    softmax without gradient; the discriminator labels every non-pad token replaced (1) or original (0); a sample
    equal to the original token counts as original. loss = mlm + rtd_weight * BCE.
    `embedding_sharing` says what the two share: "shared", the whole embedding module (word, position and
    token-type tables are the same Parameter objects: ELECTRA's); "none", nothing; "gdes", the tables as
    sg(generator's) + a zero-initialised table of the discriminator's own (`GradientDisentangledEmbedding`,
    DeBERTa-v3's), the embedding LayerNorm shared as in "shared", so that the two differ only in where the
    tables' gradients go. A checkpoint's discriminator holds E_G + E_delta: a plain model of its family.
    A family with a replaced-token detection layout of its own (ELECTRA's, DeBERTa's) trains as itself; the others
    in ELECTRA's layout (`rtd_config`).
    """

    def __init__(self, cfg: ModelConfig, generator_divisor: int = 4, rtd_weight: float = 50.0,
                 embedding_sharing: str = "shared"):
        super().__init__()
        if embedding_sharing not in EMBEDDING_SHARING:
            raise ValueError(f"embedding_sharing must be one of {EMBEDDING_SHARING}, got {embedding_sharing!r}")
        self.config = rtd_config(cfg)
        self.rtd_weight, self.embedding_sharing = rtd_weight, embedding_sharing
        self.discriminator = ReplacedTokenDetector(self.config)
        self.generator = MaskedLM(generator_config(self.config, generator_divisor))
        disc, gen = self.discriminator.bert.embeddings, self.generator.bert.embeddings
        if embedding_sharing == "shared":
            # Share the whole embedding module; the generator's tied decoder then points at the shared word table.
            self.generator.bert.embeddings = disc
            self.generator.cls.predictions.decoder.weight = disc.word_embeddings.weight
        elif embedding_sharing == "gdes":
            for table in self._tables(gen):
                setattr(disc, table, GradientDisentangledEmbedding(getattr(gen, table)))
            disc.LayerNorm = gen.LayerNorm

    @staticmethod
    def _tables(embeddings: nn.Module) -> list[str]:
        return [name for name in ("word_embeddings", "position_embeddings", "token_type_embeddings")
                if isinstance(getattr(embeddings, name, None), nn.Embedding)]

    @contextmanager
    def plain_discriminator(self, loading: bool = False):
        """The discriminator with plain tables holding E_G + E_delta while inside (gdes; else as it is): what is
        saved, and what a checkpoint loads into. `loading`: on leaving, E_delta = the loaded table - E_G; otherwise
        E_delta is left exactly as it was."""
        disc = self.discriminator.bert.embeddings
        gdes = {name: m for name, m in disc.named_children() if isinstance(m, GradientDisentangledEmbedding)}
        for name, m in gdes.items():
            # built from E_G + E_delta, not initialised: a save that drew random numbers would leave the run's
            # generator elsewhere than the checkpoint's saved RNG state, and a resumed run would sample other tokens
            plain = nn.Embedding(*m.delta.shape, padding_idx=m.padding_idx, _weight=m.weight.detach().clone())
            setattr(disc, name, plain)
        try:
            yield self.discriminator
        finally:
            for name, m in gdes.items():
                if loading:
                    with torch.no_grad():
                        m.delta.copy_(getattr(disc, name).weight - m._source[0].weight)
                setattr(disc, name, m)

    def forward(self, input_ids, mlm_labels, attention_mask=None, token_type_ids=None, **_: Any):
        positions = mlm_labels.ne(IGNORE)
        targets = mlm_labels[positions]
        gen_logits = self.generator(input_ids, attention_mask, token_type_ids, positions=positions)
        mlm, mlm_acc = masked_lm_loss(gen_logits, targets)
        with torch.no_grad():  # sampling is not differentiable; the discriminator's loss does not reach the generator
            sampled = torch.multinomial(gen_logits.float().softmax(-1), 1).squeeze(-1) if targets.numel() else targets
            original = torch.where(positions, mlm_labels, input_ids)
            corrupted = original.clone()
            corrupted[positions] = sampled
            labels = corrupted.ne(original).float()
        disc_logits = self.discriminator(corrupted, attention_mask, token_type_ids)
        real = attention_mask.bool() if attention_mask is not None else torch.ones_like(labels, dtype=torch.bool)
        rtd = F.binary_cross_entropy_with_logits(disc_logits[real].float(), labels[real])
        pred = disc_logits[real].gt(0).float()
        return {"loss": mlm + self.rtd_weight * rtd, "mlm_loss": mlm.detach(), "mlm_acc": mlm_acc,
                "rtd_loss": rtd.detach(), "rtd_acc": pred.eq(labels[real]).float().mean(),
                "replaced_frac": labels[real].mean()}

    @torch.no_grad()
    def predict_masked(self, input_ids, attention_mask=None, token_type_ids=None, positions=None) -> torch.Tensor:
        """The generator's vocabulary logits at `positions` (ELECTRA's fill-mask model)."""
        return self.generator(input_ids, attention_mask, token_type_ids, positions=positions)

    def save_pretrained(self, path: str | Path, tokenizer=None) -> None:
        """discriminator/ (the family's "rtd" class: ElectraForPreTraining; DebertaV2Model, which leaves the RTD head
        aside), generator/ (its masked LM class), and the discriminator at the top level, so `from_pretrained(path)`
        gives the model one fine-tunes; with gdes also E_delta itself (GDES_DELTA), so that a resumed run continues
        exactly."""
        path = Path(path)
        delta = {f"{name}.delta": m.delta.detach().cpu().contiguous()
                 for name, m in self.discriminator.bert.embeddings.named_children()
                 if isinstance(m, GradientDisentangledEmbedding)}
        with self.plain_discriminator() as disc:
            disc.save_pretrained(path / "discriminator", tokenizer=tokenizer)
            self.generator.save_pretrained(path / "generator", tokenizer=tokenizer)
            disc.save_pretrained(path, tokenizer=tokenizer)
        if delta:
            from bertforge.model.checkpoint import write_tensors
            write_tensors(path / GDES_DELTA, delta)

    def load_pretrained(self, path: str | Path) -> None:
        """Read what `save_pretrained` wrote (a discriminator alone, e.g. a fine-tunable checkpoint, also does: its
        generator then starts afresh)."""
        from bertforge.model.checkpoint import load_pretrained, read_tensors

        path = Path(path)
        if (path / "generator").is_dir():
            load_pretrained(self.generator, path / "generator")
        with self.plain_discriminator(loading=True) as disc:
            load_pretrained(disc, path / "discriminator" if (path / "discriminator").is_dir() else path)
        if (path / GDES_DELTA).is_file():  # exactly, rather than the table minus E_G
            with torch.no_grad():
                for name, tensor in read_tensors(path / GDES_DELTA).items():
                    getattr(self.discriminator.bert.embeddings, name.removesuffix(".delta")).delta.copy_(tensor)


class StructBERTObjective(MLMObjective):
    """StructBERT (Wang et al. 2020): MLM plus the word-structural objective (WSO: put shuffled trigrams back, i.e.
    predict the original token at each shuffled position through the same tied output layer) and/or the
    sentence-structural one (SSO: B is A's next segment, its previous one, or another document's; three-way on the
    pooled [CLS]). loss = mlm + wso + sso. Saved as BertForMaskedLM, plus `sentence_structure.*` and the pooler,
    which transformers ignores and bertforge reloads."""

    def __init__(self, cfg: ModelConfig, word: bool = True, sentence: bool = True):
        super().__init__(cfg, relation=None)
        self.word = word
        self.sentence_structure = SentenceRelationHead(cfg, 3) if sentence else None

    def forward(self, input_ids, mlm_labels, attention_mask=None, token_type_ids=None, sentence_label=None,
                wso_labels=None, **_: Any) -> dict[str, torch.Tensor]:
        out = self.encode(input_ids, attention_mask, token_type_ids)
        masked = mlm_labels.ne(IGNORE)
        shuffled = torch.zeros_like(masked)
        if self.word:
            if wso_labels is None:
                raise ValueError("the word-structural objective needs `wso_labels` in the batch (data.WordShuffle)")
            shuffled = wso_labels.ne(IGNORE)  # disjoint from `masked`: only unmasked tokens are shuffled
        # One vocabulary projection for both sets of positions; rows come in row-major position order.
        logits = self.cls.predictions(out.last_hidden_state, masked | shuffled)
        is_masked = masked[masked | shuffled]
        loss, acc = masked_lm_loss(logits[is_masked], mlm_labels[masked])
        result = {"mlm_loss": loss.detach(), "mlm_acc": acc}
        if self.word:
            wso, wso_acc = masked_lm_loss(logits[~is_masked], wso_labels[shuffled])
            loss = loss + wso
            result.update(wso_loss=wso.detach(), wso_acc=wso_acc)
        if self.sentence_structure is not None:
            if sentence_label is None:
                raise ValueError("the sentence-structural objective needs `sentence_label` in the batch")
            sso, sso_acc = _relation_loss(self.sentence_structure(out.pooler_output), sentence_label)
            loss = loss + sso
            result.update(sso_loss=sso.detach(), sso_acc=sso_acc)
        result["loss"] = loss
        return result


class PermutationLMObjective(XLNetLM):
    """XLNet's permutation language modelling (Yang et al. 2019). Each sequence comes with a factorisation order
    whose last 1/K are the targets (`perm_rank`, `bertforge.data.PermutationSampler`); the query stream predicts
    each target from the context and the targets before it, never from its own token. Cross-entropy over the
    targets; vocabulary logits only there."""

    def forward(self, input_ids, mlm_labels, perm_rank, attention_mask=None, token_type_ids=None,
                **_: Any) -> dict[str, torch.Tensor]:
        targets = mlm_labels.ne(IGNORE)
        mapping, valid = target_mapping_of(targets)
        hidden = self.bert(input_ids, attention_mask, token_type_ids, permutation_mask(perm_rank),
                           mapping).last_hidden_state  # [B, P, H]: the query stream at each target
        loss, acc = masked_lm_loss(self.lm_loss(hidden[valid]), mlm_labels[targets])
        return {"loss": loss, "plm_loss": loss.detach(), "plm_acc": acc}

    @torch.no_grad()
    def predict_masked(self, input_ids, attention_mask=None, token_type_ids=None, positions=None) -> torch.Tensor:
        """Logits [N, V] at `positions`, each predicted from every other position and none of `positions` (all
        targets share one place in the order): BERT's MLM task, with no use of the tokens there."""
        rank = torch.where(positions, 0, -1)
        mapping, valid = target_mapping_of(positions)
        hidden = self.bert(input_ids, attention_mask, token_type_ids, permutation_mask(rank), mapping)
        return self.lm_loss(hidden.last_hidden_state[valid])


def next_token_targets(input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """[B, T]: the token each position predicts left to right (t + 1), IGNORE after the last real token."""
    # The targets move left, not the logits: no copy of the [B, T, V] tensor (the last position has no target).
    targets = F.pad(input_ids[:, 1:], (0, 1), value=IGNORE)
    if attention_mask is not None:
        targets = targets.masked_fill(F.pad(attention_mask[:, 1:], (0, 1)) == 0, IGNORE)
    return targets


def next_token_loss(logits: torch.Tensor, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The left-to-right LM loss: position t predicts token t + 1. logits [B, T, V] (position t may only have seen
    tokens <= t); targets are the real (unpadded) tokens from the second on. Returns (mean cross-entropy,
    accuracy, number of targets)."""
    targets = next_token_targets(input_ids, attention_mask).flatten()
    keep = targets.ne(IGNORE)
    n = int(keep.sum())
    if n == 0:  # (as masked_lm_loss: the batch still takes part in backward)
        zero = logits.sum() * 0.0
        return zero, zero.detach(), 0
    logits = logits.flatten(0, 1).float()  # the softmax in fp32 under autocast
    loss = F.cross_entropy(logits, targets, ignore_index=IGNORE)
    acc = (logits.detach().argmax(-1).eq(targets) & keep).sum() / n
    return loss, acc, n


class CausalLMObjective(DecoderLM):
    """GPT's objective (Radford et al. 2018, 2019): next-token cross-entropy at every position of packed rows."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **_: Any) -> dict[str, torch.Tensor]:
        logits = self.lm_logits(input_ids, attention_mask)
        loss, acc, _n = next_token_loss(logits, input_ids, attention_mask)
        return {"loss": loss, "lm_loss": loss.detach(), "lm_acc": acc}


class LeftToRightObjective(MaskedLM):
    """The BERT paper's "LTR & No NSP" arm (Devlin et al. 2019, sec. 5.1): the same encoder with left-only attention
    (`config.causal`), its MLM head predicting each next token; the left-only constraint stays for fine-tuning, as
    in the paper. Saved as transformers' BertLMHeadModel (is_decoder=True): the same layout and the same logits."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg.replace(causal=True))

    def lm_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """[B, T, V]: position t's prediction of token t + 1."""
        return self.cls.predictions(self.bert(input_ids, attention_mask).last_hidden_state)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **_: Any) -> dict[str, torch.Tensor]:
        hidden = self.bert(input_ids, attention_mask).last_hidden_state
        targets = next_token_targets(input_ids, attention_mask)
        positions = targets.ne(IGNORE)  # vocabulary logits only where there is a target
        loss, acc = vocab_loss(self.cls.predictions, hidden, positions, targets[positions])
        return {"loss": loss, "lm_loss": loss.detach(), "lm_acc": acc}

    def save_pretrained(self, path: str | Path, tokenizer=None) -> None:
        from bertforge.model.checkpoint import save_pretrained
        save_pretrained(self, path, self.config, architecture=self.config.family.head_classes["ltr"],
                        tokenizer=tokenizer)


def uses_pooler(name: str) -> bool:
    """Only the sentence-pair objectives train the [CLS] pooler."""
    return name in SENTENCE_OBJECTIVES


def build_objective(name: str, cfg: ModelConfig, keep_pooler: bool = False,
                    embedding_sharing: str = "shared") -> nn.Module:
    """The objective module named `name` (one of OBJECTIVES) for encoder config `cfg` (`embedding_sharing`: what
    replaced-token detection's generator and discriminator share, `EMBEDDING_SHARING`).

    Objectives without a sentence task drop the pooler (as BertForMaskedLM does): an untrained layer in the
    checkpoint helps nobody, and DDP rejects parameters that get no gradient. `keep_pooler` keeps a pooler the
    config has (continuing a checkpoint that was trained with one).
    """
    if not uses_pooler(name) and not keep_pooler and cfg.use_pooler:
        cfg = cfg.replace(use_pooler=False)
    if name == "mlm":
        return MLMObjective(cfg)
    if name == "mlm+nsp":
        return MLMObjective(cfg, "nsp")
    if name == "mlm+sop":
        return MLMObjective(cfg, "sop")
    if name == "span+sbo":
        return SpanBERTObjective(cfg)
    if name == RTD_OBJECTIVE:
        return ELECTRAObjective(cfg, embedding_sharing=embedding_sharing)
    if name in ("mlm+wso", "mlm+sso", "structbert"):
        return StructBERTObjective(cfg, word=name != "mlm+sso", sentence=name != "mlm+wso")
    if name == PLM:
        return PermutationLMObjective(cfg)
    if name == "clm":
        return CausalLMObjective(cfg)
    if name == "ltr":
        return LeftToRightObjective(cfg)
    raise ValueError(f"unknown objective {name!r} (choose from {', '.join(OBJECTIVES)})")
