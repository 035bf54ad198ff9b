"""`bertforge evaluate --task open-qa`: the flags of open-domain QA scoring on the `evaluate` verb, and its run."""
from __future__ import annotations

import argparse
import json

TASK = "open-qa"
FORMATS = ("nq-open", "webquestions", "curatedtrec", "dpr-csv", "squad")  # retrieval.questions.FORMATS, torch-free


def add_open_qa_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("open-domain QA (--task open-qa)")
    g.add_argument("--index", metavar="DIR", help="the passage index to search (`bertforge index build`)")
    g.add_argument("--questions", metavar="FILE",
                   help="questions with answers: NQ-open jsonl, WebQuestions json / jsonl, CuratedTREC tsv "
                        "(question<TAB>pattern), DPR's csv (question<TAB>[answers]) or SQuAD v1.1 json")
    g.add_argument("--question-format", choices=FORMATS, help="the questions' layout (default: found from the file)")
    g.add_argument("--match", choices=("string", "regex"),
                   help="how answers are found in passages (default: regex for curatedtrec, else string)")
    g.add_argument("--retriever", metavar="MODEL",
                   help="the question encoder to search the index with (default: the model it records)")
    g.add_argument("--reader", metavar="MODEL", help="a reader model: also score its answers (exact match, F1)")
    g.add_argument("--top-k", default="1,5,20,100", metavar="K,...",
                   help="report top-k retrieval accuracy for these k (default: 1,5,20,100)")
    g.add_argument("--out", metavar="FILE", help="also write the JSON here, with each question's rank and answer")


def run_open_qa(args: argparse.Namespace) -> int:
    from bertforge.api import evaluate_open_qa
    from bertforge.errors import BertforgeError

    for flag, given in (("--index", args.index), ("--questions", args.questions)):
        if not given:
            raise BertforgeError(f"evaluate --task {TASK}: give {flag}")
    result = evaluate_open_qa(args.index, args.questions, retriever=args.retriever, reader=args.reader,
                              top_k=args.top_k, question_format=args.question_format, match=args.match,
                              limit=args.limit, out=args.out, device=args.device, progress=args.progress,
                              revision=args.revision)
    print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    return 0
