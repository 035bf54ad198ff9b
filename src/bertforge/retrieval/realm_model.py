"""The REALM training module (Guu et al. 2020): a knowledge retriever (query and document towers, [CLS] projected
to a low dimension, scored by inner product) and a knowledge-augmented encoder (an MLM reader), trained together by
the marginal likelihood of the masked span over the retrieved documents (`realm.marginal_mlm_loss`).

One step (`forward`): the query tower embeds each masked sentence; the top k passages come from the knowledge index
(stale: embedded at its last refresh), never the sentence's own source passages; the null document is added (k + 1
candidates); the candidates are embedded again by the current document tower, inside the step, so the document tower
gets a gradient; the reader reads [CLS] x [SEP] z [SEP] for each candidate. Before a step whose number of finished
steps is a multiple of `refresh_every`, the corpus is re-embedded by the current document tower (between steps).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge.embedding.modules import Dense, Pooling, SentenceEncoder, Transformer
from bertforge.errors import BertforgeError
from bertforge.retrieval.realm import NULL_DOCUMENT, marginal_mlm_loss, masked_token_logprobs
from bertforge.retrieval.realm_knowledge import KNOWLEDGE_DIR, KnowledgeIndex

IGNORE = -100
STATE_FILE = "realm.safetensors"


def projected_tower(encoder: nn.Module, tokenizer: Any, projection_dim: int, max_seq_length: int) -> SentenceEncoder:
    """An encoder read at [CLS], projected linearly to `projection_dim` (REALM's Embed_input / Embed_doc)."""
    transformer = Transformer(encoder, tokenizer, max_seq_length)
    return SentenceEncoder(transformer, Pooling(transformer.dim, ["cls"]),
                           Dense(transformer.dim, projection_dim, activation="Identity"))


def with_projection(tower: SentenceEncoder, projection_dim: int) -> SentenceEncoder:
    """A retriever tower ending in vectors of `projection_dim`: as it is when it already does, else with a linear
    projection added after its own output."""
    if tower.dim == projection_dim:
        return tower
    return SentenceEncoder(*list(tower), Dense(tower.dim, projection_dim, activation="Identity"))


class RealmModel(nn.Module):
    """reader (an MLM objective: `.encode`, `.cls.predictions`), query and document towers, the knowledge index."""

    def __init__(self, reader: nn.Module, query: SentenceEncoder, document: SentenceEncoder,
                 knowledge: KnowledgeIndex, tokenizer: Any, k: int = 8, refresh_every: int = 500,
                 seq_len: int = 288, out_dir: str | Path | None = None, progress: bool = False):
        super().__init__()
        if refresh_every < 1:
            raise BertforgeError(f"refresh_every must be at least 1 step (got {refresh_every})")
        if k < 1:
            raise BertforgeError(f"k must be at least 1 (got {k})")
        self.reader, self.query, self.document = reader, query, document
        self.knowledge, self.tok = knowledge, tokenizer
        self.k, self.refresh_every, self.seq_len = k, refresh_every, seq_len
        self.out_dir, self.progress = (Path(out_dir) if out_dir is not None else None), progress
        self.steps_done = 0  # training forwards finished (= the Trainer's step; saved with each checkpoint)
        self.refreshes = 0
        self.two_segments = getattr(reader.config, "type_vocab_size", 0) >= 2

    # ---- the index ---------------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Re-embed the knowledge corpus with the current document tower; OUT/knowledge/ follows."""
        self.knowledge.refresh(self.document, self.steps_done, progress=self.progress)
        self.refreshes += 1
        if self.out_dir is not None:
            self.knowledge.save(self.out_dir / KNOWLEDGE_DIR)

    def _maybe_refresh(self) -> None:
        due = self.steps_done % self.refresh_every == 0
        if self.knowledge.vectors is None or (due and self.knowledge.built_at != self.steps_done):
            self.refresh()

    # ---- one step ----------------------------------------------------------------------------------------------
    def candidates(self, query_vectors: torch.Tensor, exclude: list[list[int]]) -> list[list[int]]:
        """Each sentence's candidate rows: -1 (the null document), then its top k from the stale index."""
        rows = self.knowledge.search(query_vectors.detach().float().cpu().numpy(), self.k,
                                     [set(e) for e in exclude])
        return [[-1, *r] for r in rows]

    def _texts(self, rows: list[list[int]]) -> list[str]:
        return [NULL_DOCUMENT if r < 0 else self.knowledge.texts[r] for row in rows for r in row]

    def _embed(self, tower: SentenceEncoder, texts: list[str]) -> torch.Tensor:
        device = next(tower.parameters()).device
        features = {k: v.to(device) for k, v in tower.tokenize(texts).items()}
        return tower.embed_features(features)

    def _joined(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, docs: list[str], K: int):
        """[CLS] x [SEP] z [SEP] for each sentence x each of its K documents: ids, mask, token types [B*K, T]."""
        B = input_ids.shape[0]
        lengths = attention_mask.sum(1).tolist()
        z_ids = self.tok.encode_ids(docs) if docs else []
        sep, pad = self.tok.sep_token_id, self.tok.pad_token_id or 0
        rows, types = [], []
        for b in range(B):
            x = input_ids[b, :lengths[b]].tolist()
            room = max(self.seq_len - len(x) - 1, 0)
            for j in range(K):
                z = z_ids[b * K + j][:room]
                rows.append(x + z + [sep])
                types.append([0] * len(x) + [1 if self.two_segments else 0] * (len(z) + 1))
        T = max(len(r) for r in rows)
        ids = torch.full((B * K, T), pad, dtype=torch.long)
        mask = torch.zeros((B * K, T), dtype=torch.long)
        tt = torch.zeros((B * K, T), dtype=torch.long)
        for i, (r, t) in enumerate(zip(rows, types)):
            ids[i, :len(r)] = torch.tensor(r)
            mask[i, :len(r)] = 1
            tt[i, :len(t)] = torch.tensor(t)
        dev = input_ids.device
        return ids.to(dev), mask.to(dev), tt.to(dev)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, mlm_labels: torch.Tensor,
                query_texts: list[str], exclude: list[list[int]], **_: Any) -> dict[str, torch.Tensor]:
        if self.training:
            self._maybe_refresh()
            self.steps_done += 1
        B = input_ids.shape[0]
        q = self._embed(self.query, query_texts)                                   # [B, d]
        rows = self.candidates(q, exclude)
        K = len(rows[0])
        docs = self._texts(rows)
        d = self._embed(self.document, docs).view(B, K, -1)                         # [B, K, d], with a gradient
        scores = torch.einsum("bd,bkd->bk", q.float(), d.float())
        ids, mask, types = self._joined(input_ids, attention_mask, docs, K)
        hidden = self.reader.encode(ids, mask, types).last_hidden_state             # [B*K, T, H]
        # the vocabulary is projected only at the masked positions, each sentence's first M (x leads the input,
        # so they are the same positions in all K readings)
        masked = mlm_labels.ne(IGNORE)
        M = max(int(masked.sum(1).max()), 1)
        order = torch.argsort((~masked).to(torch.int8), dim=1, stable=True)[:, :M]  # [B, M]
        labels = torch.where(masked.gather(1, order), mlm_labels.gather(1, order), IGNORE)
        H = hidden.shape[-1]
        at = hidden.view(B, K, -1, H).gather(2, order[:, None, :, None].expand(B, K, M, H))
        logits = self.reader.cls.predictions(at.reshape(B * K, M, H))              # [B*K, M, V]
        token_lp = masked_token_logprobs(logits, labels, K)                        # [B, K, M]
        loss = marginal_mlm_loss(token_lp, scores)
        with torch.no_grad():
            valid = labels.ne(IGNORE)
            best = scores.argmax(1)                                                 # the best-scoring document
            pred = logits.view(B, K, M, -1).argmax(-1)[torch.arange(B), best]      # [B, M]
            correct = (pred.eq(labels) & valid).sum()
            accuracy = correct.float() / valid.sum().clamp(min=1)
            has_span = valid.any(1)  # a sentence's span is right when every one of its tokens is
            span_right = (pred.eq(labels) | ~valid).all(1) & has_span
            span_exact = span_right.float().sum() / has_span.float().sum().clamp(min=1)
            seq_lp = token_lp.sum(-1)                                               # log p(y | z, x) [B, K]
            top = 1 + scores[:, 1:].argmax(1) if K > 1 else torch.zeros_like(best)
            utility = seq_lp[torch.arange(B), top] - seq_lp[:, 0]                   # top retrieved vs null document
        return {"loss": loss, "accuracy": accuracy, "span_exact": span_exact, "retrieval_utility": utility.mean(),
                "top_beats_null": utility.gt(0).float().mean(), "null_chosen": best.eq(0).float().mean()}

    # ---- checkpoints -------------------------------------------------------------------------------------------
    def save_state(self, directory: Path) -> None:
        """The modules and the knowledge index as it stands (vectors + the step that made them), safetensors."""
        from safetensors.torch import save_file, save_model

        directory = Path(directory)
        save_model(self, str(directory / STATE_FILE))
        save_file({**self.knowledge.state(), "realm.steps_done": torch.tensor([self.steps_done])},
                  str(directory / "knowledge.safetensors"))

    def load_state(self, directory: Path) -> None:
        from safetensors.torch import load_file, load_model

        directory = Path(directory)
        missing, unexpected = load_model(self, str(directory / STATE_FILE), strict=False,
                                         device=str(next(self.parameters()).device))
        if missing or unexpected:
            raise BertforgeError(f"{directory / STATE_FILE}: does not match this REALM model "
                                 f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
        state = load_file(str(directory / "knowledge.safetensors"))
        self.knowledge.load_state(state)
        self.steps_done = int(state["realm.steps_done"][0])
