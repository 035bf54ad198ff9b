"""`bertforge finetune | evaluate | predict`: fine-tune on a task, score a fine-tuned model, write predictions."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from bertforge.commands.needs import Need, index_needs, task_needs, tracker_needs
from bertforge.errors import BertforgeError
from bertforge.commands.options import (add_config_arg, add_overwrite_arg, add_progress_arg, add_seed_arg,
                                        add_tracking_args)
from bertforge.commands.data_options import add_column_args, add_data_args, add_input_split_args
from bertforge.device import INFERENCE_PRECISIONS, TRAINING_PRECISIONS, add_device_args
from bertforge.commands.bounds import COUNT, EPOCHS, FRACTION, LENGTH, NONNEG, POSITIVE, STEPS
from bertforge.commands.open_qa import TASK as OPEN_QA, add_open_qa_args, run_open_qa
from bertforge.commands.generative_qa import (TASKS as GENERATIVE, TITLE as GENERATIVE_TITLE, add_generative_args,
                                             run_generative)

TASK_HELP = ("sst2 cola mrpc stsb rte qnli mnli snli (GLUE readers), conll (CoNLL-2003 NER), squad squad2 (SQuAD "
             "v1.1/v2.0), swag (multiple choice); generic: classify regress (csv/tsv/jsonl with --text-col/"
             "--text-pair-col/--label-col), tag (CoNLL format), qa (SQuAD json), choice (SWAG csv or jsonl), "
             "seq2seq (source -> target text with a T5/BART model: jsonl/tsv/csv with --source-col/--target-col), "
             "open-qa (a reader over the top -k passages of --index for {\"question\", \"answer\": [...]} rows or "
             "SQuAD json)")


def _task_choices(train: bool = False) -> tuple[str, ...]:
    from bertforge.api.choices import TASKS  # torch-free: building the parser stays fast

    return TASKS + (OPEN_QA,) + (GENERATIVE if train else ())  # finetune trains an open-qa reader; evaluate scores retrieval and a reader


# finetune --help's sections, in the order shown: what every run gives first, then each task family's own flags
# (a flag is declared in the order that keeps the usage line and the parsed arguments as they were).
GROUPS = {
    "data": "model, task, data and output",
    "training": "training",
    "classify": "classification and regression (classify, regress and the GLUE tasks; --freeze also tag)",
    "tag": "token classification (tag, conll)",
    "qa": "extractive question answering (qa, squad, squad2)",
    "open-qa": "open-domain QA (open-qa: a reader over passages retrieved from --index)",
    "seq2seq": "seq2seq (a T5 or BART model; source -> target text)",
    "generative": GENERATIVE_TITLE,
    "tracking": "experiment tracking",
    "device": "device, precision and progress",
}
EXAMPLES = """examples:
  # your own CSV (a text and a label column), a model given as a folder or a Hugging Face Hub id:
  bertforge finetune --task classify --model sentence-transformers/all-MiniLM-L6-v2 --train my.csv --text-col text --label-col label --out runs/my
  # ... scored on a held-out file after every epoch; pairs of texts with --text-pair-col:
  bertforge finetune --task classify --model MODEL --train my.csv --eval my-dev.csv --out runs/my
  # a folder of splits (train.*, dev.*), or a Hub dataset with --data-config:
  bertforge finetune --task sst2 --model MODEL --data glue/SST-2 --out runs/sst2
  bertforge finetune --task sst2 --model MODEL --data nyu-mll/glue --data-config sst2 --out runs/sst2
  bertforge finetune --task squad --model MODEL --data squad --out runs/squad --epochs 2
  bertforge finetune --task conll --model MODEL --data conll2003 --out runs/ner --freeze --features concat_last4 --head bilstm"""


def _default(field: str):
    """FinetuneConfig's default of `field`: the one place a fine-tuning default is written (torch-free)."""
    from bertforge.api.choices import finetune_default

    return finetune_default(field)


