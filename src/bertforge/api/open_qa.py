"""Open-domain QA evaluation: `evaluate_open_qa`, the verb `bertforge evaluate --task open-qa`.

    result = bertforge.evaluate_open_qa("runs/index", "nq-open-dev.jsonl", top_k=(1, 5, 20, 100))
    result.top_k_accuracy            # {1: 23.1, 5: 45.0, 20: 61.2, 100: 74.9}: % of questions, as the papers print it
    result.to_dict()                 # what the command line prints

Scored as DPR scores it (docs/retrieval.md, "Scoring open-domain QA"): a passage holds an answer when the answer's
tokens appear in it (or, for CuratedTREC, its pattern matches); a reader's answer by SQuAD's exact match and F1.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bertforge.config.arguments import BOOL, COUNT, DATA, DEVICE, MODEL, PATH, TEXT, check_args, maybe
from bertforge.errors import BertforgeError


def evaluate_open_qa(index: Any, questions: Any, *, retriever: Any = None, reader: Any = None,
                     answer_fn: Callable[[str, list], str] | None = None, top_k: Sequence[int] | str = (1, 5, 20, 100),
                     question_format: str | None = None, match: str | None = None, limit: int | None = None,
                     out: Any = None, device: str | None = None, progress: bool = False,
                     revision: str | None = None):
    """Top-k retrieval accuracy of `index` over the questions of file `questions` and, with a reader, its end-to-end
    exact match / F1. Returns an `OpenQAResult` (`to_dict()`: the JSON the command line prints).

    `index`: an index folder, an `Index`, or any object with `search(questions, k)` returning hits with a `text`.
    `retriever`: the question encoder an index folder is searched with (default: the model it records).
    `reader`: a reader model answering from the hits (`bertforge.ask`); `answer_fn(question, hits) -> str`: any
    reader as a function (not both). `question_format`: nq-open, webquestions, curatedtrec, dpr-csv or squad
    (default: found from the file); `match`: "string" or "regex" (default: regex for curatedtrec, else string).
    `limit`: score the first N questions only. `out`: also write the JSON there (atomically)."""
    from bertforge.retrieval.metrics import parse_ks
    from bertforge.retrieval.open_qa import score_open_qa
    from bertforge.retrieval.questions import read_questions

    check_args(locals(), index=MODEL, questions=DATA, retriever=maybe(MODEL), reader=maybe(MODEL),
               question_format=maybe(TEXT), match=maybe(TEXT), limit=maybe(COUNT), out=maybe(PATH),
               device=maybe(DEVICE), progress=BOOL, revision=maybe(TEXT))
    ks = parse_ks(top_k)
    if reader is not None and answer_fn is not None:
        raise BertforgeError("give reader or answer_fn, not both")
    if out is not None:
        from bertforge.io.write import prepare_output_file

        prepare_output_file(out, what="out")  # before any question is searched
    found = read_questions(questions, question_format, match)
    asked = found.questions[:limit] if limit else found.questions
    if reader is not None:
        answer_fn = _reader(reader, device, revision)
    searcher = _searcher(index, retriever, device, revision, reader)
    result = score_open_qa(asked, lambda qs, k: searcher.search(qs, k=k), ks, answer_fn, format=found.format,
                           progress=progress)
    if out is not None:
        from bertforge.io.write import write_json

        write_json(Path(out), result.to_dict(per_question=True))
    return result


def _searcher(index: Any, retriever: Any, device: str | None, revision: str | None, reader: Any = None) -> Any:
    plain = hasattr(index, "search") and not hasattr(index, "_index")  # a searcher object, taken as it is
    if reader is not None and retriever is None and not plain:  # a reader's trained question encoder searches
        from bertforge.api.orqa import _trained_question, question_search

        found = _trained_question(reader, revision)
        if found is not None:
            return question_search(index, found, device)
    if hasattr(index, "search"):
        if retriever is not None:
            raise BertforgeError("retriever: give it with an index folder (a loaded index keeps its own encoder)")
        return index
    from bertforge.api.index import Index

    return Index.load(index, retriever, device=device, revision=revision)


def _reader(reader: Any, device: str | None, revision: str | None) -> Callable[[str, list], str]:
    """The reader as `answer_fn`: the extractive reader (`bertforge.ask`'s), loaded once, reading the hits the
    evaluation retrieved."""
    from bertforge.api.reading import LoadedReader

    loaded = LoadedReader(reader, device=device or "auto", revision=revision)
    return lambda question, hits: loaded.read([question], [hits])[0].answer
