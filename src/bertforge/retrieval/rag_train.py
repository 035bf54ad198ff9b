"""Training RAG end to end (`bertforge finetune --task rag`): each step embeds its questions with the question tower
(trainable), takes each question's top k passages from a frozen dense index (searched with those very vectors, no
gradient), scores them by inner product with the passages' vectors read back from the index, and trains the
generator on the contexts `title / text // question` with RAG-Token's or RAG-Sequence's loss
(`retrieval.rag.RetrievalAugmentedGenerator`). The retrieval scores carry the gradient to the question tower: p(z|x)
is a softmax over them.

The passage vectors are the index's own (FAISS reconstruct), which stores them L2-normalised: `doc_scores` are then
inner products of the raw question vector with unit passage vectors. The ranking is the same as the index's (a
question's norm does not reorder its passages); the scores' scale is the question vector's norm, which training
adjusts. The passages, like the index, never change (the passage tower is not trained: RAG's choice, so that the
index need not be rebuilt).

Contexts are built as transformers' RagRetriever builds them (`postprocess_docs`: the title without surrounding
quotes, " / ", the text, " // ", the question; double spaces made single), each read by the generator's own
tokenizer; the question tower reads the question with its own. The answers become `labels`, which the decoder reads
as they are (RAG's convention): the decoder's start token, the answer as the generator's tokenizer encodes a source
(T5: "answer </s>", BART: "<s> answer </s>"), padding. For T5 this is exactly transformers' RAG fine-tuning script's
target; for BART the start token is put first too, so that training sees the prefix decoding starts from.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.retrieval.rag import RetrievalAugmentedGenerator

TITLE_SEP, DOC_SEP = " / ", " // "  # transformers' RagConfig defaults


def rag_context(title: str, text: str, question: str, prefix: str = "") -> str:
    """One generator input, as transformers' RagRetriever.postprocess_docs writes it."""
    if title.startswith('"'):
        title = title[1:]
    if title.endswith('"'):
        title = title[:-1]
    return (prefix + title + TITLE_SEP + text + DOC_SEP + question).replace("  ", " ")


def source_ids(generator: nn.Module, tokenizer: Any, text: str, max_len: int) -> list[int]:
    """A text as the generator's encoder reads it, cut to `max_len` tokens (its end-of-sequence token kept)."""
    ids = generator.prompt_ids(tokenizer, text)
    return ids if len(ids) <= max_len else ids[: max_len - 1] + ids[-1:]


def answer_labels(generator: nn.Module, tokenizer: Any, answer: str, max_len: int) -> list[int]:
    """An answer as RAG's labels: the decoder's start token, then the answer as a source (see the docstring)."""
    return [generator.config.decoder_start_token_id] + source_ids(generator, tokenizer, answer, max_len - 1)


