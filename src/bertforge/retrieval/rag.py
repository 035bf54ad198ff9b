"""Retrieval-augmented generation (Lewis et al. 2020): a generator reads each of the top k passages joined to the
question, and the answer's likelihood is marginalised over the passages, weighted by the retriever's scores.

  p(y | x) = sum_z p(z | x) prod_i p(y_i | x, z, y_<i)      RAG-Sequence: one passage for the whole answer
  p(y | x) = prod_i sum_z p(z | x) p(y_i | x, z, y_<i)      RAG-Token: a passage per token

p(z | x) is the softmax over the k retrieval scores (`doc_scores`, the inner products of the question vector with
the passages' vectors). The generator is bertforge's one encoder-decoder (`model.seq2seq.Seq2SeqLM`); the k
passages of a question are k rows of the generator's batch (`context_input_ids`: question i's passages are rows
i*k ... i*k+k-1), so nothing here knows which family generates.

The rules follow transformers' RagTokenForGeneration / RagSequenceForGeneration exactly (the tests compare loss and
logits on the same weights): the decoder reads the labels as they are (no shift right), the targets are the labels
shifted left with padding at the end, padding never scores, RAG-Sequence adds the passage's log-prior at the
second target position (the first is the generator's start token), and label smoothing spreads epsilon over the
vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.errors import BertforgeError

MARGINALISATIONS = ("token", "sequence")


def _per_passage(seq_logits: torch.Tensor, n_docs: int) -> torch.Tensor:
    """[B*k, T, V] logits -> [B, k, T, V] log-probabilities."""
    if seq_logits.shape[0] % n_docs:
        raise BertforgeError(f"the generator's batch ({seq_logits.shape[0]} rows) is not a multiple of the "
                             f"passages per question (n_docs = {n_docs})")
    logprobs = F.log_softmax(seq_logits.float(), dim=-1)
    return logprobs.view(seq_logits.shape[0] // n_docs, n_docs, *seq_logits.shape[1:])


def _check_scores(doc_scores: torch.Tensor, n_docs: int) -> None:
    if doc_scores.dim() != 2 or doc_scores.shape[1] != n_docs:
        raise BertforgeError(f"doc_scores must be [questions, n_docs] = [.., {n_docs}] (got {list(doc_scores.shape)})")


def marginalise_tokens(seq_logits: torch.Tensor, doc_scores: torch.Tensor, n_docs: int) -> torch.Tensor:
    """RAG-Token's next-token distribution: log sum_z p(z|x) p(y_i | x, z, y_<i), as [B, T, V] log-probabilities."""
    _check_scores(doc_scores, n_docs)
    logprobs = _per_passage(seq_logits, n_docs)
    prior = F.log_softmax(doc_scores.float(), dim=1)[:, :, None, None]
    return torch.logsumexp(logprobs + prior, dim=1)


def _targets(labels: torch.Tensor, pad_token_id: int) -> torch.Tensor:
    """The labels shifted left, padded at the end: what each decoder position predicts."""
    return torch.cat([labels[:, 1:], labels.new_full((labels.shape[0], 1), pad_token_id)], dim=1)


def _smoothed(nll: torch.Tensor, smooth: torch.Tensor, epsilon: float, vocab: int, reduce: bool) -> torch.Tensor:
    if reduce:
        nll, smooth = nll.sum(), smooth.sum()
    return (1.0 - epsilon) * nll + (epsilon / vocab) * smooth


def rag_token_nll(seq_logits: torch.Tensor, doc_scores: torch.Tensor, labels: torch.Tensor, *, n_docs: int,
                  pad_token_id: int, epsilon: float = 0.0, reduce: bool = False) -> torch.Tensor:
    """RAG-Token's negative log-likelihood per question ([B]; summed when `reduce`)."""
    target = _targets(labels, pad_token_id)
    logprobs = marginalise_tokens(seq_logits, doc_scores, n_docs)  # [B, T, V]
    pad = target.eq(pad_token_id)
    ll = logprobs.gather(-1, target[..., None]).squeeze(-1).masked_fill(pad, 0.0)
    smooth = logprobs.sum(-1).masked_fill(pad, 0.0)
    return _smoothed(-ll.sum(1), -smooth.sum(1), epsilon, logprobs.shape[-1], reduce)


