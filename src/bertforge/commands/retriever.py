"""`bertforge retriever train | export-dpr`: dense retrievers (DPR's question and passage towers). Pretraining one on
raw text is `bertforge pretrain --recipe ict`."""
from __future__ import annotations

import argparse
import json

from bertforge.commands.bounds import COUNT, EPOCHS, POSITIVE, STEPS, int_range
from bertforge.commands.needs import Need, tracker_needs
from bertforge.commands.options import add_overwrite_arg, add_trainer_args, device_of, tracking


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("retriever", help="dense retrievers: train DPR-style question / passage towers, export them "
                                         "in transformers' DPR layout")
    rsub = p.add_subparsers(dest="retriever_command", metavar="ACTION")
    t = rsub.add_parser(
        "train", help="train a dense retriever (DPR: in-batch and BM25 hard negatives)",
        description="Train question and passage towers (Karpukhin et al. 2020): each question's positive passage "
                    "must score above every other passage of the batch (the other questions' positives and every "
                    "hard negative) by dot product. OUT holds question/ and passage/ (sentence-transformers "
                    "folders), transformers/question_encoder and transformers/ctx_encoder (transformers' "
                    "DPRQuestionEncoder / DPRContextEncoder) and retriever.json.")
    t.add_argument("--model", required=True, metavar="DIR",
                   help="starting encoder (BERT folder or Hub id, sentence-transformers folder, a DPR checkpoint) or "
                        "a retriever folder (from `pretrain --recipe ict` or an earlier run)")
    t.add_argument("--train", required=True, metavar="PATH",
                   help="rows {question, positive, negatives?, answers?} (jsonl, csv, ...), DPR's json "
                        "(positive_ctxs, hard_negative_ctxs, ...) or SQuAD v1.1 (each question's paragraph)")
    t.add_argument("--passages", metavar="PATH",
                   help="the passage corpus ({id, title, text}): positives / negatives given as ids, and where "
                        "hard negatives are mined (default: the training passages)")
    t.add_argument("--out", required=True, metavar="DIR", help="the retriever folder to write")
    t.add_argument("--separate-encoders", action="store_true",
                   help="two towers, one for questions and one for passages (default: one shared tower)")
    t.add_argument("--hard-negatives", type=int_range(0, 1000), default=1, metavar="N",
                   help="hard negatives per question in each batch: the row's own, then BM25's best passages that "
                        "are not its positive and hold no answer (default: 1; 0: in-batch negatives only)")
    t.add_argument("--pooling", choices=("cls", "mean"),
                   help="the tower's vector: cls (DPR's, the default) or mean (a retriever folder keeps its own)")
    t.add_argument("--epochs", type=EPOCHS, default=1.0)
    t.add_argument("--max-steps", type=STEPS, help="stop after this many steps (overrides --epochs)")
    t.add_argument("--batch-size", type=COUNT, default=16, help="questions per batch (default: 16)")
    t.add_argument("--lr", type=POSITIVE, default=2e-5, help="peak learning rate (default: 2e-5)")
    t.add_argument("--save-every", type=COUNT, metavar="N", help="checkpoint every N steps (default: at the end)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    t.add_argument("--data-split", metavar="NAME", help="the split of a folder of splits or a Hub dataset "
                                                         "(default: train)")
    t.add_argument("--data-config", metavar="NAME", help="a Hugging Face Hub dataset's configuration")
    add_trainer_args(t, resume=True)
    t.set_defaults(func=train_command, needs=_train_needs)

    e = rsub.add_parser("export-dpr", help="a retriever folder's towers in transformers' DPR layout",
                        description="Write OUT/question_encoder (DPRQuestionEncoder) and OUT/ctx_encoder "
                                    "(DPRContextEncoder): from_pretrained loads them unchanged and their "
                                    "pooler_output is the towers' vectors. BERT towers read at [CLS] only.")
    e.add_argument("--model", required=True, metavar="DIR", help="a retriever folder")
    e.add_argument("--out", required=True, metavar="DIR")
    add_overwrite_arg(e)
    e.set_defaults(func=export_command, needs=())
    p.set_defaults(func=lambda args: _help(p), needs=())


def _help(p: argparse.ArgumentParser) -> int:
    p.print_help()
    return 2


def _train_needs(args: argparse.Namespace) -> tuple[Need, ...]:
    """Mining hard negatives runs BM25 (bm25s)."""
    mining = (Need("retrieval", "bm25s", "retriever train --hard-negatives"),) if args.hard_negatives else ()
    return (*tracker_needs(args), *mining)


def train_command(args: argparse.Namespace) -> int:
    from bertforge.api import train_retriever

    device_of(args)
    result = train_retriever(
        args.model, args.train, out=args.out, passages=args.passages, separate_encoders=args.separate_encoders,
        hard_negatives=args.hard_negatives, pooling=args.pooling, epochs=args.epochs, max_steps=args.max_steps,
        batch_size=args.batch_size, lr=args.lr, seed=args.seed, data_split=args.data_split,
        data_config=args.data_config, device=args.device, precision=args.precision, compile=args.compile,
        progress=args.progress, resume=args.resume, overwrite=args.overwrite, save_every=args.save_every,
        **tracking(args))
    print(json.dumps(result.to_dict(), indent=2))
    return 0


def export_command(args: argparse.Namespace) -> int:
    from bertforge.api import export_dpr

    written = export_dpr(args.model, args.out, overwrite=args.overwrite)
    print(json.dumps({name: str(path) for name, path in written.items()}, indent=2))
    return 0
