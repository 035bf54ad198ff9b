"""`bertforge tokenizer train`: train a WordPiece / byte-level BPE (RoBERTa, GPT-2) / Unigram tokenizer on text files."""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from bertforge.commands.bounds import COUNT, COUNT0
from bertforge.data.corpus import find_files, iter_texts
from bertforge.errors import BertforgeError
from bertforge.tokenization.tokenizer import TOKENIZER_KINDS
from bertforge.tokenization import Tokenizer
from bertforge.families import FAMILIES

# the families whose tokenizer has a SentencePiece layout of its own (special tokens, ids, pipeline)
LAYOUT_FAMILIES = tuple(name for name, fam in FAMILIES.items() if fam.tokenizer is not None)


def _layouts() -> str:
    """Each family layout in a few words, for the help text."""
    return "; ".join(f"{name} = {' '.join(lay.first)} at 0-{len(lay.first) - 1}, {' '.join(lay.last)} last"
                     + (", always cased" if lay.cased else "")
                     for name, lay in ((n, FAMILIES[n].tokenizer) for n in LAYOUT_FAMILIES))


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("tokenizer", help="train tokenizers",
                                   description="Train tokenizers for the BERT family.")
    verbs = parser.add_subparsers(dest="tokenizer_command", metavar="VERB")
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])

    train = verbs.add_parser(
        "train", help="train a tokenizer on text files",
        description="Train a tokenizer on plain text (.txt or .txt.gz, documents separated by blank lines; .jsonl "
                    "with a 'text' field; Project Gutenberg headers and footers are skipped) and save it in the "
                    "Hugging Face layout (tokenizer.json, tokenizer_config.json, special_tokens_map.json, and "
                    "vocab.txt for WordPiece). The same corpus and options always give the same files.",
        epilog="kinds: wordpiece = BERT (## continuation, [CLS]/[SEP]/[MASK]); bpe = RoBERTa byte-level BPE "
               "(<s>/</s>/<mask>, always cased); unigram = ALBERT (▁ word starts); gpt2 = GPT-2 byte-level BPE "
               "(one special token, <|endoftext|>; nothing added around a text; always cased). --family lays a "
               f"unigram tokenizer out as that family's own: {_layouts()}.")
    train.add_argument("--corpus", nargs="+", required=True, metavar="PATH",
                       help="text files, folders (every .txt/.txt.gz/.jsonl inside) or glob patterns")
    train.add_argument("--kind", choices=TOKENIZER_KINDS, default=None,
                       help="tokenizer model (default: wordpiece; unigram with --family)")
    train.add_argument("--family", choices=LAYOUT_FAMILIES, default=None,
                       help="a unigram tokenizer in this family's layout (its special tokens and ids, its "
                            "normalisation; saved for transformers' class of the family)")
    train.add_argument("--vocab-size", type=COUNT, default=30522, metavar="N", help="vocabulary size (default: 30522)")
    train.add_argument("--out", required=True, metavar="DIR", help="directory to write the tokenizer to")
    train.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=None,
                       help="lower-case and strip accents (wordpiece, unigram; default: on, off with --family as "
                            "the families' own tokenizers are cased; bpe is always cased, and so are some families')")
    train.add_argument("--min-frequency", type=COUNT0, default=2, metavar="N",
                       help="minimum pair/word frequency for a merge (wordpiece, bpe; default: 2)")
    train.add_argument("--model-max-length", type=COUNT, default=512, metavar="N",
                       help="model_max_length written to tokenizer_config.json (default: 512)")
    train.add_argument("--workers", type=COUNT, default=1, metavar="N",
                       help="processes counting words of a large wordpiece corpus (default: 1)")
    train.add_argument("--overwrite", action="store_true",
                       help="replace an earlier tokenizer in --out (refused otherwise)")
    train.set_defaults(func=run_train)


def _output_dir(path: str) -> Path:
    """--out, created now: a path that cannot hold the tokenizer fails before minutes of training, not after."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BertforgeError(f"--out {path}: cannot create directory ({err.strerror or err})") from None
    if not os.access(out, os.W_OK):
        raise BertforgeError(f"--out {path}: directory is not writable")
    return out


def run_train(args: argparse.Namespace) -> int:
    """Train, save and print a one-line summary."""
    start = time.perf_counter()
    kind = args.kind or ("unigram" if args.family else "wordpiece")
    layout = FAMILIES[args.family].tokenizer if args.family else None
    if layout is not None and kind != "unigram":
        raise BertforgeError(f"--family {args.family}: its tokenizer is a SentencePiece unigram one; use --kind "
                             f"unigram (not {kind})")
    files = find_files(args.corpus)  # a missing file or a pattern matching nothing is named here
    from bertforge.io.rundir import claim_output_dir
    out = _output_dir(args.out)
    # an existing tokenizer (or anything else) in --out is refused like every verb's earlier output
    with claim_output_dir(out, resume=False, overwrite=args.overwrite, resume_flag=None):
        tok = Tokenizer.train(iter_texts(files), kind=kind, vocab_size=args.vocab_size,
                              lowercase=args.lowercase if args.lowercase is not None else layout is None,
                              min_frequency=args.min_frequency, show_progress=True,
                              model_max_length=args.model_max_length, workers=args.workers, layout=layout)
        tok.save_pretrained(out)
    seconds = time.perf_counter() - start
    what = f"{kind} ({layout.tokenizer_class} layout)" if layout is not None else kind
    print(f"trained {what} tokenizer: vocab {tok.vocab_size}, {len(files)} file(s), {seconds:.1f} s -> {args.out}")
    return 0
