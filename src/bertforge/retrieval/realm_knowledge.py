"""REALM's knowledge index: the knowledge corpus embedded by the run's own document tower, searched by inner
product (maximum inner-product search, as the paper) over a FAISS flat index, and refreshed with the current tower
every `refresh_every` steps (`RealmModel` does that between two steps).

The state that decides retrieval is the vectors and the step that made them; it travels with every checkpoint
(`state()` / `load_state()`, safetensors), so a resumed run searches exactly what the uninterrupted one searched.
OUT/knowledge/ holds the latest refresh for people and tools (written atomically, as a whole folder):

    OUT/knowledge/vectors.npy     [N, projection_dim] float32, row r = passage r of the corpus
    OUT/knowledge/index.faiss     a FAISS IndexFlatIP over those vectors
    OUT/knowledge/knowledge.json  {"passages", "dim", "step", "ids_file"} and OUT/knowledge/ids.json (passage ids)
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertforge.data.corpus import split_sentences
from bertforge.errors import BertforgeError
from bertforge.retrieval.passages import Passages, with_title

KNOWLEDGE_DIR = "knowledge"


def _faiss():
    try:
        import faiss
    except ImportError:
        raise BertforgeError("faiss is not installed: pip install 'bertforge[retrieval]' (or faiss-cpu)") from None
    return faiss


class KnowledgeIndex:
    """The knowledge corpus, its sentence -> source-passage map, and its (stale) document vectors."""

    def __init__(self, passages: Passages, batch_size: int = 64):
        if len(passages) == 0:
            raise BertforgeError("the knowledge corpus is empty")
        self.ids = list(passages.ids)
        self.texts = [with_title(t, x) for t, x in zip(passages.titles, passages.texts)]
        self.batch_size = batch_size
        self.vectors: np.ndarray | None = None
        self.built_at = -1  # the step whose document tower made the vectors
        self._index = None
        # each sentence of the corpus -> the passages that hold it (REALM never retrieves a sentence's own source)
        self._sources: dict[str, set[int]] = {}
        for row, text in enumerate(passages.texts):
            for sentence in split_sentences(text):
                self._sources.setdefault(sentence.strip(), set()).add(row)

    def __len__(self) -> int:
        return len(self.texts)

    def sources_of(self, sentence: str) -> set[int]:
        """The passages holding `sentence` verbatim (its source documents; empty when it is not in the corpus)."""
        return self._sources.get(sentence.strip(), set())

    # ---- embedding ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def refresh(self, tower: Any, step: int, progress: bool = False) -> None:
        """Re-embed the whole corpus with `tower` (eval mode: no dropout, so the result is a function of the weights
        alone and a resumed run recomputes it exactly)."""
        was_training = tower.training
        tower.eval()
        device = next(tower.parameters()).device
        out = []
        try:
            from tqdm.auto import tqdm
            for start in tqdm(range(0, len(self.texts), self.batch_size), desc="refresh", disable=not progress,
                              leave=False):
                features = tower.tokenize(self.texts[start:start + self.batch_size])
                features = {k: v.to(device) for k, v in features.items()}
                out.append(tower.embed_features(features).float().cpu())
        finally:
            tower.train(was_training)
        self.set_vectors(torch.cat(out).numpy(), step)

    def set_vectors(self, vectors: np.ndarray, step: int) -> None:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(self.texts):
            raise BertforgeError(f"knowledge vectors: expected [{len(self.texts)}, dim], got {list(vectors.shape)}")
        faiss = _faiss()
        index = faiss.IndexFlatIP(vectors.shape[1])
        index.add(vectors)
        self.vectors, self.built_at, self._index = vectors, int(step), index

    # ---- search ------------------------------------------------------------------------------------------------
    def search(self, queries: np.ndarray, k: int, exclude: Sequence[set[int]]) -> list[list[int]]:
        """The top `k` passage rows for each query by inner product, without the rows in its `exclude` set."""
        if self._index is None:
            raise BertforgeError("the knowledge index is not built yet")
        n = len(self.texts)
        room = n - max((len(e) for e in exclude), default=0)
        if k > room:
            raise BertforgeError(f"k={k}: the knowledge corpus has only {room} passages besides a sentence's own")
        wide = min(n, k + max((len(e) for e in exclude), default=0))
        _, rows = self._index.search(np.ascontiguousarray(queries, dtype=np.float32), wide)
        found = []
        for hits, skip in zip(rows.tolist(), exclude):
            found.append([r for r in hits if r >= 0 and r not in skip][:k])
        return found

    # ---- state -------------------------------------------------------------------------------------------------
    def state(self) -> dict[str, torch.Tensor]:
        if self.vectors is None:
            raise BertforgeError("the knowledge index is not built yet")
        return {"knowledge.vectors": torch.from_numpy(self.vectors.copy()),
                "knowledge.step": torch.tensor([self.built_at], dtype=torch.long)}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        self.set_vectors(state["knowledge.vectors"].numpy(), int(state["knowledge.step"][0]))

    def save(self, folder: str | Path) -> Path:
        """OUT/knowledge/ (see the module): the whole folder replaced at once."""
        from bertforge.training.state import atomic_write_dir

        if self.vectors is None:
            raise BertforgeError("the knowledge index is not built yet")
        faiss = _faiss()

        def write(tmp: Path) -> None:
            np.save(tmp / "vectors.npy", self.vectors, allow_pickle=False)
            faiss.write_index(self._index, str(tmp / "index.faiss"))
            (tmp / "ids.json").write_text(json.dumps(self.ids) + "\n", encoding="utf-8")
            (tmp / "knowledge.json").write_text(json.dumps(
                {"passages": len(self.texts), "dim": int(self.vectors.shape[1]), "step": self.built_at,
                 "similarity": "dot", "ids_file": "ids.json"}, indent=2) + "\n", encoding="utf-8")
        return atomic_write_dir(Path(folder), write)
