"""`bertforge analyze attention|heads|probe|importance|explain`: looking inside a model (see bertforge.analysis)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bertforge.commands.bounds import COUNT, LENGTH
from bertforge.commands.needs import Need
from bertforge.commands.options import add_overwrite_arg, add_progress_arg, add_seed_arg
from bertforge.device import add_device_args
from bertforge.commands.data_options import add_column_args, add_data_args, add_input_split_args


def _ints(value: str) -> list[int]:
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {value!r}") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help="attention maps, head statistics, probing, head importance, attributions",
                       description="Look inside a model: attention maps, Clark et al. head statistics, layer-wise "
                                   "probes, Michel et al. head importance, Integrated Gradients attributions.")
    verbs = p.add_subparsers(dest="analysis", metavar="ANALYSIS", required=True)

    a = verbs.add_parser("attention", help="attention heat maps (PNG) or an interactive offline HTML view")
    a.add_argument("--model", required=True, metavar="DIR")
    a.add_argument("--text", required=True)
    a.add_argument("--pair", help="a second segment (sentence pair)")
    a.add_argument("--out", required=True, metavar="F.png|F.html")
    a.add_argument("--layers", type=_ints, help="comma-separated layers (default all)")
    a.add_argument("--heads", type=_ints, help="comma-separated heads (default all)")
    a.add_argument("--max-length", type=LENGTH, help="truncate longer inputs (default the model's maximum)")
    add_device_args(a, None)
    a.set_defaults(func=attention_command, needs=lambda args: _plot_needs(args, "analyze attention"))

    h = verbs.add_parser("heads", help="per-head attention statistics over a corpus (Clark et al. 2019)")
    h.add_argument("--model", required=True, metavar="DIR")
    h.add_argument("--input", required=True, metavar="PATH",
                   help="sentences: a text file (one a line), or a column of a csv / tsv / jsonl / json / parquet "
                        "file, a saved or Hub dataset")
    add_column_args(h, pair=False, label=False)
    add_input_split_args(h)
    h.add_argument("--out", required=True, metavar="DIR")
    h.add_argument("--max-sentences", type=COUNT, default=1000)
    h.add_argument("--max-length", type=LENGTH, metavar="N",
                   help="truncate longer sentences (default: 128, or the model's positions if fewer; longer than "
                        "its positions is refused)")
    h.add_argument("--js-sentences", type=COUNT, default=200, help="sentences for the JS distances (default 200)")
    h.add_argument("--clusters", type=COUNT, default=8)
    h.add_argument("--batch-size", type=COUNT, default=32)
    _folder_options(h)
    h.set_defaults(func=heads_command, needs=(Need("analysis", "matplotlib", "analyze heads"),
                                              Need("analysis", "scipy", "analyze heads")))  # clusters

    r = verbs.add_parser("probe", help="a linear probe per layer with random-init and majority controls")
    r.add_argument("--model", required=True, metavar="DIR")
    r.add_argument("--task", required=True, choices=["pos", "chunk", "ner", "sst2"])
    r.add_argument("--data", required=True, metavar="PATH",
                   help="CoNLL-2003 file (pos|chunk|ner); sst2: a table with sentence and label columns (SST-2's tsv, "
                        "csv, jsonl, json, parquet, a saved dataset)")
    r.add_argument("--eval", metavar="PATH", help="held-out file (default: the last 20%% of --data)")
    r.add_argument("--out", required=True, metavar="DIR")
    r.add_argument("--max-sentences", type=COUNT, help="use only the first N sentences of --data")
    r.add_argument("--epochs", type=COUNT, default=8, help="passes of the probes over the training words (default 8)")
    r.add_argument("--no-control", action="store_true", help="skip the random-init control")
    r.add_argument("--batch-size", type=COUNT, default=32)
    add_seed_arg(r, 0, "random seed of the probes and the random-init control")
    _folder_options(r)
    r.set_defaults(func=probe_command, needs=(Need("analysis", "matplotlib", "analyze probe"),))

    i = verbs.add_parser("importance", help="Michel et al. head importance as a layer x head heat map")
    i.add_argument("--model", required=True, metavar="DIR", help="a fine-tuned task model")
    i.add_argument("--task", required=True)
    add_data_args(i, "labelled task data: a folder of splits (its dev split; as `finetune --data` takes), a saved or "
                     "Hub dataset, or one file", required=True)
    add_column_args(i)
    i.add_argument("--out", required=True, metavar="DIR")
    i.add_argument("--max-examples", type=COUNT, default=2000)
    i.add_argument("--batch-size", type=COUNT, default=32)
    _folder_options(i)
    i.set_defaults(func=importance_command, needs=(Need("analysis", "matplotlib", "analyze importance"),))

    e = verbs.add_parser("explain", help="Integrated Gradients token attributions (needs captum)")
    e.add_argument("--model", required=True, metavar="DIR", help="a fine-tuned classification model")
    e.add_argument("--text", required=True)
    e.add_argument("--out", required=True, metavar="F.html|F.png")
    e.add_argument("--target", help="label to explain (default: the predicted one)")
    e.add_argument("--steps", type=COUNT, default=50)
    add_device_args(e, None)
    e.set_defaults(func=explain_command, needs=lambda args: (Need("analysis", "captum", "analyze explain"),
                                                             *_plot_needs(args, "analyze explain")))


def _folder_options(p: argparse.ArgumentParser) -> None:
    """The analyses over a data set: they write a folder and show progress."""
    add_device_args(p, None)
    add_progress_arg(p)
    add_overwrite_arg(p)


def _plot_needs(args: argparse.Namespace, what: str) -> tuple[Need, ...]:
    """An --out F.png is drawn with matplotlib (an F.html is written without it)."""
    return (Need("analysis", "matplotlib", f"{what} --out {args.out}"),) if args.out.lower().endswith(".png") else ()


def attention_command(args: argparse.Namespace) -> int:
    from bertforge.api import attention_maps

    maps = attention_maps(args.model, args.text, args.pair, out=args.out, layers=args.layers, heads=args.heads,
                          max_length=args.max_length, device=args.device)
    if maps.truncated:
        print(f"note: the input is longer than the model's maximum; truncated to {len(maps.tokens)} tokens",
              file=sys.stderr)
    print(f"attention of {len(maps.tokens)} tokens -> {Path(args.out)}")
    return 0


def heads_command(args: argparse.Namespace) -> int:
    from bertforge.api import head_statistics

    stats = head_statistics(args.model, args.input, out=args.out, max_sentences=args.max_sentences,
                            max_length=args.max_length, js_sentences=args.js_sentences, clusters=args.clusters,
                            batch_size=args.batch_size, text_col=args.text_col, data_split=args.data_split,
                            data_config=args.data_config, device=args.device, progress=args.progress,
                            overwrite=args.overwrite)
    print(f"{stats.sentences} sentences, {stats.tokens} tokens in {stats.seconds:.1f}s -> {Path(args.out)}")
    for k, heads in stats.patterns().items():
        print(f"  heads with > 0.5 of their attention on {k}: {', '.join(heads) or 'none'}")
    return 0


def probe_command(args: argparse.Namespace) -> int:
    from bertforge.api import probe

    result = probe(args.model, args.data, task=args.task, eval=args.eval, out=args.out,
                   max_sentences=args.max_sentences, epochs=args.epochs, control=not args.no_control,
                   batch_size=args.batch_size, seed=args.seed, device=args.device, progress=args.progress,
                   overwrite=args.overwrite)
    print("layer  model   random-init")
    for k, acc in enumerate(result.accuracy):
        ctrl = f"{result.control[k]:.4f}" if result.control else "-"
        print(f"{k:5d}  {acc:.4f}  {ctrl}")
    print(f"majority class {result.majority:.4f}; best layer {result.best_layer}; {result.seconds:.0f}s -> "
          f"{Path(args.out)}")
    return 0


def importance_command(args: argparse.Namespace) -> int:
    from bertforge.api import head_importance

    scores = head_importance(args.model, args.data, task=args.task, out=args.out, max_examples=args.max_examples,
                             batch_size=args.batch_size, data_config=args.data_config, text_col=args.text_col,
                             text_pair_col=args.text_pair_col, label_col=args.label_col, device=args.device,
                             progress=args.progress, overwrite=args.overwrite)
    print(f"head importance ({scores.shape[0]} layers x {scores.shape[1]} heads) -> {Path(args.out)}")
    return 0


def explain_command(args: argparse.Namespace) -> int:
    from bertforge.api import explain

    attr = explain(args.model, args.text, out=args.out, target=args.target, steps=args.steps, device=args.device)
    print(f"{attr.label} (p = {attr.probability:.3f}), IG convergence delta {attr.delta:.2e} -> {Path(args.out)}")
    return 0
