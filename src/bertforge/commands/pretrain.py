"""`bertforge prepare`, `bertforge pretrain`, `bertforge ablate`: the pretraining verbs."""
from __future__ import annotations

import argparse
from pathlib import Path

from bertforge.commands.needs import Need, of_extra, tracker_needs
from bertforge.commands.options import (add_config_arg, add_overwrite_arg, add_progress_arg, add_seed_arg,
                                        add_tracking_args, device_of, tracking)
from bertforge.commands.data_options import add_corpus_column_arg
from bertforge.device import TRAINING_PRECISIONS, add_device_args
from bertforge.commands.bounds import COUNT, FRACTION, LENGTH, OPEN_FRACTION, POSITIVE, STEPS
from bertforge.errors import BertforgeError

ABLATE_OUT = "runs/ablation"
RECIPE_HELP = ("bert = MLM+NSP, segment pairs, static masks (WordPiece); roberta = MLM, dynamic masks, full "
               "sentences (byte-level BPE); albert = MLM+SOP, E=128, all layers shared (Unigram); spanbert = span "
               "masking + span-boundary objective; electra = replaced-token detection with a 1/4-size generator; "
               "structbert = MLM + word-structural (shuffled trigrams) + sentence-structural (next / previous / "
               "random) objectives; xlnet = permutation LM with two-stream relative attention (last 1/6 of each "
               "factorisation order predicted); gpt = left-to-right LM (GPT-2 layout decoder) on packed text, "
               "GPT-2 byte-level BPE; the context is --seq-len; "
               "modern = ModernBERT: pre-norm, rotary, GeGLU, local/global attention, MLM only at 30%, packed rows, "
               "warm-up/stable/1-sqrt-decay schedule (BPE); deberta-v3 = replaced-token detection on a DeBERTa "
               "encoder (disentangled relative attention), a half-depth generator, gradient-disentangled "
               "embedding sharing (Unigram in DeBERTa's layout); xlm-roberta = RoBERTa's recipe on an XLM-R "
               "encoder, Unigram in XLM-R's layout (a multilingual corpus); ict = the Inverse Cloze Task (ORQA): a "
               "retriever's towers learn to find a sentence's block of text (removed from it nine times in ten) "
               "among the batch's blocks; OUT is a retriever folder for `bertforge retriever train --model`; "
               "realm = REALM: a salient span (a name, a date) masked and predicted from documents retrieved out "
               "of --knowledge, the reader and the retriever's towers trained together. --family puts a recipe's objective on "
               "another family (e.g. --recipe electra on a DeBERTa encoder)")


