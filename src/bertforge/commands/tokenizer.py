"""`bertforge tokenizer train`: train a WordPiece / byte-level BPE (RoBERTa, GPT-2) / Unigram tokenizer on text files."""
from __future__ import annotations

import argparse
import time

from bertforge.commands.bounds import COUNT, COUNT0
from bertforge.commands.options import add_overwrite_arg, add_progress_arg
from bertforge.commands.data_options import add_corpus_column_arg
from bertforge.api.choices import LAYOUTS, PLAIN_LAYOUTS, TOKENIZER_KINDS

KINDS_HELP = ("kinds: wordpiece = BERT (## continuation, [CLS]/[SEP]/[MASK]); bpe = RoBERTa byte-level BPE "
              "(<s>/</s>/<mask>, always cased); unigram = ALBERT (▁ word starts); gpt2 = GPT-2 byte-level BPE "
              "(one special token, <|endoftext|>; nothing added around a text; always cased)")


def _family_kinds() -> str:
    """The other kinds, the families' own layouts, each as its transformers class and its special tokens' ids."""
    described = []
    for kind, layout in LAYOUTS.items():
        if kind in PLAIN_LAYOUTS or f"{kind} =" in KINDS_HELP:
            continue
        first, last = layout.special_order()
        ids = f"{' '.join(first)} at 0-{len(first) - 1}" + (f", {' '.join(last)} last" if last else "") \
            + (f", {layout.sentinels} sentinels last" if layout.sentinels else "")
        described.append(f"{kind} = {layout.hf_class} ({layout.model}; {ids}"
                         + ("; always cased)" if layout.cased else ")"))
    return "; ".join(described)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("tokenizer", help="train tokenizers",
                                   description="Train tokenizers for the BERT family.")
    verbs = parser.add_subparsers(dest="tokenizer_command", metavar="VERB")
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])

    train = verbs.add_parser(
        "train", help="train a tokenizer on text files",
        description="Train a tokenizer on plain text (.txt or .txt.gz, documents separated by blank lines; .jsonl "
                    "with a 'text' field; tables (.csv, .tsv, .json, .parquet, save_to_disk folders) with a text "
                    "column, a document a row; Project Gutenberg headers and footers are skipped) and save it in the "
                    "Hugging Face layout (tokenizer.json, tokenizer_config.json, special_tokens_map.json, and "
                    "vocab.txt for WordPiece). The same corpus and options always give the same files.",
        epilog=f"{KINDS_HELP}; {_family_kinds()}.")
    train.add_argument("--corpus", nargs="+", required=True, metavar="PATH",
                       help="text files (.txt, .jsonl, .csv, .tsv, .json, .parquet, save_to_disk folders), folders "
                            "(every such file inside) or glob patterns")
    add_corpus_column_arg(train)
    train.add_argument("--kind", choices=TOKENIZER_KINDS, default="wordpiece", help="tokenizer model (default: wordpiece)")
    train.add_argument("--vocab-size", type=COUNT, default=30522, metavar="N", help="vocabulary size (default: 30522)")
    train.add_argument("--out", required=True, metavar="DIR", help="directory to write the tokenizer to")
    train.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=True,
                       help="lower-case and strip accents (wordpiece, unigram; default: on; bpe is always cased)")
    train.add_argument("--min-frequency", type=COUNT0, default=2, metavar="N",
                       help="minimum pair/word frequency for a merge (wordpiece, bpe; default: 2)")
    train.add_argument("--model-max-length", type=COUNT, default=512, metavar="N",
                       help="model_max_length written to tokenizer_config.json (default: 512)")
    train.add_argument("--workers", type=COUNT, default=1, metavar="N",
                       help="processes counting words of a large wordpiece corpus (default: 1)")
    add_overwrite_arg(train)
    add_progress_arg(train)
    train.set_defaults(func=run_train, needs=())


def run_train(args: argparse.Namespace) -> int:
    """Train, save and print a one-line summary."""
    from bertforge.api import train_tokenizer
    from bertforge.api.choices import corpus_file_list

    start = time.perf_counter()
    files = corpus_file_list(args.corpus)  # a missing file or a pattern matching nothing is named here
    tok = train_tokenizer(args.corpus, out=args.out, kind=args.kind, vocab_size=args.vocab_size,
                          lowercase=args.lowercase, min_frequency=args.min_frequency,
                          model_max_length=args.model_max_length, workers=args.workers, text_col=args.text_col,
                          progress=args.progress, overwrite=args.overwrite)
    seconds = time.perf_counter() - start
    print(f"trained {args.kind} tokenizer: vocab {tok.vocab_size}, {len(files)} file(s), {seconds:.1f} s -> {args.out}")
    return 0
