"""`bertforge ask`: answer questions from the top k passages of an index, read by a trained open-QA reader."""
from __future__ import annotations

import argparse
import json

from bertforge.commands.bounds import COUNT
from bertforge.commands.needs import index_needs
from bertforge.commands.options import add_progress_arg
from bertforge.device import add_device_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ask", help="answer questions from an index with a trained reader (JSON)",
                       description="Retrieve each question's top -k passages from --index and read them with "
                                   "--reader (a `finetune --task open-qa` folder). Prints JSON: the answer, its "
                                   "score (P(passage) x P(span), summed over the spans that read alike) and the "
                                   "passages it came from (id, title, text, retrieval score, the span's character "
                                   "offsets); one object for one question, a list for several. With --generator "
                                   "instead of --reader the answer is generated (RAG or Fusion-in-Decoder; score: "
                                   "the answer's probability; docs/rag.md).",
                       epilog="example:\n  bertforge ask --index runs/index --reader runs/reader -k 20 "
                              "\"who wrote hamlet?\"\n  bertforge ask --index runs/index --generator runs/rag "
                              "--num-beams 4 \"who wrote hamlet?\"",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("questions", nargs="+", metavar="QUESTION", help="the question(s) to answer")
    p.add_argument("--index", required=True, metavar="DIR", help="the index to retrieve passages from")
    p.add_argument("--retriever", metavar="R", help="the question encoder of a dense index (default: the one the "
                                                    "index records), or bm25 for a sparse index")
    p.add_argument("--reader", metavar="DIR", help="the reader (a finetune --task open-qa folder)")
    p.add_argument("--generator", metavar="DIR", help="instead of --reader, answer by generation: a RAG folder "
                   "(finetune --task rag; its question encoder retrieves unless --retriever is given) or a "
                   "Fusion-in-Decoder folder (finetune --task fid); see docs/rag.md")
    p.add_argument("--decoding", choices=("thorough", "fast"), default="thorough",
                   help="--generator, RAG-Sequence: rescore every candidate on every passage, or only on the "
                        "passages whose beams found it (default: thorough)")
    p.add_argument("--num-beams", type=COUNT, default=4, metavar="N",
                   help="--generator: beam search width (1: greedy; default: 4)")
    p.add_argument("--max-new-tokens", type=COUNT, default=20, metavar="N",
                   help="--generator: the longest answer, in tokens (default: 20)")
    p.add_argument("-k", "--top-k", dest="k", type=COUNT, metavar="K",
                   help="passages read per question (default: 20; --generator: the k it was trained with)")
    p.add_argument("--batch-size", type=COUNT, default=8, metavar="N", help="questions per forward pass (default: 8)")
    add_device_args(p, None, compile=None)
    add_progress_arg(p)
    p.set_defaults(func=ask_command, needs=lambda args: index_needs(args.index, "ask"))


def ask_command(args: argparse.Namespace) -> int:
    from bertforge.api import ask

    results = ask(args.questions, index=args.index, reader=args.reader, retriever=args.retriever, k=args.k,
                  device=args.device, batch_size=args.batch_size, progress=args.progress, generator=args.generator,
                  decoding=args.decoding, num_beams=args.num_beams, max_new_tokens=args.max_new_tokens)
    out = [r.to_dict() for r in results]
    print(json.dumps(out[0] if len(out) == 1 else out, indent=2, ensure_ascii=False))
    return 0
