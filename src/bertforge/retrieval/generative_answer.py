"""Answering by generation (`bertforge ask --generator`): RAG (retrieve with the question tower, decode RAG-Token by
greedy or beam search, RAG-Sequence by "thorough" or "fast" decoding) or Fusion-in-Decoder (the top k passages
encoded one by one, decoded together). Each answer comes as the reader's do: {question, answer, score, passages,
answers}; `score` is the answer's probability under the model that produced it (RAG: p(y|x) marginalised over the k
passages as the model's marginalisation defines it; FiD: p(y | x, the k passages)), and each passage carries its
retrieval score (RAG: q . p, and `weight`, its p(z|x)).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.retrieval.rag import RetrievalAugmentedGenerator, generate_sequence_marginal, generate_token_marginal
from bertforge.retrieval.rag_train import pad_rows, rag_context, source_ids


def _clean(ids: list[int], cfg) -> list[int]:
    """Generated ids without the start token and anything after end-of-sequence."""
    out = []
    for t in ids[1:]:
        if t == cfg.eos_token_id:
            break
        out.append(t)
    return out


def _as_labels(seqs: Sequence[torch.Tensor], cfg) -> torch.Tensor:
    """Decoded sequences (start token first) as RAG labels: each ended by eos, padded."""
    rows = [list(s.tolist()) for s in seqs]
    rows = [r[:1] + _clean(r, cfg) + [cfg.eos_token_id] for r in rows]
    return pad_rows(rows, cfg.pad_token_id)[0]


@torch.no_grad()
def rag_answers(tower: nn.Module, generator: nn.Module, tokenizer: Any, vectors: Any, passages: Any,
                questions: list[str], *, k: int, marginalise: str, decoding: str = "thorough", num_beams: int = 4,
                max_new_tokens: int = 20, max_source_len: int = 300) -> list[dict[str, Any]]:
    """RAG's answers to `questions` from the top k passages of `vectors` (`rag_train.PassageVectors`; `passages`
    has ids / titles / texts by row)."""
    device = next(generator.parameters()).device
    features = {key: v.to(device) for key, v in tower.tokenize(questions).items()}
    q = tower.embed_features(features)
    rows = vectors.search(q.float().cpu().numpy(), k)
    p = torch.from_numpy(vectors.vectors(rows)).to(q.device)
    doc_scores = torch.einsum("bd,bkd->bk", q.float(), p)
    ids = [source_ids(generator, tokenizer, rag_context(passages.titles[r], passages.texts[r], qq), max_source_len)
           for qq, row in zip(questions, rows.tolist()) for r in row]
    ctx, mask = (t.to(device) for t in pad_rows(ids, generator.config.pad_token_id))
    cfg = generator.config
    if marginalise == "token":
        out = generate_token_marginal(generator, ctx, mask, doc_scores, max_new_tokens=max_new_tokens,
                                      greedy=num_beams == 1, num_beams=num_beams)
        seqs = list(out)
    else:
        seqs = generate_sequence_marginal(generator, ctx, mask, doc_scores, num_beams=num_beams,
                                          max_new_tokens=max_new_tokens, decoding=decoding)
    labels = _as_labels(seqs, cfg).to(device)
    nll = RetrievalAugmentedGenerator(generator, n_docs=k, marginalise=marginalise)(
        ctx, mask, doc_scores, labels=labels, exclude_bos_score=marginalise == "sequence").loss
    prior = F.softmax(doc_scores, dim=1)
    results = []
    for i, question in enumerate(questions):
        used = [{"id": passages.ids[r], "title": passages.titles[r], "text": passages.texts[r],
                 "retrieval_score": round(float(doc_scores[i, j]), 6), "weight": round(float(prior[i, j]), 6)}
                for j, r in enumerate(rows[i].tolist())]
        results.append({"question": question, "answer": tokenizer.decode(_clean(seqs[i].tolist(), cfg)).strip(),
                        "score": round(float(torch.exp(-nll[i])), 6), "passages": used, "answers": []})
    return results


@torch.no_grad()
def fid_answers(generator: nn.Module, tokenizer: Any, questions: list[str], hits: list[list[dict]], *, k: int,
                num_beams: int = 4, max_new_tokens: int = 20, max_source_len: int = 300) -> list[dict[str, Any]]:
    """Fusion-in-Decoder's answers to `questions` from their passages `hits` (dicts: id, title, text,
    retrieval_score)."""
    from bertforge.retrieval.fid import FusionInDecoder, fid_input, generate_fused

    device = next(generator.parameters()).device
    cfg = generator.config
    padded = [list(h)[:k] + [{"id": None, "title": "", "text": "", "retrieval_score": None}] * max(0, k - len(h))
              for h in hits]
    ids = [source_ids(generator, tokenizer, fid_input(q, h["title"], h["text"]), max_source_len)
           for q, hs in zip(questions, padded) for h in hs]
    inp, mask = (t.to(device) for t in pad_rows(ids, cfg.pad_token_id))
    out = generate_fused(generator, inp, mask, k, max_new_tokens=max_new_tokens, greedy=num_beams == 1,
                         num_beams=num_beams)
    answers = [_clean(r.tolist(), cfg) for r in out]
    labels, lmask = pad_rows([a + [cfg.eos_token_id] for a in answers], cfg.pad_token_id)
    labels, lmask = labels.to(device), lmask.to(device)
    logits = FusionInDecoder(generator, k)(inp, mask, labels=labels.masked_fill(lmask == 0, -100))["logits"]
    ll = F.log_softmax(logits.float(), -1).gather(-1, labels[..., None]).squeeze(-1).masked_fill(lmask == 0, 0.0)
    results = []
    for i, question in enumerate(questions):
        used = [{"id": h.get("id"), "title": h.get("title", ""), "text": h.get("text", ""),
                 "retrieval_score": h.get("retrieval_score")} for h in hits[i][:k]]
        results.append({"question": question, "answer": tokenizer.decode(answers[i]).strip(),
                        "score": round(float(torch.exp(ll[i].sum())), 6), "passages": used, "answers": []})
    return results