def register(subparsers: argparse._SubParsersAction) -> None:
    from bertforge.api.choices import INPUT_FORMATS, MASKINGS, OBJECTIVES, RECIPES, SCHEDULES, SIZE_NAMES

    prep = subparsers.add_parser(
        "prepare", help="tokenise a corpus into memory-mapped shards",
        description="Tokenise a corpus (.txt/.txt.gz, .jsonl, tables: .csv/.tsv/.json/.parquet and save_to_disk "
                    "folders, one document per row; folders and globs) into memory-mapped shards for "
                    "`bertforge pretrain --data`.")
    prep.add_argument("--corpus", nargs="+", required=True, metavar="PATH", help="text files, folders or globs")
    add_corpus_column_arg(prep)
    prep.add_argument("--tokenizer", required=True, metavar="DIR", help="tokenizer directory (or tokenizer.json)")
    prep.add_argument("--out", required=True, metavar="DIR", help="output directory for the shards")
    prep.add_argument("--workers", type=COUNT, metavar="N",
                      help="tokenising processes (default: one per core; a small corpus in this one)")
    prep.add_argument("--doc-boundary", choices=("blank", "file"), default="blank",
                      help="a blank line ends a document (default), or one document per file")
    prep.add_argument("--heldout-fraction", type=FRACTION, default=0.05, metavar="F",
                      help="share of documents held out for evaluation (default: 0.05)")
    add_overwrite_arg(prep)
    add_progress_arg(prep)
    prep.set_defaults(func=run_prepare, needs=())

    pre = subparsers.add_parser(
        "pretrain", help="pretrain a BERT-family model or a GPT decoder (default: a ~5 minute demo on the stdlib docs)",
        description="Pretrain from scratch or continue a checkpoint (--init-from). With no --corpus the corpus is "
                    "the Python standard library's own documentation (docstrings + pydoc topics), a WordPiece "
                    "tokenizer of 8k is trained, and a small model trains for a few minutes.",
        epilog="recipes: " + RECIPE_HELP)
    _add_model_args(pre, RECIPES, SIZE_NAMES, OBJECTIVES, MASKINGS, INPUT_FORMATS, SCHEDULES)
    pre.add_argument("--corpus", nargs="+", metavar="PATH",
                     help="text files (.txt, .jsonl, .csv, .tsv, .json, .parquet, save_to_disk folders), folders or "
                          "globs (default: stdlib docs)")
    add_corpus_column_arg(pre)
    pre.add_argument("--data", metavar="DIR", help="shards from `bertforge prepare` (instead of --corpus)")
    pre.add_argument("--tokenizer", metavar="DIR", help="use this tokenizer instead of training one")
    pre.add_argument("--vocab-size", type=COUNT, metavar="N",
                     help="vocabulary of the trained tokenizer (default: 8192 for stdlib docs, else 30522)")
    pre.add_argument("--max-steps", type=STEPS, metavar="N", help="optimizer steps")
    pre.add_argument("--time-budget", metavar="DUR",
                     help="wall-clock training budget, e.g. 90s, 30m, 1h (default: 3m when no --max-steps)")
    pre.add_argument("--out", metavar="DIR", help="output directory (default: runs/pretrain-RECIPE)")
    pre.add_argument("--resume", action="store_true",
                     help="continue the run in --out from its latest checkpoint (refused if an option it depends on, "
                          "or its data, changed; --max-steps, --time-budget, --threads, --log-every, --save-every, "
                          "--workers may change)")
    add_overwrite_arg(pre, resume=True)
    pre.add_argument("--init-from", metavar="DIR",
                     help="continue pretraining this checkpoint with its own tokenizer (domain-adaptive)")
    pre.add_argument("--save-every", type=COUNT, metavar="N", help="checkpoint every N steps (default: at the end)")
    realm = pre.add_argument_group("--recipe realm (retrieval-augmented MLM)")
    realm.add_argument("--knowledge", metavar="PASSAGES",
                       help="the knowledge corpus retrieved from (id / title / text passages: jsonl, csv, tsv, ...); "
                            "without --corpus its own sentences are the training text")
    realm.add_argument("--retriever", metavar="DIR",
                       help="initialise the query and document towers from this retriever (e.g. a --recipe ict "
                            "run; default: the reader's initial encoder)")
    realm.add_argument("--refresh-every", type=COUNT, default=500, metavar="N",
                       help="re-embed the knowledge corpus with the current document tower every N steps "
                            "(default: 500)")
    realm.add_argument("-k", dest="realm_k", type=COUNT, default=8, metavar="K",
                       help="documents retrieved per sentence, the null document besides (default: 8)")
    realm.add_argument("--projection-dim", type=COUNT, default=128, metavar="D",
                       help="the towers' vector size ([CLS] projected linearly; default: 128)")
    realm.add_argument("--ner-model", metavar="DIR",
                       help="find the salient spans with this NER model (`bertforge finetune --task conll`) plus a "
                            "date pattern (default: the date pattern and a capitalisation heuristic)")
    pre.add_argument("--log-every", type=COUNT, default=10, metavar="N", help="log every N steps (default: 10)")
    pre.add_argument("--eval-batches", type=COUNT, default=20, metavar="N", help="held-out batches (default: 20)")
    pre.add_argument("--heldout", nargs="+", metavar="NAME=PATH", default=[],
                     help="more held-out corpora, each scored by masked-token accuracy at the end like the held-out "
                          "split (e.g. one per language: --heldout de=de.txt fr=fr.txt); keep them out of --corpus")
    pre.add_argument("--heldout-fraction", type=FRACTION, default=None, metavar="F",
                     help="share of documents held out for evaluation (default: what --data's manifest says; "
                          "0.05 for shards prepared here)")
    pre.add_argument("--workers", type=COUNT, metavar="N",
                      help="tokenising processes (default: one per core; a small corpus in this one)")
    pre.add_argument("--threads", type=COUNT, metavar="N",
                     help="torch threads per process (default: the cores divided among the processes; lower it on a machine shared with other jobs)")
    add_device_args(pre, None, compile="torch.compile the model (default: on when training on a GPU; falls back to eager with one line)")
    add_progress_arg(pre)
    add_tracking_args(pre)
    add_config_arg(pre)
    pre.set_defaults(func=run_pretrain, needs=tracker_needs)

    abl = subparsers.add_parser(
        "ablate", help="re-run the BERT, RoBERTa, ALBERT, ELECTRA, SpanBERT and DeBERTa-v3 papers' ablation tables "
                       "at equal compute (--table), or compare pretraining arms by held-out MLM (--arms)",
        description="--table bert|roberta|albert|electra|spanbert|deberta-v3|all: re-run an ablation table of the "
                    "BERT, RoBERTa, ALBERT, ELECTRA, SpanBERT or DeBERTa-v3 paper: pretrain every arm of the "
                    "paper's table for "
                    "the same --budget (or the same FLOPs where the paper compared so), fine-tune each on a fixed "
                    "downstream suite (SST-2, MRPC, RTE, STS-B, CoNLL; SQuAD for spanbert) from --downstream, "
                    "repeat over --seeds, and write TABLE.md / .json / .png with the seed spread and a verdict per "
                    "claim (reproduced / not reproduced / inconclusive). The same command again continues a "
                    "stopped table. --table realm: REALM and RAG against the same encoder and generator without "
                    "retrieval, on SQuAD dev paragraphs and questions (held-out MLM accuracy, EM). Without --table: train each of --arms (NSP vs SOP vs SSO vs none; static vs "
                    "dynamic; MLM vs ELECTRA vs XLNet; token vs span masking; ...) for the same budget and compare "
                    "held-out MLM accuracy (ablation.md, .json, .png). --list shows the tables and arms.")
    abl.add_argument("--table", nargs="+", metavar="NAME",
                     help="bert, roberta, albert, electra, spanbert, deberta-v3, realm or all (several allowed)")
    abl.add_argument("--steps", type=STEPS, metavar="N",
                     help="--table: the same number of pretraining steps per arm instead of the same --budget")
    abl.add_argument("--seeds", type=COUNT, default=2, metavar="N", help="--table: seeds per arm (default: 2)")
    abl.add_argument("--downstream", default=str(Path("..") / "shared" / "data"), metavar="DIR",
                     help="--table: folder with glue/SST-2, glue/MRPC, glue/RTE, glue/STS-B, conll2003, squad "
                          "(default: ../shared/data)")
    abl.add_argument("--tasks", nargs="+", metavar="TASK",
                     help="--table: downstream tasks instead of each table's suite (sst2 mrpc rte stsb conll squad)")
    abl.add_argument("--finetune-epochs", type=POSITIVE, default=3.0, metavar="N", help="--table: (default: 3)")
    abl.add_argument("--train-limit", type=COUNT, metavar="N",
                     help="--table: training examples per task (default: the suite's slice, 2,000 for most)")
    abl.add_argument("--threads", type=COUNT, metavar="N", help="torch threads (default: all cores)")
    abl.add_argument("--retriever", metavar="DIR",
                     help="--table realm: the encoder that indexes the knowledge corpus and embeds the RAG arms' "
                          "questions (default: each seed's REALM towers)")
    add_overwrite_arg(abl, without="without it, --table continues the table in --out")
    abl.add_argument("--corpus", nargs="+", metavar="PATH", help="corpus (default: stdlib docs)")
    abl.add_argument("--arms", nargs="+", metavar="ARM",
                     help="subset of arms (default: all; see `bertforge ablate --list`)")
    abl.add_argument("--list", action="store_true", help="list the arms and exit")
    abl.add_argument("--size", choices=SIZE_NAMES, default="bert-mini", help="model size (default: bert-mini)")
    abl.add_argument("--seq-len", type=LENGTH, default=128, metavar="N")
    abl.add_argument("--batch-size", type=COUNT, default=32, metavar="N")
    abl.add_argument("--budget", default="2m", metavar="DUR", help="training wall clock per arm (default: 2m)")
    abl.add_argument("--vocab-size", type=COUNT, metavar="N", help="tokenizer vocabulary (default: 8192)")
    add_device_args(abl, TRAINING_PRECISIONS, None)
    add_seed_arg(abl)
    abl.add_argument("--out", default=ABLATE_OUT, metavar="DIR",
                     help="output directory (default: runs/ablation; with --table: runs/ablation-tables)")
    abl.add_argument("--report-to", action="append", metavar="NAME",
                     help="--arms: experiment trackers for each arm's pretraining (OUT/arms/ARM): tensorboard, "
                          "mlflow or none (default: none; several comma-separated or repeated)")
    add_config_arg(abl)
    abl.set_defaults(func=run_ablate, needs=_ablate_needs)


