"""The question encoder trained with the reader (ORQA / REALM open-QA fine-tuning, `bertforge.retrieval.orqa`):
what `finetune(task="open-qa", train_retriever=True)` opens, and the search `ask` / `evaluate_open_qa` do with a
reader folder that holds its own trained question encoder (`READER/question/`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bertforge.api.answers import BM25
from bertforge.errors import BertforgeError


def realm_retriever(retriever: Any) -> Any:
    """A REALM pretraining run folder (`pretrain --recipe realm`: retriever/ and knowledge/) stands for its
    retriever/ (the query tower with its projection; the document tower must have built the index)."""
    from bertforge.retrieval.realm_knowledge import KNOWLEDGE_DIR
    from bertforge.retrieval.towers import is_retriever

    if isinstance(retriever, (str, Path)) and not is_retriever(retriever):
        run = Path(retriever)
        if is_retriever(run / "retriever") and (run / KNOWLEDGE_DIR).is_dir():
            return run / "retriever"
    return retriever


def open_joint(index: Any, retriever: Any, k: int):
    """An `orqa_train.JointRetrieval`: the index's passage vectors (frozen) and the question tower to train
    (`retriever`: a retriever folder, a REALM run, a DPR question encoder, a RAG folder or the index's own model;
    None: the question tower the index records, else its model), checked against the index in one line each."""
    from bertforge.api.generative_qa import question_tower
    from bertforge.retrieval.index import RetrievalIndex
    from bertforge.retrieval.orqa_train import JointRetrieval
    from bertforge.retrieval.rag_train import PassageVectors
    from bertforge.retrieval.towers import _trainable

    if index is None:
        raise BertforgeError("index: give the index the passages are retrieved from")
    inner = index._index if hasattr(index, "_index") else RetrievalIndex.load(index)
    where = str(inner.path or "the index")
    if inner.method == "bm25" or (retriever is not None and str(retriever).lower() == BM25):
        raise BertforgeError(f"train_retriever: {where} is searched by BM25, which has no question encoder to "
                             "train (build a dense index, or leave train_retriever off)")
    if inner.method != "dense":
        raise BertforgeError(f"train_retriever: {where} is a {inner.method} index, whose ranking is not the "
                             "question encoder's alone; give a dense index")
    if k > len(inner):
        raise BertforgeError(f"k: {k} passages a question, but {where} holds {len(inner)}")
    retriever = realm_retriever(retriever)
    if retriever is None and inner.two_towers:
        tower = _trainable(inner.load_question_model(None), None)
    else:
        tower = question_tower(retriever, inner)
    vectors = PassageVectors(inner.vectors.index, len(inner), where)
    return JointRetrieval(tower, vectors, list(inner.passages.titles), list(inner.passages.texts),
                          inner.meta.get("fingerprint"))


def reader_searcher(index: Any, reader: Any, retriever: Any, device: str | None, revision: str | None = None):
    """What `ask` / `evaluate_open_qa` search with: the reader's own trained question encoder when its folder
    holds one and no `retriever` is given, else the index with `retriever` (`answers.open_index`)."""
    from bertforge.api.answers import open_index

    found = _trained_question(reader, revision)
    if retriever is not None or found is None or index is None:
        return open_index(index, retriever, device, revision)
    return question_search(index, found, device)


def _trained_question(reader: Any, revision: str | None) -> tuple[Path, dict] | None:
    from bertforge.api.inputs import model_name
    from bertforge.retrieval.orqa import trained_question

    if not isinstance(reader, (str, Path)):
        return None
    path = Path(model_name(reader, revision, "--reader"))
    question = trained_question(path)
    if question is None:
        return None
    from bertforge.io.read import read_json

    task = read_json(path / "config.json").get("bertforge_task") or {}
    return question, task


def question_search(index: Any, found: tuple[Path, dict], device: str | None):
    """A `retrieval.orqa.QuestionSearch` over `index` (a folder or a loaded `Index`) with the tower in
    `found[0]`, placed on `device`."""
    from bertforge.api.inputs import placed
    from bertforge.embedding.modules import SentenceEncoder
    from bertforge.retrieval.index import RetrievalIndex
    from bertforge.retrieval.orqa import QuestionSearch

    question, task = found
    if hasattr(index, "_index"):
        inner = index._index
    else:
        if not Path(index).is_dir():
            raise BertforgeError(f"--index {index}: not an index directory")
        inner = RetrievalIndex.load(index)
    tower = placed(SentenceEncoder.from_pretrained(question), device or "auto", False, "--reader")
    return QuestionSearch(inner, tower.eval(), task.get("index_fingerprint"), str(question.parent))