def _data_args(p: argparse.ArgumentParser, train: bool, groups: dict[str, Any] | None = None) -> None:
    """The flags finetune and evaluate share; `groups`: finetune's help sections by GROUPS key (default: `p`)."""
    g = {key: p for key in GROUPS} if groups is None else groups
    g["data"].add_argument("--task", required=True, type=str.lower, choices=_task_choices(train), metavar="TASK",
                           help=TASK_HELP + ("" if train else f"; {OPEN_QA} scores retrieval, and a reader: "
                                             "--index, --questions"))
    add_data_args(g["data"], "a folder of splits (train.*, dev.* or validation.*, test.*: csv, tsv, jsonl, json, "
                  "parquet, or save_to_disk folders; e.g. glue/SST-2), a saved DatasetDict, a Hugging Face Hub "
                  "dataset id (with --data-config), or one file" + (
                      "; SQuAD without a train file: the dev file is split by article, first half train"
                      if train else ""))
    if train:
        g["data"].add_argument("--train", metavar="FILE", help="training file (instead of finding it in --data)")
    g["data"].add_argument("--eval", metavar="FILE", help="evaluation file (instead of finding it in --data)")
    add_column_args(g["classify"], "classify/regress: ")
    g["training"].add_argument("--max-seq-len", type=LENGTH, metavar="N",
                               help="tokens per input (default: 128; SQuAD 384; seq2seq sources 512)")
    g["seq2seq"].add_argument("--source-col", default="source", metavar="COL",
                              help="seq2seq: source column (default: source)")
    g["seq2seq"].add_argument("--target-col", default="target", metavar="COL",
                              help="seq2seq: target column (default: target)")
    g["seq2seq"].add_argument("--max-target-len", type=COUNT, default=_default("max_target_len"), metavar="N",
                              help="seq2seq: target tokens, and the most tokens evaluation generates (default: "
                                   f"{_default('max_target_len')})")
    g["seq2seq"].add_argument("--num-beams", type=COUNT, default=_default("num_beams"), metavar="N",
                              help=f"seq2seq: beam search width for evaluation (default: {_default('num_beams')}, greedy)")
    g["training"].add_argument("--eval-batch-size", type=COUNT, default=_default("eval_batch_size"), metavar="N",
                               help=f"evaluation batch size (default: {_default('eval_batch_size')})")
    g["training"].add_argument("--limit", type=COUNT, metavar="N", help="use only the first N evaluation examples")
    add_device_args(g["device"], None, compile="torch.compile the model (default: on when training on a GPU; falls "
                    "back to eager with one line)")
    add_progress_arg(g["device"])