def _ablate_needs(args: argparse.Namespace) -> tuple[Need, ...]:
    """--table fine-tunes its suite (the tasks' metrics) and tests the seeds' difference (scipy)."""
    return (*tracker_needs(args), *(of_extra("tasks", "ablate --table") if args.table and not args.list else ()))


def _add_model_args(p, recipes, sizes, objectives, maskings, formats, schedules) -> None:
    from bertforge.api.choices import DEFAULT_RECIPE as DEFAULT, EMBEDDING_SHARING, FAMILIES, MODEL_TYPES

    rtd = ", ".join(name for name, fam in FAMILIES.items() if "rtd" in fam.head_classes)
    pooled = ", ".join(name for name, fam in FAMILIES.items() if "pretraining" in fam.head_classes)
    p.add_argument("--recipe", choices=list(recipes), default=DEFAULT, help=f"pretraining recipe (default: {DEFAULT})")
    p.add_argument("--family", choices=MODEL_TYPES, metavar="FAMILY",
                   help="the model family instead of the recipe's (its objective must suit it: replaced-token "
                        f"detection on {rtd}; sentence tasks on {pooled}; ...): {', '.join(MODEL_TYPES)}")
    p.add_argument("--embedding-sharing", choices=EMBEDDING_SHARING,
                   help="replaced-token detection: what generator and discriminator share: none, shared (the "
                        "embedding module, ELECTRA's default) or gdes (gradient-disentangled: the discriminator "
                        "reads stop_gradient(generator tables) + its own zero-initialised ones, deberta-v3's)")
    p.add_argument("--size", choices=sizes, default=None,
                   help="model size (default: bert-mini; bert-tiny for the built-in demo corpus)")
    p.add_argument("--objective", choices=objectives, help="override the recipe's objective")
    p.add_argument("--masking", choices=maskings, help="override the recipe's masking unit")
    dyn = p.add_mutually_exclusive_group()
    dyn.add_argument("--dynamic", dest="dynamic", action="store_true", default=None, help="re-mask every epoch")
    dyn.add_argument("--static", dest="dynamic", action="store_false", help="masks fixed at preparation")
    p.add_argument("--dupe-factor", type=COUNT, metavar="N", help="static masking: masked copies of the data")
    p.add_argument("--input-format", choices=formats, help="override the recipe's input format")
    p.add_argument("--plm-k", type=COUNT, metavar="K",
                   help="xlnet: predict the last 1/K of each factorisation order (default: 6)")
    p.add_argument("--mask-prob", type=OPEN_FRACTION, metavar="P",
                   help="share of tokens to predict (default: the recipe's; 0.15, modern 0.3); t5 / bart: the share "
                        "of noise (0.15 / 0.3)")
    p.add_argument("--schedule", choices=schedules,
                   help="learning-rate schedule: linear = warm-up + linear decay (default), wsd = warm-up, stable, "
                        "1-sqrt decay over the last 20%% (modern)")
    p.add_argument("--seq-len", type=LENGTH, metavar="N",
                   help="sequence length (default: 128; 64 for the built-in demo corpus)")
    p.add_argument("--batch-size", type=COUNT, default=32, metavar="N", help="batch size per process (default: 32)")
    p.add_argument("--lr", type=POSITIVE,
                   help="peak learning rate (default: by size, 1e-3 for bert-tiny/mini down to 1e-4 for "
                        "bert-base/large; twice that for electra and modern)")
    add_device_args(p, TRAINING_PRECISIONS, None, device=False)
    add_seed_arg(p)


