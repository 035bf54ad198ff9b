"""Generative open-domain QA: RAG and Fusion-in-Decoder, trained behind `finetune(task="rag" | "fid")` and answering
behind `ask(..., generator=G)` and serve's /answer.

    bertforge.finetune("runs/bart", task="rag", train="nq-train.jsonl", out="runs/rag", index="runs/index",
                       retriever="runs/retriever", k=5, marginalise="token")
    bertforge.finetune("runs/t5", task="fid", train="nq-train.jsonl", out="runs/fid", index="runs/index", k=10)
    bertforge.ask("who wrote hamlet?", index="runs/index", generator="runs/rag")     # RAG: its own question tower
    bertforge.ask("who wrote hamlet?", index="runs/index", generator="runs/fid", k=10)

`GenerativeAsker` holds what answering loads once (serve holds one); see docs/rag.md.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bertforge.api.inputs import device_for, make_config, model_name
from bertforge.errors import ArgumentError, BertforgeError

DECODINGS = ("thorough", "fast")


# ---- opening the parts -------------------------------------------------------------------------------------------
def dense_index(index: Any):
    """(RetrievalIndex, PassageVectors) of an index folder (or a loaded `Index`); a bm25 index is one line."""
    from bertforge.retrieval.index import RetrievalIndex
    from bertforge.retrieval.rag_train import PassageVectors

    if index is None:
        raise BertforgeError("index: give the dense index the passages are retrieved from")
    inner = index._index if hasattr(index, "_index") else RetrievalIndex.load(index)
    where = str(inner.path or "the index")
    if inner.vectors is None:
        raise BertforgeError(f"index: {where} is a {inner.method} index; RAG needs the passages' vectors (build "
                             "a dense or hybrid index)")
    return inner, PassageVectors(inner.vectors.index, len(inner), where)


def _vocab(tokenizer: Any) -> dict:
    backend = getattr(tokenizer, "backend", tokenizer)
    return backend.get_vocab()


def question_tower(retriever: Any, inner: Any):
    """The question tower (trainable: no final Normalize) for a dense index, checked against it: the recorded model
    (fingerprint-checked) when `retriever` is None; a retriever folder's question tower (its passage tower checked
    against the index, and the two towers' tokenizers against each other); a bertforge RAG folder's; a DPR question
    encoder (the width checked, and its vocabulary against the index model's where that is at hand); or any other
    encoder, which is then the index's own model (fingerprint-checked)."""
    from bertforge.embedding.modules import SentenceEncoder
    from bertforge.retrieval.generative_train import read_generative
    from bertforge.retrieval.rag_folder import RAG_QUESTION_ARCHITECTURE
    from bertforge.retrieval.towers import _trainable, is_retriever, load_retriever
    from bertforge.config.hf import read_config_json

    where = str(inner.path or "the index")
    meta = inner.meta
    if retriever is None:
        tower = inner.load_model(None)
    elif read_generative(retriever)[0] == "rag":
        tower = _separate(SentenceEncoder.from_pretrained(Path(retriever) / read_generative(retriever)[1]["question"]),
                          inner, retriever)
    elif is_retriever(retriever):
        question, passage = load_retriever(retriever)
        if question is not passage and _vocab(question.tokenizer) != _vocab(passage.tokenizer):
            raise BertforgeError(f"retriever: {retriever}'s question and passage towers have different "
                                 "vocabularies; a question vector and a passage vector must read the same tokens")
        inner.check_model(passage)
        tower = question
    else:
        name = model_name(retriever, None, "retriever=")
        arch = read_config_json(name).get("architectures") or [] if Path(name, "config.json").is_file() else []
        if RAG_QUESTION_ARCHITECTURE in arch:
            tower = _separate(SentenceEncoder.from_pretrained(name), inner, retriever)
        else:
            tower = SentenceEncoder.from_pretrained(name, pooling=meta.get("pooling"))
            inner.check_model(tower)
    if tower.dim != meta["dim"]:
        raise BertforgeError(f"retriever: {retriever} embeds questions in {tower.dim} dimensions, but {where} holds "
                             f"vectors of {meta['dim']}")
    return _trainable(tower, None)


def _separate(tower: Any, inner: Any, retriever: Any):
    """A question tower of its own: its width must be the index's, and its vocabulary the index model's (when the
    index's model folder is at hand: the two towers must read the same tokens)."""
    from bertforge.tokenization import Tokenizer

    where = str(inner.path or "the index")
    if tower.dim != inner.meta["dim"]:
        raise BertforgeError(f"retriever: {retriever} embeds questions in {tower.dim} dimensions, but {where} holds "
                             f"vectors of {inner.meta['dim']}")
    source = inner.meta.get("model")
    if source and Path(source).is_dir():
        try:
            passage_vocab = _vocab(Tokenizer.from_pretrained(source))
        except BertforgeError:
            return tower
        if passage_vocab != _vocab(tower.tokenizer):
            raise BertforgeError(f"retriever: {retriever}'s vocabulary is not that of {source}, which built {where}: "
                                 "a question vector and a passage vector must read the same tokens")
    return tower


def open_generator(generator: Any, revision: str | None = None):
    """(Seq2SeqLM, its tokenizer, kind "rag" | "fid" | None, record) of a generator folder, a bertforge FiD folder
    or a RAG folder (transformers' layout; its generator and generator_tokenizer/)."""
    from bertforge.model import Seq2SeqLM
    from bertforge.model.folder import ModelFolder
    from bertforge.retrieval.generative_train import read_generative
    from bertforge.retrieval.rag_folder import is_rag_folder, load_generator, open_rag_folder
    from bertforge.tokenization import Tokenizer

    if generator is None:
        raise BertforgeError("generator: give the generator (a BART or T5 folder, a RAG folder or a fid folder)")
    if is_rag_folder(generator):
        kind, record = read_generative(generator)
        model = load_generator(open_rag_folder(generator))
        tok_dir = Path(generator) / "generator_tokenizer"
        if not tok_dir.is_dir():
            raise BertforgeError(f"generator: {generator} has no generator_tokenizer/ folder")
        return model, Tokenizer.from_pretrained(tok_dir, vocab_size=model.config.vocab_size), "rag", record
    name = model_name(generator, revision, "generator=")
    kind, record = read_generative(name)
    folder = ModelFolder.open(name)
    return Seq2SeqLM.from_pretrained(folder), folder.tokenizer(), kind, record


def read_train_questions(train: Any, limit: int | None):
    from bertforge.retrieval.reader_train import read_questions

    if train is None:
        raise ArgumentError("train=None: give the training questions",
                            flag_message="give the training questions (--train FILE)")
    return read_questions(train)[:limit]


# ---- training ----------------------------------------------------------------------------------------------------
def finetune_generative(generator: Any, *, task: str, out: Any, train: Any, index: Any = None, retriever: Any = None,
                        device: str = "auto", overwrite: bool = False, revision: str | None = None,
                        **options: Any) -> dict[str, Any]:
    """`finetune(task="rag" | "fid")`: see bertforge.retrieval.generative_train. Returns the run's record."""
    from bertforge.retrieval.generative_train import GenerativeConfig, finetune_fid, finetune_rag

    device_for(device)
    options = {k: v for k, v in options.items() if v is not None}
    hints = {"index": str(getattr(index, "path", None) or index),
             "retriever": None if retriever is None else str(retriever)}
    cfg = make_config(GenerativeConfig, f"finetune --task {task}", dict(
        generator=str(generator), out=out, train=train, task=task, device=device, overwrite=overwrite, hints=hints),
        options)
    questions = read_train_questions(train, cfg.train_limit)  # data problems before any model work
    if task == "rag":
        inner, vectors = dense_index(index)
        if cfg.k > len(inner):
            raise BertforgeError(f"k: {cfg.k} passages a question, but {inner.path} holds {len(inner)}")
        tower = question_tower(retriever, inner)
        model, tokenizer, _, _ = open_generator(generator, revision)
        return finetune_rag(cfg, tower, model, tokenizer, vectors, inner.passages.titles, inner.passages.texts,
                            questions)
    from bertforge.api.answers import open_index
    from bertforge.retrieval.reading import hit_fields

    searcher = open_index(index, retriever, device, revision)
    if cfg.k > len(searcher):
        raise BertforgeError(f"k: {cfg.k} passages a question, but {index} holds {len(searcher)}")
    model, tokenizer, _, _ = open_generator(generator, revision)
    hits = searcher.search([q.question for q in questions], k=cfg.k)
    return finetune_fid(cfg, model, tokenizer, questions, [[hit_fields(h) for h in hs] for hs in hits])


# ---- answering ---------------------------------------------------------------------------------------------------
class GenerativeAsker:
    """A loaded index and generator (RAG or Fusion-in-Decoder): `asker(questions, k)` -> one `AskResult` per
    question, as `Asker` (serve holds one). `k` None: the k the generator was trained with (RAG: its n_docs)."""

    def __init__(self, index: Any, generator: Any, retriever: Any = None, *, device: str | None = "auto",
                 decoding: str = "thorough", num_beams: int = 4, max_new_tokens: int = 20,
                 revision: str | None = None):
        from bertforge.device import move_model

        if decoding not in DECODINGS:
            raise BertforgeError(f"decoding: expected one of {', '.join(DECODINGS)} (got {decoding!r})")
        if num_beams < 1 or max_new_tokens < 1:
            raise BertforgeError(f"num_beams and max_new_tokens must be positive (got {num_beams}, {max_new_tokens})")
        run_on = device_for(device)
        self.decoding, self.num_beams, self.max_new_tokens = decoding, num_beams, max_new_tokens
        model, self.tokenizer, self.kind, self.record = open_generator(generator, revision)
        self.generator = move_model(model, run_on, "--generator").eval()
        self.max_len = int(self.record.get("max_source_len") or 300)
        if self.kind == "rag":
            self.inner, self.vectors = dense_index(index)
            self.tower = move_model(question_tower(retriever if retriever is not None else generator, self.inner),
                                    run_on, "--retriever").eval()
            self.marginalise = self.record.get("marginalise", "token")
            self.k_default = int(self.record.get("k") or 5)
        else:
            from bertforge.api.answers import open_index

            self.index = open_index(index, retriever, device, revision)
            self.k_default = int(self.record.get("k") or 5)
        self.k_limit = len(self.inner) if self.kind == "rag" else len(self.index)

    def __call__(self, questions: list[str], k: int | None = None, progress: bool = False) -> list[Any]:
        from bertforge.api.answers import AskResult, check_question
        from bertforge.retrieval.generative_answer import fid_answers, rag_answers

        k = self.k_default if k is None else k
        if k <= 0:
            raise BertforgeError(f"k: must be positive, got {k}")
        if k > self.k_limit:
            raise BertforgeError(f"k: {k} passages a question, but the index holds {self.k_limit}")
        questions = [check_question(q, i) for i, q in enumerate(questions)]
        opts = dict(num_beams=self.num_beams, max_new_tokens=self.max_new_tokens, max_source_len=self.max_len)
        if self.kind == "rag":
            out = rag_answers(self.tower, self.generator, self.tokenizer, self.vectors, self.inner.passages,
                              questions, k=k, marginalise=self.marginalise, decoding=self.decoding, **opts)
        else:
            from bertforge.retrieval.reading import hit_fields

            hits = [[hit_fields(h) for h in hs] for hs in self.index.search(questions, k=k)]
            out = fid_answers(self.generator, self.tokenizer, questions, hits, k=k, **opts)
        return [AskResult(**r) for r in out]