def register(subparsers: argparse._SubParsersAction) -> None:
    ft = subparsers.add_parser(
        "finetune", help="fine-tune a model on a task",
        description="Fine-tune a pretrained model (a folder or a Hugging Face Hub id) on a task with the BERT "
                    "paper's recipe (AdamW, lr 3e-5, 10% warm-up then linear decay, batch 32, 3 epochs, weight decay "
                    "0.01), evaluating after every epoch; the best checkpoint ends in OUT itself (a Hugging Face "
                    "directory that BertFor<Task>.from_pretrained(OUT) loads), trainer checkpoints in "
                    "OUT/checkpoints.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = {key: ft.add_argument_group(title) for key, title in GROUPS.items()}
    g["data"].add_argument("--model", metavar="MODEL",
                           help="the pretrained model: a folder (config.json, weights, tokenizer) or a Hub id (e.g. "
                                "sentence-transformers/all-MiniLM-L6-v2, at --revision)")
    g["data"].add_argument("--out", required=True, metavar="DIR",
                           help="output folder: the final model itself (config.json, model.safetensors, tokenizer, "
                                "best_metrics.json), OUT/checkpoints, metrics.jsonl, results.json; with --runs "
                                "OUT/run-K")
    _data_args(ft, train=True, groups=g)
    train = g["training"]
    length = train.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=EPOCHS, metavar="N",
                        help="epochs (default: 3, or more on small data: at least 200 optimizer steps, evaluated "
                             "about 10 times)")
    length.add_argument("--max-steps", type=STEPS, metavar="N", help="optimizer steps instead of epochs")
    train.add_argument("--lr", type=POSITIVE, help="peak learning rate (default: 3e-5, try 2e-5..5e-5; seq2seq with "
                       "a T5 model: 1e-4)")
    train.add_argument("--batch-size", type=COUNT, default=_default("batch_size"), metavar="N",
                       help=f"training batch size (default: {_default('batch_size')})")
    train.add_argument("--warmup-ratio", type=FRACTION, default=_default("warmup_ratio"), metavar="R",
                       help=f"warm-up fraction (default: {_default('warmup_ratio')})")
    train.add_argument("--weight-decay", type=NONNEG, default=_default("weight_decay"), metavar="W",
                       help=f"AdamW weight decay (default: {_default('weight_decay')})")
    add_seed_arg(train, _default("seed"), "random seed of the first run")
    train.add_argument("--runs", type=COUNT, default=_default("runs"), metavar="N",
                       help="repeat with seeds SEED..SEED+N-1 and report median and spread of the main metric; OUT "
                            "gets the best run's model")
    train.add_argument("--train-limit", type=COUNT, metavar="N", help="use only the first N training examples")
    g["tag"].add_argument("--labels", type=lambda s: tuple(t for t in s.split(",") if t), default=(),
                          metavar="TYPE,...",
                          help="tagging: entity types the data may use besides conll's LOC, MISC, ORG, PER (with "
                               "--task tag: the only ones; without: any)")
    cls = g["classify"]
    cls.add_argument("--method", default="finetune", choices=("finetune", "frozen-head"),
                     help="finetune: train the whole model (default); frozen-head: a logistic regression on the "
                          "frozen sentence embeddings (classification; for a few hundred labelled rows, in seconds)")
    cls.add_argument("--freeze", action="store_true",
                     help="feature-based mode: frozen encoder, only the head trains (classify/regress/tag)")
    cls.add_argument("--features", default="concat_last4",
                     choices=("last", "second_last", "sum_last4", "concat_last4", "weighted"),
                     help="with --freeze: which hidden states feed the head (default: concat_last4; weighted = "
                          "learned softmax mix of all layers)")
    cls.add_argument("--head", default="linear", choices=("linear", "bilstm"),
                     help="with --freeze: head (default: linear)")
    add_device_args(g["device"], TRAINING_PRECISIONS, None, "bf16 autocast or fp32", device=False)
    train.add_argument("--no-group-by-length", dest="group_by_length", action="store_false",
                       help="random batches instead of length-grouped ones (more padding)")
    train.add_argument("--resume", action="store_true",
                       help="continue an interrupted fine-tune in OUT (refused if an option it depends on changed; "
                            "--epochs, --max-steps, --eval-batch-size and --device may change)")
    add_overwrite_arg(train, resume=True)
    g["qa"].add_argument("--doc-stride", type=COUNT, default=_default("doc_stride"), metavar="N",
                         help=f"SQuAD window stride (default: {_default('doc_stride')})")
    g["qa"].add_argument("--max-query-length", type=COUNT, default=_default("max_query_length"), metavar="N",
                         help=f"SQuAD: question tokens kept (default: {_default('max_query_length')})")
    oq = g["open-qa"]
    oq.add_argument("--index", metavar="DIR", help="open-qa: the index the passages are retrieved from (frozen)")
    oq.add_argument("--retriever", metavar="R", help="open-qa: the question encoder of a dense index (default: the "
                    "one the index records), or bm25 for a sparse index")
    oq.add_argument("-k", "--top-k", dest="k", type=COUNT, metavar="K",
                    help="open-qa: passages read per question (default: 8; rag, fid: 5)")
    oq.add_argument("--max-answer-len", type=COUNT, default=30, metavar="N",
                    help="open-qa: tokens an answer span may have (default: 30)")
    oq.add_argument("--train-retriever", action="store_true",
                    help="open-qa: train the question encoder with the reader (ORQA / REALM; the index stays frozen; "
                         "-k default 5); OUT/question/ holds it, and ask / evaluate search with it")
    add_generative_args(ft, g["generative"])
    add_tracking_args(g["tracking"])
    add_config_arg(ft)
    ft.set_defaults(func=run_finetune, needs=_finetune_needs)

    ev = subparsers.add_parser("evaluate", help="score a fine-tuned model on a task's data (JSON metrics)",
                               description="Evaluate a fine-tuned model directory (a finetune OUT folder) and print "
                                           "the metrics as JSON.")
    ev.add_argument("--model", metavar="DIR", help="fine-tuned model directory (every task but open-qa)")
    _data_args(ev, train=False)
    add_open_qa_args(ev)
    ev.add_argument("--split", default="dev", choices=("dev", "test"),
                    help="which file of --data to score: dev (dev/valid/validation) or test (default: dev)")
    add_device_args(ev, INFERENCE_PRECISIONS, "fp32", "bf16 or fp16 (GPU only) autocast", device=False)
    ev.set_defaults(func=run_evaluate, needs=lambda args: (*task_needs(args.task), *_index_needs(args)))

    pr = subparsers.add_parser("predict", help="predictions of a fine-tuned model as JSONL",
                               description="Predict with a fine-tuned model; the task is read from its config.json. "
                                           "Input: a table (csv, tsv, jsonl, json, parquet, a saved or Hub dataset) "
                                           "with the text columns (classify, regress), 'tokens' (tag), 'question' and "
                                           "'context' (qa), 'context' and 'endings' or SWAG's columns (choice); a "
                                           "text file (one input a line), a CoNLL file or a SQuAD json. One record "
                                           "per input row, in order (docs/data.md).")
    pr.add_argument("--model", required=True, metavar="DIR", help="fine-tuned model directory")
    pr.add_argument("--input", required=True, metavar="PATH",
                    help="inputs to predict: a csv / tsv / jsonl / json / parquet file (a header or field names), a "
                         "text file (one input a line), a save_to_disk folder or a Hub dataset id (with "
                         "--data-split / --data-config)")
    add_input_split_args(pr)
    add_column_args(pr, "classify/regress: ", label=False)
    pr.add_argument("--out", metavar="FILE", help="write JSONL here (default: stdout)")
    pr.add_argument("--batch-size", type=COUNT, default=64, metavar="N", help="batch size (default: 64)")
    add_device_args(pr, INFERENCE_PRECISIONS, "fp32", "bf16 or fp16 (GPU only) autocast", compile="torch.compile the model (falls back to eager with one line where it cannot)")
    add_progress_arg(pr)
    pr.set_defaults(func=run_predict, needs=())


