"""Open-domain question answering: `ask` (retrieve the top k passages from an index, read them with a trained
reader) and the reader's training behind `finetune(task="open-qa")`.

    bertforge.finetune("runs/bert", task="open-qa", train="nq-train.jsonl", eval="nq-dev.jsonl", out="runs/reader",
                       index="runs/index", retriever=None, k=8)
    result = bertforge.ask("who wrote hamlet?", index="runs/index", reader="runs/reader", k=20)
    result.answer, result.score, result.passages          # result.to_dict(): what `bertforge ask` prints

`Asker` holds the loaded index and reader; serve's /answer calls the very same object, so the three answer alike.
"""
from __future__ import annotations

from typing import Any

from bertforge.api.answers import BM25, AskResult, check_question, open_index  # noqa: F401  (their home was here)
from bertforge.api.inputs import device_for, model_name
from bertforge.config.arguments import BOOL, COUNT, DEVICE, MODEL, TEXT, TEXTS, check_args, maybe
from bertforge.errors import ArgumentError, BertforgeError


class LoadedReader:
    """A reader model loaded once: `read(questions, hits)` -> one `AskResult` per question, from the passages given
    (what `Asker` retrieved, or what an evaluation's retriever found)."""

    def __init__(self, reader: Any, *, device: str | None = "auto", batch_size: int = 8,
                 max_answer_len: int | None = None, revision: str | None = None):
        from bertforge.device import move_model
        from bertforge.retrieval.reader import load_reader

        run_on = device_for(device)
        self.reader, self.tokenizer, self.task = load_reader(model_name(reader, revision, "reader="))
        self.reader = move_model(self.reader, run_on, "--reader")
        self.max_len = int(self.task.get("max_seq_len") or 256)
        self.max_answer_len = int(max_answer_len or self.task.get("max_answer_len") or 30)
        self.batch_size = batch_size

    def read(self, questions: list[str], hits: list[list[Any]], progress: bool = False) -> list[AskResult]:
        from bertforge.retrieval.reading import hit_fields, read

        passages = [[hit_fields(h) for h in row] for row in hits]
        out = read(self.reader, self.tokenizer, questions, passages, self.max_len, self.batch_size,
                   max_answer_len=self.max_answer_len, progress=progress)
        return [AskResult(**r) for r in out]


class Asker:
    """A loaded index and reader: `asker(questions, k)` -> one `AskResult` per question. Build it once and call it
    for many questions (serve holds one)."""

    def __init__(self, index: Any, reader: Any, retriever: Any = None, *, device: str | None = "auto",
                 batch_size: int = 8, max_answer_len: int | None = None, revision: str | None = None):
        from bertforge.api.orqa import reader_searcher

        # a reader trained with its question encoder (train_retriever) searches with it unless a retriever is given
        self.index = reader_searcher(index, reader, retriever, device, revision)
        self.reader = LoadedReader(reader, device=device, batch_size=batch_size, max_answer_len=max_answer_len,
                                   revision=revision)

    @property
    def max_len(self) -> int:
        """The reader's input length (what serve counts a question's work by)."""
        return self.reader.max_len

    def retrieve(self, questions: list[str], k: int) -> list[list[Any]]:
        return self.index.search(list(questions), k=k)

    def __call__(self, questions: list[str], k: int | None = 20, progress: bool = False) -> list[AskResult]:
        k = 20 if k is None else k
        if k <= 0:
            raise BertforgeError(f"k: must be positive, got {k}")
        questions = [check_question(q, i) for i, q in enumerate(questions)]
        return self.reader.read(questions, self.retrieve(questions, k), progress)


