"""The reader and the question encoder trained together over a frozen index (ORQA, Lee et al. 2019; REALM's open-QA
fine-tuning, Guu et al. 2020): `finetune --task open-qa --train-retriever`.

Each step embeds the batch's questions with the trainable question tower, takes each question's top k passages from
the frozen dense index (searched with those very vectors, no gradient), scores them by inner product with the
passages' vectors read back from the index (`rag_train.PassageVectors`) and reads them with the reader. The loss,
per question whose k passages hold an answer:

    marginal loss = -log sum_z p(z|x) p(answer|z, x)
        p(z|x)        = softmax over the k retrieved of q(x) . p(z)        (the gradient reaches the question tower)
        p(answer|z,x) = sum over z's spans whose text matches an answer of p(start) p(end), each a softmax over z's
                        own tokens (the reader's span marginalisation)
    loss = marginal loss + the reader's passage loss (its selection head over the k, as `reader.marginal_loss`)

With p(z|x) uniform the marginal loss is the reader's span loss + log k. The passage vectors and the index never
change (the passage tower is not trained, as in ORQA and REALM's fine-tuning: no index rebuild).

The run folder holds the reader and, in `question/`, the question tower as trained (a sentence-transformers folder);
`ask` and `evaluate --task open-qa` search with it (`QuestionSearch`) when no other retriever is given.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.retrieval.reader import NEG

QUESTION_DIR = "question"  # the trained question tower inside a reader folder


def retrieval_marginal_loss(start: torch.Tensor, end: torch.Tensor, scores: torch.Tensor,
                            spans: torch.Tensor) -> torch.Tensor:
    """-log sum_z p(z|x) p(answer|z,x), the mean over the questions that have an answer span. `start` / `end`
    [B, K, L] logits (non-passage tokens masked), `scores` [B, K] retrieval scores, `spans` [B, S, 3] (passage,
    start, end; -1 rows padding)."""
    b, k, _ = start.shape
    valid = spans[..., 0] >= 0
    has = valid.any(-1)
    if not bool(has.any()):
        return scores.sum() * 0.0 + start.sum() * 0.0  # keeps the graph: nothing to learn from this batch
    p, s, e = spans.clamp(min=0).unbind(-1)
    rows = torch.arange(b, device=spans.device)[:, None].expand_as(p)
    span_lp = (start.log_softmax(-1)[rows, p, s] + end.log_softmax(-1)[rows, p, e]).masked_fill(~valid, NEG)
    # log p(answer | z, x): the logsumexp of each passage's own spans ([B, K]; NEG where z holds none)
    owner = torch.nn.functional.one_hot(p, k).bool() & valid[..., None]  # [B, S, K]
    per_passage = torch.logsumexp(span_lp[..., None].masked_fill(~owner, NEG), 1).clamp(min=NEG)
    joint = scores.float().log_softmax(-1) + per_passage
    return -torch.logsumexp(joint, -1)[has].mean()


def encode_passage_rows(tokenizer: Any, questions: Sequence[str], rows: np.ndarray, titles: Sequence[str],
                        texts: Sequence[str], max_len: int, answers: Sequence[Sequence[str]] | None) -> list:
    """The reader's inputs for each question's retrieved rows (`reading.encode_questions`)."""
    from bertforge.retrieval.reading import encode_questions

    passages = [[{"title": titles[r], "text": texts[r]} for r in row] for row in rows.tolist()]
    return encode_questions(tokenizer, questions, passages, max_len, answers)


class OrqaModel(nn.Module):
    """The reader and the question tower trained as one: `forward(q_input_ids, q_attention_mask, qidx)` retrieves
    the top k of each question (`qidx` rows point into `questions` / `answers`), reads them and returns {"loss",
    "marginal_loss", "passage_loss", "retrieval_score" (the mean top-1 score), "answer_recall" (the share of the
    batch's questions with an answer in their k)}."""

    def __init__(self, reader: nn.Module, question: nn.Module, vectors: Any, titles: Sequence[str],
                 texts: Sequence[str], tokenizer: Any, questions: Sequence[str], answers: Sequence[Sequence[str]],
                 *, k: int, max_seq_len: int):
        super().__init__()
        if question.dim != vectors.dim:
            raise BertforgeError(f"retriever: the question encoder embeds in {question.dim} dimensions, but "
                                 f"{vectors.where} holds vectors of {vectors.dim}")
        self.reader, self.question = reader, question
        self.vectors, self.titles, self.texts = vectors, titles, texts
        self.tokenizer, self.questions, self.answers = tokenizer, questions, answers
        self.k, self.max_seq_len = k, max_seq_len

    def retrieve(self, q: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
        """Rows [B, k] of the top k passages and their scores [B, k] = q . p (differentiable in q)."""
        rows = self.vectors.search(q.detach().float().cpu().numpy(), self.k)
        p = torch.from_numpy(self.vectors.vectors(rows)).to(q.device)
        return rows, torch.einsum("bd,bkd->bk", q.float(), p)

    def forward(self, q_input_ids: torch.Tensor, q_attention_mask: torch.Tensor, qidx: torch.Tensor,
                q_token_type_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        from bertforge.retrieval.reader import marginal_loss
        from bertforge.retrieval.reader_features import collate_questions

        features = {"input_ids": q_input_ids, "attention_mask": q_attention_mask}
        if q_token_type_ids is not None:
            features["token_type_ids"] = q_token_type_ids
        q = self.question.embed_features(features)
        rows, scores = self.retrieve(q)
        idx = qidx.tolist()
        encoded = encode_passage_rows(self.tokenizer, [self.questions[i] for i in idx], rows, self.titles,
                                      self.texts, self.max_seq_len, [self.answers[i] for i in idx])
        batch = collate_questions(self.tokenizer.pad_token_id)([x for _, x in encoded])
        spans = batch.pop("spans").to(q.device)
        out = self.reader(**{name: t.to(q.device) for name, t in batch.items()})
        passage, _ = marginal_loss(out["start_logits"], out["end_logits"], out["select_logits"], spans)
        marginal = retrieval_marginal_loss(out["start_logits"], out["end_logits"], scores, spans)
        found = (spans[..., 0] >= 0).any(-1).float().mean()
        return {"loss": marginal + passage, "marginal_loss": marginal.detach(), "passage_loss": passage.detach(),
                "retrieval_score": scores[:, 0].detach().mean(), "answer_recall": found}


def question_collate(tower: nn.Module, questions: Sequence[str]):
    """Rows {"input_ids" (the question's tokens, for length grouping), "qidx"} -> the tower's features and qidx."""

    def collate(rows: list[dict]) -> dict[str, torch.Tensor]:
        features = tower.tokenize([questions[int(r["qidx"])] for r in rows])
        out = {f"q_{k}": v for k, v in features.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        out["qidx"] = torch.tensor([int(r["qidx"]) for r in rows], dtype=torch.long)
        return out

    return collate


def save_question(tower: nn.Module, directory: Path) -> None:
    """The question tower into `directory/question/` (a sentence-transformers folder, scored by dot product)."""
    from bertforge.retrieval.towers import _dot_similarity

    tower.save_pretrained(Path(directory) / QUESTION_DIR)
    _dot_similarity(Path(directory) / QUESTION_DIR)


def load_question_into(tower: nn.Module, directory: Path) -> None:
    """The weights of `directory/question/` into `tower` (a resumed run's)."""
    from bertforge.embedding.modules import SentenceEncoder

    saved = SentenceEncoder.from_pretrained(Path(directory) / QUESTION_DIR)
    tower.load_state_dict(saved.state_dict())


def trained_question(reader_dir: str | Path) -> Path | None:
    """The question tower a reader folder holds (`finetune --train-retriever`), or None."""
    q = Path(reader_dir) / QUESTION_DIR
    return q if (q / "modules.json").is_file() else None


class QuestionSearch:
    """A dense index searched with a question tower of its own (a reader's trained one): `search(questions, k)`
    -> Hits, scored by the inner product of the tower's raw vector with the passages' stored vectors (the score
    p(z|x) was trained on). The index's own model and fingerprint are not consulted: the tower was trained
    against this index's vectors (`index_fingerprint`, recorded when it was trained, is checked instead)."""

    def __init__(self, inner: Any, tower: Any, index_fingerprint: str | None = None, source: str = "the reader"):
        from bertforge.retrieval.rag_train import PassageVectors

        where = str(inner.path or "the index")
        if inner.vectors is None:
            raise BertforgeError(f"index: {where} is a {inner.method} index; {source}'s question encoder searches "
                                 "a dense one")
        if index_fingerprint and inner.meta.get("fingerprint") != index_fingerprint:
            raise BertforgeError(f"index: {where} was built by model fingerprint "
                                 f"{str(inner.meta.get('fingerprint'))[:12]}, but {source}'s question encoder was "
                                 f"trained against vectors of {index_fingerprint[:12]}: give the index it was "
                                 "trained with (or a retriever)")
        if tower.dim != inner.meta["dim"]:
            raise BertforgeError(f"index: {where} holds vectors of {inner.meta['dim']}, but {source}'s question "
                                 f"encoder embeds in {tower.dim}")
        self.inner, self.tower, self.path = inner, tower, inner.path
        self.vectors = PassageVectors(inner.vectors.index, len(inner), where)

    def __len__(self) -> int:
        return len(self.inner)

    def search(self, queries: str | list[str], k: int = 10) -> Any:
        from bertforge.retrieval.index import Hit

        one = isinstance(queries, str)
        questions = [queries] if one else list(queries)
        if k <= 0:
            raise BertforgeError(f"k must be positive, got {k}")
        k = min(k, len(self.inner))
        q = self.tower.encode(questions, normalize=False, progress=False)
        scores, rows = self.vectors.index.search(np.ascontiguousarray(q, dtype=np.float32), k)
        p = self.inner.passages
        out = [[Hit(r, float(s), p.ids[i], p.titles[i], p.texts[i])
                for r, (s, i) in enumerate(zip(srow, irow), 1) if i >= 0]
               for srow, irow in zip(scores.tolist(), rows.tolist())]
        return out[0] if one else out