def _finetune_needs(args: argparse.Namespace) -> tuple[Need, ...]:
    return (*task_needs(args.task), *tracker_needs(args), *_index_needs(args))


def _index_needs(args: argparse.Namespace) -> tuple[Need, ...]:
    """The tasks that retrieve (open-qa, rag, fid): what searching their --index imports."""
    return index_needs(getattr(args, "index", None), f"--task {args.task}")


def _options(args: argparse.Namespace) -> dict:
    """The options finetune and evaluate share, by their API names."""
    return dict(text_col=args.text_col, text_pair_col=args.text_pair_col, label_col=args.label_col,
                data_config=args.data_config, eval=args.eval, max_seq_len=args.max_seq_len, device=args.device,
                compile=args.compile, progress=args.progress, source_col=args.source_col,
                target_col=args.target_col, max_target_len=args.max_target_len, num_beams=args.num_beams)


def run_finetune(args: argparse.Namespace) -> int:
    from bertforge.api import finetune

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.task in GENERATIVE:
        return run_generative(args)
    if args.model is None:
        raise BertforgeError("finetune: give --model DIR")
    if args.task == OPEN_QA:
        return _run_open_qa(args)
    if args.data is None and args.train is None:
        raise BertforgeError("give --data DIR (or --train FILE [--eval FILE])")
    result = finetune(args.model, args.data, task=args.task, out=args.out, train=args.train, epochs=args.epochs,
                      max_steps=args.max_steps, lr=args.lr, batch_size=args.batch_size, seed=args.seed,
                      runs=args.runs, precision=args.precision, resume=args.resume, overwrite=args.overwrite,
                      report_to=args.report_to, logging_dir=args.logging_dir, eval_batch_size=args.eval_batch_size,
                      eval_limit=args.limit, warmup_ratio=args.warmup_ratio, weight_decay=args.weight_decay,
                      train_limit=args.train_limit, labels=args.labels, freeze=args.freeze, features=args.features,
                      head=args.head, group_by_length=args.group_by_length, doc_stride=args.doc_stride,
                      max_query_length=args.max_query_length, method=args.method, **_options(args))
    s = result.summary
    # the precision says itself: without --precision it is bf16 on hardware that computes bf16 natively
    how = f"{result.precision}{'' if args.precision else ', the default here'}"
    if s:
        spread = f" (min {s['min']:.4f}, max {s['max']:.4f}, std {s['std']:.4f}, {s['n']} runs)" if s["n"] > 1 else ""
        print(f"{args.task}: best {result.main_metric} median {s['median']:.4f}{spread}, {how} -> {result.out}")
    else:
        print(f"{args.task}: trained (no evaluation data), {how} -> {result.out}")
    return 0