def run_prepare(args: argparse.Namespace) -> int:
    from bertforge.api import prepare

    m = prepare(args.corpus, tokenizer=args.tokenizer, out=args.out, text_col=args.text_col, workers=args.workers,
                doc_boundary=args.doc_boundary, heldout_fraction=args.heldout_fraction, progress=args.progress,
                overwrite=args.overwrite)
    print(f"prepared {m['num_tokens']:,} tokens, {m['num_sentences']:,} sentences, {m['num_documents']:,} "
          f"documents in {len(m['shards'])} shard(s) ({m['stats']['seconds']:.1f} s) -> {args.out}")
    return 0


def starting_line(args: argparse.Namespace) -> str:
    """The line printed at once, before torch loads and the corpus, tokenizer and shards are made (seconds)."""
    source = ("--data " + str(args.data) if args.data else f"{len(args.corpus)} corpus path(s)" if args.corpus
              else "the built-in demo corpus (the Python standard library's documentation)")
    length = (f"{args.max_steps} steps" if args.max_steps else "") + (" or " if args.max_steps and args.time_budget
                                                                      else "") + (args.time_budget or "")
    return (f"pretrain: {args.recipe} on {source}, {length or '3m'} of training -> "
            f"{args.out or 'runs/pretrain-' + args.recipe}; preparing (torch, corpus, tokenizer, shards) ...")