def pad_rows(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and their attention mask."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(list(r), dtype=torch.long)
        mask[i, :len(r)] = 1
    return ids, mask


class PassageVectors:
    """The dense part of an index, searched and read back by row: `search(q [B, d], k)` -> rows [B, k] (best first),
    `vectors(rows)` -> [B, k, d] float32 (unit vectors, as stored)."""

    def __init__(self, faiss_index: Any, count: int, where: str):
        self.index, self.count, self.where = faiss_index, count, where
        self.dim = int(faiss_index.d)
        self._direct_map()

    def _direct_map(self) -> None:
        """IVF indexes read a vector back only through a direct map (made once, in memory)."""
        import faiss

        try:
            ivf = faiss.extract_index_ivf(self.index)
        except (RuntimeError, AttributeError):
            return
        ivf.make_direct_map()

    def search(self, q: np.ndarray, k: int) -> np.ndarray:
        if k > self.count:
            raise BertforgeError(f"k: {k} passages a question, but {self.where} holds {self.count}")
        _, rows = self.index.search(np.ascontiguousarray(q, dtype=np.float32), k)
        if (rows < 0).any():
            raise BertforgeError(f"{self.where}: the index found fewer than k = {k} passages for a question (an "
                                 "approximate index probing too few lists: search it with more)")
        return rows

    def vectors(self, rows: np.ndarray) -> np.ndarray:
        flat = rows.reshape(-1).astype(np.int64)
        try:
            out = self.index.reconstruct_batch(flat)
        except RuntimeError as err:
            raise BertforgeError(f"{self.where}: its vectors cannot be read back ({str(err).splitlines()[0]}); "
                                 "RAG needs a flat, hnsw or ivf index") from None
        return np.asarray(out, dtype=np.float32).reshape(*rows.shape, self.dim)


class RagTrainer(nn.Module):
    """The question tower and the generator, trained as one: `forward(q_*, labels, qidx)` retrieves, scores and
    returns {"loss": mean RAG loss over the batch's questions, "retrieval_score": the mean top-1 score}.
    `passages` are (titles, texts); `questions` the training questions by index (`qidx` rows point into them)."""

    def __init__(self, tower: nn.Module, generator: nn.Module, tokenizer: Any, vectors: PassageVectors,
                 titles: Sequence[str], texts: Sequence[str], questions: Sequence[str], *, k: int,
                 marginalise: str, max_source_len: int, freeze_retriever: bool = False):
        super().__init__()
        if tower.dim != vectors.dim:
            raise BertforgeError(f"retriever: the question tower embeds in {tower.dim} dimensions, but "
                                 f"{vectors.where} holds vectors of {vectors.dim}")
        self.tower, self.rag = tower, RetrievalAugmentedGenerator(generator, n_docs=k, marginalise=marginalise)
        self.tokenizer, self.vectors = tokenizer, vectors
        self.titles, self.texts, self.questions = titles, texts, questions
        self.k, self.max_source_len = k, max_source_len
        self.freeze_retriever = freeze_retriever
        if freeze_retriever:
            for p in self.tower.parameters():
                p.requires_grad_(False)

    @property
    def generator(self) -> nn.Module:
        return self.rag.generator

    def retrieve(self, q: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
        """Rows [B, k] of the top k passages and doc_scores [B, k] = q . p (differentiable in q)."""
        rows = self.vectors.search(q.detach().float().cpu().numpy(), self.k)
        p = torch.from_numpy(self.vectors.vectors(rows)).to(q.device)
        return rows, torch.einsum("bd,bkd->bk", q.float(), p)

    def contexts(self, rows: np.ndarray, questions: Sequence[str], device) -> tuple[torch.Tensor, torch.Tensor]:
        ids = [source_ids(self.generator, self.tokenizer, rag_context(self.titles[r], self.texts[r], q),
                          self.max_source_len)
               for q, row in zip(questions, rows.tolist()) for r in row]
        ids_t, mask = pad_rows(ids, self.generator.config.pad_token_id)
        return ids_t.to(device), mask.to(device)

    def forward(self, q_input_ids: torch.Tensor, q_attention_mask: torch.Tensor, labels: torch.Tensor,
                qidx: torch.Tensor, q_token_type_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        features = {"input_ids": q_input_ids, "attention_mask": q_attention_mask}
        if q_token_type_ids is not None:
            features["token_type_ids"] = q_token_type_ids
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.freeze_retriever):
            q = self.tower.embed_features(features)
        rows, doc_scores = self.retrieve(q)
        ctx, mask = self.contexts(rows, [self.questions[i] for i in qidx.tolist()], q.device)
        out = self.rag(ctx, mask, doc_scores, labels=labels)
        return {"loss": out.loss.mean(), "retrieval_score": doc_scores[:, 0].detach().mean()}


def rag_collate(tower: nn.Module, generator: nn.Module, tokenizer: Any, max_target_len: int):
    """Rows {"qidx", "question", "answer"} -> the question tower's features, the answers' labels and qidx."""
    pad = generator.config.pad_token_id

    def collate(rows: list[dict]) -> dict[str, torch.Tensor]:
        features = tower.tokenize([r["question"] for r in rows])
        labels, _ = pad_rows([answer_labels(generator, tokenizer, r["answer"], max_target_len) for r in rows], pad)
        out = {f"q_{k}": v for k, v in features.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        out.update(labels=labels, qidx=torch.tensor([r["qidx"] for r in rows], dtype=torch.long))
        return out

    return collate
