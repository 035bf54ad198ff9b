"""The flags of generative open QA on `finetune` (--task rag | fid) and its run; see docs/rag.md."""
from __future__ import annotations

import argparse

TASKS = ("rag", "fid")


TITLE = "rag / fid (generative QA over retrieved passages: --index, --retriever, -k as open-qa)"


def add_generative_args(p: argparse.ArgumentParser, group=None) -> None:
    """rag / fid's flags, in `group` (default: a help section of their own on `p`)."""
    g = p.add_argument_group(TITLE) if group is None else group
    g.add_argument("--generator", metavar="DIR", help="rag / fid: the generator, a BART or T5 folder (instead of "
                                                       "--model)")
    g.add_argument("--marginalise", "--rag-kind", dest="marginalise", choices=("token", "sequence"), default="token",
                   help="rag: RAG-Token (a passage per answer token) or RAG-Sequence (one per answer; default: token)")
    g.add_argument("--freeze-retriever", action="store_true",
                   help="rag: keep the question encoder as it is (default: trained through the retrieval scores)")


def run_generative(args: argparse.Namespace) -> int:
    from bertforge.api import finetune
    from bertforge.errors import BertforgeError

    generator = args.generator or args.model
    if generator is None:
        raise BertforgeError(f"--task {args.task} needs --generator DIR (a BART or T5 folder)")
    if args.index is None:
        raise BertforgeError(f"--task {args.task} needs --index DIR (the index the passages are retrieved from)")
    options = dict(k=args.k or 5, max_source_len=args.max_seq_len, max_target_len=args.max_target_len,
                   train_limit=args.train_limit, warmup_ratio=args.warmup_ratio, weight_decay=args.weight_decay)
    if args.task == "rag":
        options.update(marginalise=args.marginalise, freeze_retriever=args.freeze_retriever)
    result = finetune(generator, args.data, task=args.task, out=args.out, train=args.train, epochs=args.epochs,
                      max_steps=args.max_steps, lr=args.lr, batch_size=args.batch_size, seed=args.seed,
                      precision=args.precision, overwrite=args.overwrite, device=args.device,
                      progress=args.progress, index=args.index, retriever=args.retriever, **options)
    print(f"{args.task}: trained {result.record['steps']} steps, last loss {result.metrics['loss']:.4f} -> "
          f"{result.out}")
    return 0
