"""Held-out numbers of a left-to-right LM (--recipe gpt): next-token loss and perplexity, the same perplexity of a
unigram and a bigram model of the training shards on the very same targets, and sampled continuations.

The baselines are what a model must beat to have learned anything beyond word frequencies (unigram) and the
previous token (bigram). The unigram is add-one smoothed; the bigram is interpolated Kneser-Ney (Chen & Goodman
1998, discount 0.75), whose lower order is the add-one-smoothed continuation count, so no held-out pair is impossible.
Both count the token stream the training rows are cut from: <sep> doc <sep> doc <sep> ...
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from bertforge.generation import generate
from bertforge.pretraining.objectives import next_token_loss

DISCOUNT = 0.75


@torch.no_grad()
def lm_metrics(model: nn.Module, batches: list[dict], device: torch.device | None = None,
               precision: str = "fp32") -> dict[str, float]:
    """Next-token loss (per target token), perplexity and accuracy of `model.lm_logits` over `batches`."""
    was_training = model.training
    model.eval()
    device = device or next(model.parameters()).device
    loss_sum = acc_sum = 0.0
    total = 0
    for b in batches:
        ids, mask = b["input_ids"].to(device), b["attention_mask"].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model.lm_logits(ids, mask)
        loss, acc, n = next_token_loss(logits, ids, mask)
        loss_sum += float(loss) * n
        acc_sum += float(acc) * n
        total += n
    model.train(was_training)
    loss = loss_sum / max(total, 1)
    return {"lm_loss": loss, "lm_ppl": math.exp(min(loss, 50)), "lm_acc": acc_sum / max(total, 1),
            "targets": float(total)}


def _targets(batches: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(previous token, target) of every real next-token target in the batches, as `next_token_loss` counts them."""
    prev, nxt = [], []
    for b in batches:
        ids, mask = b["input_ids"].numpy(), b["attention_mask"].numpy().astype(bool)
        keep = mask[:, 1:]
        prev.append(ids[:, :-1][keep])
        nxt.append(ids[:, 1:][keep])
    return np.concatenate(prev).astype(np.int64), np.concatenate(nxt).astype(np.int64)


class NgramBaselines:
    """Unigram and bigram (interpolated Kneser-Ney) language models counted from a token stream."""

    def __init__(self, stream: np.ndarray, vocab_size: int):
        V = self.V = int(vocab_size)
        stream = np.asarray(stream, np.int64)
        self.unigram = np.bincount(stream, minlength=V).astype(np.float64)
        pairs, counts = np.unique(stream[:-1] * V + stream[1:], return_counts=True)
        self.pairs, self.pair_counts = pairs, counts.astype(np.float64)
        hist, nxt = pairs // V, pairs % V
        self.history = np.bincount(hist, weights=self.pair_counts, minlength=V)  # c(v .)
        self.followers = np.bincount(hist, minlength=V).astype(np.float64)       # N1+(v .)
        cont = np.bincount(nxt, minlength=V).astype(np.float64)                  # N1+(. w)
        self.continuation = (cont + 1) / (cont.sum() + V)

    @classmethod
    def from_corpus(cls, corpus) -> "NgramBaselines":
        """Counted over the documents of `corpus` (a ShardedCorpus view: the training split), joined by <sep>."""
        doc_ptr, starts, ends = corpus.sentence_spans()
        sep = np.array([corpus.sep_id], np.int64)
        parts = [sep]
        for d in range(len(doc_ptr) - 1):
            if doc_ptr[d + 1] > doc_ptr[d]:
                parts += [np.asarray(corpus.tokens(int(starts[doc_ptr[d]]), int(ends[doc_ptr[d + 1] - 1])),
                                     np.int64), sep]
        return cls(np.concatenate(parts), corpus.vocab_size)

    def unigram_logprob(self, nxt: np.ndarray) -> np.ndarray:
        return np.log((self.unigram[nxt] + 1) / (self.unigram.sum() + self.V))

    def bigram_logprob(self, prev: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        key = prev * self.V + nxt
        at = np.searchsorted(self.pairs, key).clip(max=len(self.pairs) - 1)
        c = np.where(self.pairs[at] == key, self.pair_counts[at], 0.0)
        h = self.history[prev]
        seen = h > 0
        hs = np.where(seen, h, 1.0)
        p = np.where(seen, np.maximum(c - DISCOUNT, 0) / hs + DISCOUNT * self.followers[prev] / hs
                     * self.continuation[nxt], self.continuation[nxt])
        return np.log(p)

    def perplexities(self, batches: list[dict]) -> dict[str, float]:
        """Unigram and bigram perplexity on the next-token targets of `batches`."""
        prev, nxt = _targets(batches)
        return {"unigram_ppl": float(np.exp(-self.unigram_logprob(nxt).mean())),
                "bigram_ppl": float(np.exp(-self.bigram_logprob(prev, nxt).mean()))}


def samples(model: nn.Module, tok, corpus, n: int, prompt_words: int = 8, max_new_tokens: int = 40,
            seed: int = 0) -> list[dict[str, str]]:
    """Continuations (nucleus sampling, a fixed seed) of the first `prompt_words` words of up to n held-out
    documents: what the model writes, next to the text it was given."""
    was_training = model.training
    model.eval()
    out = []
    for d in range(min(n, len(corpus))):
        prompt = " ".join(tok.decode(corpus.document(d)[0].tolist()).split()[:prompt_words])
        if not prompt:
            continue
        # the prompt is a document's start: <bos> first, as the model saw it in training
        room = model.max_prompt_tokens(1) - len(model.prompt_ids(tok, prompt, prepend_bos=True))
        if room < 1:
            continue
        out.append({"prompt": prompt, "continuation": generate(model, tok, prompt, seed=seed, prepend_bos=True,
                                                               max_new_tokens=min(max_new_tokens, room))})
    model.train(was_training)
    return out
