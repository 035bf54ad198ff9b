"""`bertforge info DIR` and `bertforge fill-mask --model DIR "text with [MASK]"`."""
from __future__ import annotations

import argparse
import json

from bertforge.api.models import info as describe  # noqa: F401 (the description `info` prints)
from bertforge.commands.bounds import COUNT
from bertforge.device import add_device_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="describe a checkpoint directory (architecture, parameters, vocabulary)",
                       description="Describe a checkpoint directory: architecture, parameter count, vocabulary.")
    p.add_argument("model", metavar="DIR", help="checkpoint directory (bertforge or Hugging Face layout)")
    p.add_argument("--json", action="store_true", help="print the description as JSON")
    p.set_defaults(func=info, needs=())

    p = sub.add_parser("fill-mask", help="top-k predictions for each [MASK] in a text",
                       description="Print the masked LM's top-k candidates (with probabilities) for each mask.")
    p.add_argument("text", help='text with one or more masks, e.g. "Paris is the [MASK] of France."')
    p.add_argument("--model", required=True, metavar="DIR", help="checkpoint with an MLM head")
    p.add_argument("--top-k", type=COUNT, default=5, help="candidates per mask (default 5)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_device_args(p, None)
    p.set_defaults(func=fill_mask_command, needs=())


def info(args: argparse.Namespace) -> int:
    d = describe(args.model)
    if args.json:
        print(json.dumps(d, indent=2))
        return 0
    arch = ", ".join(d["architectures"] or []) or "-"
    print(f"{d['path']}: {d['model_type']} ({arch})")
    print(f"  layers {d['layers']}  hidden {d['hidden_size']}  heads {d['heads']}  ffn {d['intermediate_size']}"
          f"  embedding {d['embedding_size']}  sharing {d['share_layers']}  "
          f"positions {d['max_positions'] or 'relative (no limit)'}")
    print(f"  blocks: {d['blocks']}")
    print(f"  parameters {d['parameters']:,} ({d['parameters'] / 1e6:.1f}M)")
    t = d["tokenizer"]
    print(f"  vocabulary {d['vocab_size']:,}; tokenizer "
          + (f"{t['kind']} ({t['vocab_size']:,} tokens, lowercase={t['lowercase']})" if "kind" in t
             else f"missing: {t['error']}"))
    if d["labels"]:
        print(f"  labels {d['labels']}")
    return 0


def fill_mask_command(args: argparse.Namespace) -> int:
    from bertforge.api import fill_mask

    results = fill_mask(args.model, args.text, top_k=args.top_k, device=args.device)
    if args.json:
        print(json.dumps([[c.to_dict() for c in cands] for cands in results], indent=2))
        return 0
    for i, cands in enumerate(results, 1):
        print(f"mask {i}:")
        for c in cands:
            print(f"  {c.token:<20} {c.probability:.4f}")
    return 0