def rag_sequence_nll(seq_logits: torch.Tensor, doc_scores: torch.Tensor, labels: torch.Tensor, *, n_docs: int,
                     pad_token_id: int, bos_token_id: int | None = None, epsilon: float = 0.0,
                     exclude_bos_score: bool = False, reduce: bool = False) -> torch.Tensor:
    """RAG-Sequence's negative log-likelihood per question ([B]; summed when `reduce`). `exclude_bos_score`: the
    first target is not scored when every answer starts with `bos_token_id` (how "thorough" decoding rescores)."""
    _check_scores(doc_scores, n_docs)
    target = _targets(labels, pad_token_id)
    logprobs = _per_passage(seq_logits, n_docs)  # [B, k, T, V]
    prior = F.log_softmax(doc_scores.float(), dim=1)[:, :, None, None]
    # the passage's prior joins at the second position: the first predicts what follows the start token
    logprobs = torch.cat([logprobs[:, :, :1], logprobs[:, :, 1:2] + prior, logprobs[:, :, 2:]], dim=2)
    tgt = target[:, None, :].expand(-1, n_docs, -1)
    pad = tgt.eq(pad_token_id)
    ll = logprobs.gather(-1, tgt[..., None]).squeeze(-1).masked_fill(pad, 0.0)  # [B, k, T]
    smooth = logprobs.sum(-1).masked_fill(pad, 0.0)
    use_bos = bos_token_id is not None and bool(target[:, 0].eq(bos_token_id).all())
    ll = ll[:, :, 1:].sum(2) if exclude_bos_score and use_bos else ll.sum(2)
    nll = -torch.logsumexp(ll, dim=1)
    smooth_nll = -torch.logsumexp(smooth.sum(2), dim=1)
    return _smoothed(nll, smooth_nll, epsilon, logprobs.shape[-1], reduce)


@dataclass
class RagOutput:
    loss: torch.Tensor | None  # per question ([B]), or summed (reduce)
    logits: torch.Tensor       # the generator's, one row per (question, passage): [B*k, T, V]
    doc_scores: torch.Tensor   # [B, k]

    def marginalised(self) -> torch.Tensor:
        """RAG-Token's next-token log-probabilities [B, T, V] (transformers' `do_marginalize=True` logits)."""
        return marginalise_tokens(self.logits, self.doc_scores, self.doc_scores.shape[1])


class RetrievalAugmentedGenerator(nn.Module):
    """A generator that reads k passages per question and marginalises over them. `marginalise` is "token" or
    "sequence"; `question_encoder` (optional here) turns questions into the vectors `doc_scores` come from."""

    def __init__(self, generator: nn.Module, *, n_docs: int = 5, marginalise: str = "token",
                 question_encoder: nn.Module | None = None, label_smoothing: float = 0.0):
        super().__init__()
        if marginalise not in MARGINALISATIONS:
            raise BertforgeError(f"marginalise: expected one of {', '.join(MARGINALISATIONS)} (got {marginalise!r})")
        if n_docs < 1:
            raise BertforgeError(f"n_docs must be >= 1 (got {n_docs})")
        self.generator, self.question_encoder = generator, question_encoder
        self.n_docs, self.marginalise, self.label_smoothing = n_docs, marginalise, label_smoothing

    def forward(self, context_input_ids: torch.Tensor, context_attention_mask: torch.Tensor,
                doc_scores: torch.Tensor, labels: torch.Tensor | None = None,
                decoder_input_ids: torch.Tensor | None = None, reduce: bool = False,
                exclude_bos_score: bool = False) -> RagOutput:
        if decoder_input_ids is None:
            if labels is None:
                raise BertforgeError("give labels (the answers' token ids) or decoder_input_ids")
            decoder_input_ids = labels  # as transformers: the decoder reads the labels, the targets shift left
        k = self.n_docs
        out = self.generator(context_input_ids, context_attention_mask,
                             decoder_input_ids=decoder_input_ids.repeat_interleave(k, dim=0))
        seq_logits = out["logits"]
        cfg = self.generator.config
        loss = None
        if labels is not None:
            if self.marginalise == "token":
                loss = rag_token_nll(seq_logits, doc_scores, labels, n_docs=k, pad_token_id=cfg.pad_token_id,
                                     epsilon=self.label_smoothing, reduce=reduce)
            else:
                loss = rag_sequence_nll(seq_logits, doc_scores, labels, n_docs=k, pad_token_id=cfg.pad_token_id,
                                        bos_token_id=cfg.bos_token_id, epsilon=self.label_smoothing,
                                        exclude_bos_score=exclude_bos_score, reduce=reduce)
        return RagOutput(loss, seq_logits, doc_scores)