def ask(question: Any, *, index: Any, reader: Any = None, retriever: Any = None, k: int | None = None,
        device: str = "auto", batch_size: int = 8, progress: bool = False, revision: str | None = None,
        generator: Any = None, decoding: str = "thorough", num_beams: int = 4, max_new_tokens: int = 20) -> Any:
    """Answer `question` (a string, or a list of them) from the top `k` passages of `index` (a folder, or a loaded
    `Index`), read by `reader` (a folder `finetune(task="open-qa")` wrote). `retriever`: the question encoder of a
    dense index (default: the one the index records), or "bm25" for a sparse one. Returns an `AskResult` (a list of
    them for a list), whose `to_dict()` is what `bertforge ask` prints. `k` None: 20 for a reader.

    `generator` instead of `reader` answers by generation (bertforge.api.generative_qa, docs/rag.md): a RAG folder
    (`finetune(task="rag")`; its question tower retrieves unless `retriever` is given; `k` None: the k it trained
    with; RAG-Sequence decodes "thorough" or "fast" by `decoding`) or a Fusion-in-Decoder folder
    (`finetune(task="fid")`); `num_beams`, `max_new_tokens`: the decoding's."""
    check_args(locals(), question=TEXTS, index=MODEL, reader=maybe(MODEL), retriever=maybe(MODEL), k=maybe(COUNT),
               device=DEVICE, batch_size=COUNT, progress=BOOL, revision=maybe(TEXT), generator=maybe(MODEL),
               decoding=TEXT, num_beams=COUNT, max_new_tokens=COUNT)
    if (reader is None) == (generator is None):
        raise ArgumentError("reader, generator: give one of them (a finetune task='open-qa' reader, or a RAG / "
                             "fid generator)")
    one = isinstance(question, str)
    questions = [question] if one else list(question)
    if not questions:
        raise BertforgeError("question: give at least one question")
    if generator is not None:
        from bertforge.api.generative_qa import GenerativeAsker

        results = GenerativeAsker(index, generator, retriever, device=device, decoding=decoding,
                                  num_beams=num_beams, max_new_tokens=max_new_tokens, revision=revision)(
            questions, k, progress)
        return results[0] if one else results
    results = Asker(index, reader, retriever, device=device, batch_size=batch_size, revision=revision)(
        questions, 20 if k is None else k, progress)
    return results[0] if one else results


def finetune_open_qa(model: Any, *, out: Any, train: Any, eval: Any = None, index: Any = None, retriever: Any = None,
                     train_retriever: bool = False, device: str = "auto", overwrite: bool = False,
                     revision: str | None = None, **options: Any) -> dict[str, Any]:
    """`finetune(task="open-qa")`: a reader trained on the top-k passages `index` gives the `train` questions (see
    `bertforge.retrieval.reader_train`). Returns the run's record. `train_retriever`: the question encoder is
    trained with the reader (ORQA / REALM, `bertforge.retrieval.orqa`; `k` default 5), the index frozen."""
    from bertforge.api.inputs import make_config
    from bertforge.retrieval.reader_train import OpenQAConfig, finetune_reader

    if train_retriever:
        return _finetune_orqa(model, out=out, train=train, eval=eval, index=index, retriever=retriever,
                              device=device, overwrite=overwrite, revision=revision, **options)
    if train is None:
        raise ArgumentError("train=None: give the training questions",
                            flag_message="give the training questions (--train FILE)")
    device_for(device)
    searcher = open_index(index, retriever, device, revision)
    hints = {"index": str(getattr(searcher, "path", None) or index),
             "retriever": None if retriever is None else str(retriever)}
    cfg = make_config(OpenQAConfig, "finetune --task open-qa", dict(
        model=model_name(model, revision), out=out, train=train, eval=eval, device=device, hints=hints), options)

    def retrieve(questions: list[str], k: int) -> list[list[Any]]:
        return searcher.search(questions, k=k)

    return finetune_reader(cfg, retrieve, overwrite=overwrite)


def _finetune_orqa(model: Any, *, out: Any, train: Any, eval: Any, index: Any, retriever: Any, device: str,
                   overwrite: bool, revision: str | None, **options: Any) -> dict[str, Any]:
    """`finetune(task="open-qa", train_retriever=True)`: the reader and the question encoder (bertforge.api.orqa)."""
    from bertforge.api.inputs import make_config
    from bertforge.api.orqa import open_joint
    from bertforge.retrieval.reader_train import OpenQAConfig, finetune_reader

    if train is None:
        raise BertforgeError("train: give the training questions (--train FILE)")
    device_for(device)
    options = {"k": 5, **{k: v for k, v in options.items() if not (k == "k" and v is None)}}
    hints = {"index": str(getattr(index, "path", None) or index),
             "retriever": None if retriever is None else str(retriever)}
    cfg = make_config(OpenQAConfig, "finetune --task open-qa", dict(
        model=model_name(model, revision), out=out, train=train, eval=eval, device=device, hints=hints,
        train_retriever=True), options)  # the settings checked before the index and the encoder are opened
    joint = open_joint(index, retriever, cfg.k)
    from bertforge.retrieval.orqa_train import train_joint

    return finetune_reader(cfg, None, overwrite=overwrite,
                           train_fn=lambda c, folder, tq, eq: train_joint(c, folder, joint, tq, eq))
