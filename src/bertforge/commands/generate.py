"""`bertforge generate --model DIR --prompt "..."`: continue a text with a decoder, or answer a source text with an
encoder-decoder (T5, BART), streaming to the terminal."""
from __future__ import annotations

import argparse
import sys
import time
from bertforge.commands.bounds import COUNT, COUNT0, FINITE, OPEN_FRACTION, POSITIVE
from bertforge.commands.options import add_seed_arg

from bertforge.device import INFERENCE_PRECISIONS, add_device_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate", help="continue a prompt with a decoder (GPT-2 layout) or an encoder-decoder (T5, BART)",
        description="Continue a prompt with a decoder checkpoint (bertforge pretrain --recipe gpt, or a "
                    "transformers GPT-2 directory), or generate the output for a source text with an "
                    "encoder-decoder (T5, BART: the prompt is the encoder's input). Samples with nucleus top-p 0.9 "
                    "unless told otherwise; a decoder's prompt is printed, then each new piece of text as soon as "
                    "it is generated.",
        epilog="A decoder's prompt longer than its context (minus --max-new-tokens) keeps its last tokens; an "
               "encoder-decoder's source keeps its first tokens; both say so.")
    p.add_argument("--model", required=True, metavar="DIR",
                   help="decoder (model_type gpt2) or encoder-decoder (t5, bart) checkpoint directory")
    p.add_argument("--prompt", default="", help='text to continue (default: "", a new document)')
    p.add_argument("--prepend-bos", action="store_true",
                   help="a decoder reads <bos> (GPT-2: <|endoftext|>) before a non-empty prompt, as at a document's "
                        "start (default: the prompt's tokens alone, as transformers' generate; an empty prompt "
                        "always starts from <bos>)")
    p.add_argument("--max-new-tokens", type=COUNT, default=50, metavar="N", help="tokens to generate (default: 50)")
    p.add_argument("--greedy", action="store_true", help="always the most likely token (no sampling)")
    p.add_argument("--num-beams", type=COUNT, default=1, metavar="B",
                      help="beam search with B beams (deterministic; printed at the end; default: 1 = off)")
    p.add_argument("--temperature", type=POSITIVE, metavar="T", help="sampling temperature (default: 1.0)")
    p.add_argument("--top-k", type=COUNT0, metavar="K", help="sample from the K most likely tokens (default: 0 = all)")
    p.add_argument("--top-p", type=OPEN_FRACTION, metavar="P",
                   help="sample from the smallest set of tokens whose probability reaches P, in (0, 1] (default: 0.9)")
    p.add_argument("--repetition-penalty", type=POSITIVE, default=1.0, metavar="R",
                   help="divide the logit of every token already seen by R (CTRL; default: 1.0 = off)")
    p.add_argument("--length-penalty", type=FINITE, default=1.0, metavar="L",
                   help="beam search: finished beams score sum(log p) / length**L (default: 1.0)")
    add_seed_arg(p, None, "random seed: the same seed gives the same text")
    p.add_argument("--no-stream", action="store_true", help="print the whole text at the end")
    add_device_args(p, INFERENCE_PRECISIONS, None,
                    "the weights' type while decoding (bf16: half the bytes each new token reads, 1.8-1.9x faster "
                    "at batch 1). fp32 is token-identical to transformers; bf16 tokens may differ where two are "
                    "nearly tied; fp16: GPU only")
    p.set_defaults(func=run_generate, needs=())


def run_generate(args: argparse.Namespace) -> int:
    from bertforge.api import generate

    t0, pieces = time.perf_counter(), []
    text = generate(args.model, args.prompt, stream=True, max_new_tokens=args.max_new_tokens, greedy=args.greedy,
                    temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                    repetition_penalty=args.repetition_penalty, num_beams=args.num_beams,
                    length_penalty=args.length_penalty, seed=args.seed, prepend_bos=args.prepend_bos,
                    device=args.device, precision=args.precision)
    if text.continues_prompt:  # a decoder continues the prompt: show it first
        print(args.prompt, end="", flush=True)
    for piece in text:
        pieces.append(piece)
        if not args.no_stream:
            print(piece, end="", flush=True)
    if args.no_stream:
        print("".join(pieces), end="")
    print(flush=True)
    cfg = text.config
    print(f"({cfg.mode}, {text.precision}, {time.perf_counter() - t0:.1f} s"
          + (f", seed {cfg.seed}" if cfg.seed is not None and cfg.sampling else "") + ")", file=sys.stderr)
    return 0