# ---- decoding -------------------------------------------------------------------------------------------------
class _PassageCache:
    """The generator's cache over B*k rows, seen by the decoding loops as B rows: a reorder of question rows moves
    each question's k passage rows together, and their log-priors with them."""

    def __init__(self, inner, log_prior: torch.Tensor):
        self.inner, self.log_prior = inner, log_prior  # log_prior [B, k]

    @property
    def length(self) -> int:
        return self.inner.length

    def reorder(self, index: torch.Tensor) -> "_PassageCache":
        k = self.log_prior.shape[1]
        rows = (index[:, None] * k + torch.arange(k, device=index.device)).reshape(-1)
        self.inner = self.inner.reorder(rows)
        self.log_prior = self.log_prior[index]
        return self


class TokenMarginalDecoder:
    """RAG-Token as a model of the generation protocol (`generation.search`): each step runs the generator on every
    (question, passage) row and returns log sum_z p(z|x) p(y_i | x, z, y_<i) per question, so greedy, sampling and
    beam search decode RAG-Token unchanged. `doc_scores` [B, k] are fixed for the whole decoding."""

    def __init__(self, generator: nn.Module, doc_scores: torch.Tensor):
        self.generator, self.config = generator, generator.config
        self.log_prior = F.log_softmax(doc_scores.float(), dim=1)
        self.k = doc_scores.shape[1]

    def _marginal(self, logits: torch.Tensor, cache: _PassageCache) -> torch.Tensor:
        logprobs = F.log_softmax(logits.float(), -1).view(-1, self.k, logits.shape[-1])
        return torch.logsumexp(logprobs + cache.log_prior[:, :, None], dim=1)

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, max_new_tokens: int):
        logits, inner, start = self.generator.prefill(input_ids, attention_mask, max_new_tokens)
        cache = _PassageCache(inner, self.log_prior)
        return self._marginal(logits, cache), cache, start[::self.k]

    def step(self, tokens: torch.Tensor, cache: _PassageCache):
        logits, cache.inner = self.generator.step(tokens.repeat_interleave(self.k), cache.inner)
        return self._marginal(logits, cache), cache


def generate_token_marginal(generator: nn.Module, context_input_ids: torch.Tensor,
                            context_attention_mask: torch.Tensor, doc_scores: torch.Tensor, config=None,
                            **options) -> torch.Tensor:
    """RAG-Token decoding (greedy, sampled or beam search: `generation.GenerationConfig`): [B, 1 + generated]."""
    from bertforge.generation.search import generate_ids

    return generate_ids(TokenMarginalDecoder(generator, doc_scores), context_input_ids, context_attention_mask,
                        config, **options)


DECODINGS = ("thorough", "fast")


