"""`bertforge info DIR` and `bertforge fill-mask --model DIR "text with [MASK]"`."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from bertforge.commands.bounds import COUNT
from bertforge.commands.options import device_of
from bertforge.device import add_device_args
from bertforge.errors import BertforgeError


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


def _blocks(cfg) -> str:
    """The layer layout in words (what a config's switches make of the blocks)."""
    from bertforge.families import DECODER

    if cfg.stack == DECODER:
        return f"pre-norm causal decoder, learned positions, {cfg.hidden_act} MLP"
    if cfg.family.two_stream:
        return f"post-norm, relative positions (Transformer-XL, two streams), {cfg.hidden_act} MLP"
    return (f"{cfg.norm_position}-norm, {cfg.position_embedding_type} positions, "
            f"{'GeGLU' if cfg.gated_mlp else cfg.hidden_act} MLP"
            + (f", window {cfg.local_attention} with global attention every "
               f"{cfg.global_attn_every_n_layers} layers" if cfg.local_attention else "")
            + _sparse(cfg))


def _sparse(cfg) -> str:
    """Longformer's / BigBird's attention in words ("" for full attention)."""
    from bertforge.families.family import BLOCK_SPARSE, SLIDING_WINDOW

    if cfg.family.sparse_attention == SLIDING_WINDOW:
        windows = sorted(set(cfg.attention_window))
        return f", Longformer attention (window {'/'.join(map(str, windows))} + global tokens)"
    if cfg.family.sparse_attention == BLOCK_SPARSE and cfg.attention_type == "block_sparse":
        return (f", BigBird block-sparse attention (blocks of {cfg.block_size}: 3 window + 2 global + "
                f"{cfg.num_random_blocks} random)")
    return ""


def describe(path: str | Path) -> dict:
    """What a checkpoint is, read from config.json, the safetensors header and the tokenizer files."""
    from safetensors import safe_open

    from bertforge.families import DECODER, ENCODER
    from bertforge.model.checkpoint import read_state_dict
    from bertforge.model.folder import ModelFolder

    folder = ModelFolder.open(path, "")
    path, raw = folder.path, folder.config
    cfg = folder.config_for(ENCODER, DECODER, verb="an encoder or decoder")
    st = path / "model.safetensors"
    if st.is_file():  # count parameters from the header: no need to load the weights
        try:
            with safe_open(str(st), "pt") as f:
                n_params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
        except Exception as err:  # noqa: BLE001 - a damaged file is the user's to know about
            raise BertforgeError(f"{st}: not a readable safetensors file ({err})") from None
    else:
        n_params = sum(t.numel() for t in read_state_dict(path)[0].values())
    try:
        tok = folder.tokenizer()
        tokenizer = {"kind": tok.kind, "vocab_size": tok.vocab_size, "lowercase": tok.do_lower_case}
    except BertforgeError as err:
        tokenizer = {"error": str(err)}
    return {
        "path": str(path), "model_type": cfg.model_type, "architectures": raw.get("architectures"),
        "layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size, "heads": cfg.num_attention_heads,
        "intermediate_size": cfg.intermediate_size, "embedding_size": cfg.embedding_size,
        "share_layers": cfg.share_layers,
        "max_positions": None if cfg.family.relative_positions else cfg.max_position_embeddings,  # XLNet: no limit
        "blocks": _blocks(cfg),
        "vocab_size": cfg.vocab_size, "parameters": n_params, "tokenizer": tokenizer,
        "labels": raw.get("id2label") if raw.get("bertforge_task") or raw.get("problem_type") else None,
    }


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
    from bertforge.analysis.fill_mask import fill_mask
    from bertforge.device import move_model
    from bertforge.model.folder import ModelFolder
    from bertforge.model.heads import MaskedLM

    device = device_of(args)
    folder = ModelFolder.open(args.model)
    model = MaskedLM.from_pretrained(folder)  # first: a checkpoint that cannot fill masks is the error to report
    model = move_model(model, device, f"--model {args.model}")
    tokenizer = folder.tokenizer()
    results = fill_mask(model, tokenizer, args.text, args.top_k)
    if args.json:
        print(json.dumps([[c.__dict__ for c in cands] for cands in results], indent=2))
        return 0
    for i, cands in enumerate(results, 1):
        print(f"mask {i}:")
        for c in cands:
            print(f"  {c.token:<20} {c.probability:.4f}")
    return 0