def _run_open_qa(args: argparse.Namespace) -> int:
    from bertforge.api import finetune

    if args.index is None:
        raise BertforgeError("--task open-qa needs --index DIR (the index the passages are retrieved from)")
    result = finetune(args.model, args.data, task=args.task, out=args.out, train=args.train, eval=args.eval,
                      epochs=args.epochs, max_steps=args.max_steps, lr=args.lr, batch_size=args.batch_size,
                      seed=args.seed, precision=args.precision, resume=args.resume, overwrite=args.overwrite,
                      report_to=args.report_to, logging_dir=args.logging_dir, device=args.device,
                      progress=args.progress, index=args.index, retriever=args.retriever,
                      k=args.k or (5 if args.train_retriever else 8), train_retriever=args.train_retriever,
                      max_answer_len=args.max_answer_len,
                      max_seq_len=args.max_seq_len, eval_batch_size=args.eval_batch_size, eval_limit=args.limit,
                      train_limit=args.train_limit, warmup_ratio=args.warmup_ratio, weight_decay=args.weight_decay,
                      compile=args.compile, group_by_length=args.group_by_length)
    best = result.metrics.get(result.main_metric)
    got = f"best {result.main_metric} {best:.2f}" if best is not None else "trained (no evaluation questions)"
    print(f"open-qa: {got} -> {result.out}")
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    from bertforge.api import evaluate
    from bertforge.errors import BertforgeError

    if args.task == OPEN_QA:
        return run_open_qa(args)
    if not args.model:
        raise BertforgeError(f"evaluate --task {args.task}: give --model")
    if args.data is None and getattr(args, "eval", None) is None:
        raise BertforgeError("give --data DIR or --eval FILE")

    metrics = evaluate(args.model, args.data, task=args.task, split=args.split, batch_size=args.eval_batch_size,
                       limit=args.limit, precision=args.precision, **_options(args))
    print(json.dumps(metrics, indent=2, sort_keys=True))
    return 0


def run_predict(args: argparse.Namespace) -> int:
    from bertforge.api import predict
    from bertforge.io.write import prepare_output_file, write_errors

    if args.out:
        prepare_output_file(args.out, what="--out")  # before the model is loaded and every input predicted
    records = predict(args.model, args.input, batch_size=args.batch_size, device=args.device, progress=args.progress,
                      precision=args.precision, compile=args.compile, text_col=args.text_col,
                      text_pair_col=args.text_pair_col, data_split=args.data_split, data_config=args.data_config,
                      out=args.out or None)
    if args.out:
        print(f"{len(records)} predictions -> {args.out}")
        return 0
    with write_errors("<stdout>"):  # flushed here, so a full disk is reported now, not lost at exit
        sys.stdout.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        sys.stdout.flush()
    return 0