def generate_sequence_marginal(generator: nn.Module, context_input_ids: torch.Tensor,
                               context_attention_mask: torch.Tensor, doc_scores: torch.Tensor, *,
                               num_beams: int = 4, max_new_tokens: int = 20, decoding: str = "thorough",
                               deduplicate: bool = True) -> list[torch.Tensor]:
    """RAG-Sequence decoding: per question, beam search on each of its k passages gives up to k x num_beams
    candidate answers (duplicates removed); each is then scored by p(y|x) = sum_z p(z|x) p(y|x,z) and the best
    returned (one tensor of ids per question, starting with the decoder's start token).

    "thorough" computes p(y|x,z) for every candidate and every passage (k extra forward passes a candidate, as
    transformers' RagSequenceForGeneration.generate); "fast" counts a passage only where beam search found the
    candidate on it (p(y|x,z) ~ 0 elsewhere; Lewis et al. 2020, section 2.5), so no candidate reads a passage it
    did not come from. Beam search reads each passage with its attention mask (transformers' generate drops the
    mask there, so their candidates differ where contexts are padded; the rescoring agrees)."""
    from bertforge.generation.config import GenerationConfig
    from bertforge.generation.search import beam_hypotheses, generate_ids

    if decoding not in DECODINGS:
        raise BertforgeError(f"decoding: expected one of {', '.join(DECODINGS)} (got {decoding!r})")
    k = doc_scores.shape[1]
    _check_scores(doc_scores, k)
    cfg = generator.config
    pad = cfg.pad_token_id
    answers = []
    for q in range(doc_scores.shape[0]):
        rows = slice(q * k, (q + 1) * k)
        ids, mask = context_input_ids[rows], context_attention_mask[rows]
        if num_beams > 1:
            hyps = beam_hypotheses(generator, ids, mask, GenerationConfig(max_new_tokens=max_new_tokens,
                                                                          num_beams=num_beams))
        else:
            hyps = generate_ids(generator, ids, mask, max_new_tokens=max_new_tokens, greedy=True)[:, None]
        # candidates in order of appearance (passage by passage, best beam first), with the passages that found each
        found: dict[tuple[int, ...], set[int]] = {}
        order: list[tuple[int, ...]] = []  # every candidate, or each once when deduplicating
        for z in range(k):
            for h in hyps[z]:
                key = tuple(h.tolist())
                if key not in found or not deduplicate:
                    order.append(key)
                found.setdefault(key, set()).add(z)
        cands = torch.tensor(order, dtype=torch.long, device=ids.device)
        n = len(cands)
        with torch.no_grad():
            out = generator(ids.repeat(n, 1), mask.repeat(n, 1), decoder_input_ids=cands.repeat_interleave(k, 0))
            logits = out["logits"]
            if decoding == "thorough":
                nll = rag_sequence_nll(logits, doc_scores[q:q + 1].repeat(n, 1), cands, n_docs=k, pad_token_id=pad,
                                       bos_token_id=cfg.bos_token_id, exclude_bos_score=True)
            else:
                nll = _fast_nll(logits, doc_scores[q], cands, [found[tuple(c.tolist())] for c in cands], k, pad,
                                cfg.bos_token_id)
        best = int(torch.argmin(nll))  # the first of equals, as topk's order
        answers.append(cands[best])
    return answers


def _fast_nll(logits: torch.Tensor, scores: torch.Tensor, cands: torch.Tensor, sources: list[set[int]], k: int,
              pad: int, bos: int | None) -> torch.Tensor:
    """RAG-Sequence's nll with p(y|x,z) = 0 for the passages z whose beams did not produce y."""
    n = len(cands)
    excluded = torch.ones(n, k, dtype=torch.bool, device=cands.device)
    for i, zs in enumerate(sources):
        excluded[i, sorted(zs)] = False
    target = _targets(cands, pad)
    logprobs = F.log_softmax(logits.float(), -1).view(n, k, *logits.shape[1:])
    tgt = target[:, None, :].expand(-1, k, -1)
    ll = logprobs.gather(-1, tgt[..., None]).squeeze(-1).masked_fill(tgt.eq(pad), 0.0)
    use_bos = bos is not None and bool(target[:, 0].eq(bos).all())
    ll = ll[:, :, 1:].sum(2) if use_bos else ll.sum(2)
    ll = ll + F.log_softmax(scores.float(), 0)[None, :]
    return -torch.logsumexp(ll.masked_fill(excluded, float("-inf")), dim=1)