def run_pretrain(args: argparse.Namespace) -> int:
    from bertforge.api import pretrain

    print(starting_line(args), flush=True)
    pretrain(args.corpus, out=args.out, recipe=args.recipe, size=args.size, seq_len=args.seq_len,
             batch_size=args.batch_size, max_steps=args.max_steps, time_budget=args.time_budget, lr=args.lr,
             tokenizer=args.tokenizer, vocab_size=args.vocab_size, data=args.data, init_from=args.init_from,
             text_col=args.text_col, seed=args.seed, device=args.device, precision=args.precision,
             compile=args.compile, progress=args.progress, report_to=args.report_to, logging_dir=args.logging_dir,
             resume=args.resume, overwrite=args.overwrite, objective=args.objective, masking=args.masking,
             dynamic=args.dynamic, input_format=args.input_format, dupe_factor=args.dupe_factor,
             plm_k=args.plm_k, mask_prob=args.mask_prob, schedule=args.schedule,
             heldout_fraction=args.heldout_fraction, eval_batches=args.eval_batches, log_every=args.log_every,
             save_every=args.save_every, workers=args.workers, threads=args.threads, family=args.family,
             embedding_sharing=args.embedding_sharing, heldout=args.heldout,
             **({"knowledge": args.knowledge, "retriever": args.retriever, "refresh_every": args.refresh_every,
                 "realm_k": args.realm_k, "projection_dim": args.projection_dim, "ner_model": args.ner_model}
                if args.recipe == "realm" else {}))
    return 0


def run_ablate(args: argparse.Namespace) -> int:
    from bertforge.api.choices import ablation_listing

    if args.list:
        print(ablation_listing())
        return 0
    report_to = tracking(args)["report_to"]
    device_of(args)  # a device that is not there: one line before the arms' tokenizer and data are made
    if args.table:
        if report_to:
            raise BertforgeError("--report-to: with --arms (or no --table) only; a --table run reports in TABLE.md")
        if args.arms:
            raise BertforgeError("--arms and --table: a table fixes its arms; give one of them")
    from bertforge.api import ablate

    result = ablate(args.corpus, out=None if args.out == ABLATE_OUT else args.out, table=args.table, arms=args.arms,
                    size=args.size, seq_len=args.seq_len, batch_size=args.batch_size, budget=args.budget,
                    vocab_size=args.vocab_size, steps=args.steps, seeds=args.seeds, downstream=args.downstream,
                    tasks=args.tasks, finetune_epochs=args.finetune_epochs, train_limit=args.train_limit,
                    threads=args.threads, precision=args.precision, device=args.device, seed=args.seed,
                    report_to=report_to, overwrite=args.overwrite, retriever=args.retriever)
    out = result["out"]
    for name, rep in result.get("tables", {}).items():
        for c in rep["claims"]:
            why = f" ({c['why']})" if c.get("why") else ""
            print(f"{name}: {c['claim']}: {c['verdict']}{why}")
        print(f"wrote {out / (name + '.md')}, {name}.json" + (f", {name}.png" if (out / f"{name}.png").is_file()
                                                              else ""))
    return 0
