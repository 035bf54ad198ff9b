"""`bertforge analyze attention|heads|probe|importance|explain`: looking inside a model (see bertforge.analysis)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bertforge.commands.bounds import COUNT, LENGTH
from bertforge.commands.needs import Need
from bertforge.commands.options import add_overwrite_arg, add_progress_arg, add_seed_arg, device_of
from bertforge.device import add_device_args
from bertforge.commands.data_options import add_column_args, add_data_args, add_input_split_args
from bertforge.errors import BertforgeError


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


def _suffix(out: str, allowed: tuple[str, ...]) -> str:
    suffix = Path(out).suffix.lower()
    if suffix not in allowed:
        raise BertforgeError(f"--out {out}: expected a {' or '.join(allowed)} file")
    return suffix


def _save(fig, path: Path) -> None:
    """The figure as a PNG, written atomically."""
    import matplotlib.pyplot as plt

    from bertforge.io.write import atomic_write

    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


def _write_json(path: Path, record: dict) -> None:
    from bertforge.io.write import atomic_write_text

    atomic_write_text(path, json.dumps(record, indent=1) + "\n")


def _load_encoder(args: argparse.Namespace, folder=None):
    """The encoder (eager attention) and tokenizer of --model (`folder`: its opened model folder), on --device."""
    from bertforge.analysis.attention import load_encoder
    from bertforge.device import move_model

    encoder, tok = load_encoder(folder or args.model)
    return move_model(encoder, device_of(args), f"--model {args.model}"), tok


def _load_task_data(args: argparse.Namespace):
    """A fine-tuned --model on --device and its encoded --data."""
    from bertforge.analysis.importance import load_task_data
    from bertforge.device import move_model

    model, kind, enc, labels, saved = load_task_data(args.model, args.task, args.data, data_config=args.data_config,
                                                     text_col=args.text_col, text_pair_col=args.text_pair_col,
                                                     label_col=args.label_col)
    return move_model(model, device_of(args), f"--model {args.model}"), kind, enc, labels, saved


def _claim(args: argparse.Namespace):
    """--out, claimed before any work: an earlier analysis there is replaced only with --overwrite."""
    from bertforge.io.rundir import claim_output_dir

    device_of(args)
    return claim_output_dir(args.out, resume=False, overwrite=args.overwrite, resume_flag=None)


def attention_command(args: argparse.Namespace) -> int:
    from bertforge.analysis.attention import attention_html, attention_maps, plot_attention
    from bertforge.io.write import atomic_write_text, prepare_output_file

    suffix = _suffix(args.out, (".png", ".html"))
    device_of(args)
    out = prepare_output_file(args.out)
    encoder, tok = _load_encoder(args)
    maps = attention_maps(encoder, tok, args.text, args.pair, args.max_length)
    if maps.truncated:
        print(f"note: the input is longer than the model's maximum; truncated to {len(maps.tokens)} tokens",
              file=sys.stderr)
    if suffix == ".png":
        _save(plot_attention(maps, args.layers, args.heads), out)
    else:
        atomic_write_text(out, attention_html(maps, args.layers, args.heads))
    print(f"attention of {len(maps.tokens)} tokens -> {out}")
    return 0


def heads_command(args: argparse.Namespace) -> int:
    from bertforge.analysis.head_statistics import head_statistics, plot_clusters, plot_statistics
    from bertforge.config.positions import check_length, fit_length
    from bertforge.io.tables import read_texts, single_source
    from bertforge.model.folder import ModelFolder

    texts = read_texts(single_source(args.input, args.data_split, args.data_config), args.text_col)
    sentences = [t.strip() for t in texts if t.strip()][:args.max_sentences]
    folder = ModelFolder.open(args.model)
    length = args.max_length or 128
    if folder.model_config is not None:  # the positions rule, before the model is loaded
        length = check_length(args.max_length, folder.model_config, args.model, "--max-length") \
            if args.max_length else fit_length(128, folder.model_config)
    with _claim(args):
        encoder, tok = _load_encoder(args, folder)
        start = time.perf_counter()
        stats = head_statistics(encoder, tok, sentences, args.batch_size, length, args.js_sentences,
                                args.clusters, progress=args.progress)
        seconds = time.perf_counter() - start
        out = Path(args.out)
        _write_json(out / "heads.json", {"sentences": stats.sentences, "tokens": stats.tokens,
                                         "seconds": round(seconds, 2), "patterns_over_0.5": stats.patterns(),
                                         "clusters": stats.clusters, "heads": stats.table()})
        _save(plot_statistics(stats), out / "head_stats.png")
        if stats.js is not None:
            _save(plot_clusters(stats), out / "head_clusters.png")
    print(f"{stats.sentences} sentences, {stats.tokens} tokens in {seconds:.1f}s -> {out}")
    for k, heads in stats.patterns().items():
        print(f"  heads with > 0.5 of their attention on {k}: {', '.join(heads) or 'none'}")
    return 0


def probe_command(args: argparse.Namespace) -> int:
    from bertforge.analysis.probe import plot_probe, probe, read_items

    items = read_items(args.task, args.data, args.max_sentences)
    if args.eval:
        train, test = items, read_items(args.task, args.eval)
    else:
        if len(items) < 5:
            raise BertforgeError(f"{args.data}: {len(items)} examples is too few to split; give --eval")
        cut = int(len(items) * 0.8)
        train, test = items[:cut], items[cut:]
    with _claim(args):
        encoder, tok = _load_encoder(args)
        start = time.perf_counter()
        result = probe(encoder, tok, args.task, train, test, args.batch_size, epochs=args.epochs, seed=args.seed,
                       control=not args.no_control, progress=args.progress)
        seconds = time.perf_counter() - start
        out = Path(args.out)
        _write_json(out / "probe.json", {"task": args.task, "train": result.n_train, "test": result.n_test,
                                         "seconds": round(seconds, 1), "accuracy": result.accuracy,
                                         "control": result.control, "majority": result.majority,
                                         "best_layer": result.best_layer})
        _save(plot_probe([result]), out / "probe.png")
    print("layer  model   random-init")
    for k, acc in enumerate(result.accuracy):
        ctrl = f"{result.control[k]:.4f}" if result.control else "-"
        print(f"{k:5d}  {acc:.4f}  {ctrl}")
    print(f"majority class {result.majority:.4f}; best layer {result.best_layer}; {seconds:.0f}s -> {out}")
    return 0


def importance_command(args: argparse.Namespace) -> int:
    from bertforge.analysis.importance import head_importance, plot_importance

    with _claim(args):
        model, _, enc, _, _ = _load_task_data(args)
        scores = head_importance(model, enc, batch_size=args.batch_size, max_examples=args.max_examples,
                                 progress=args.progress)
        out = Path(args.out)
        rows = [[None if s != s else round(float(s), 5) for s in row] for row in scores]
        _write_json(out / "importance.json", {"importance": rows})
        _save(plot_importance(scores), out / "importance.png")
    print(f"head importance ({scores.shape[0]} layers x {scores.shape[1]} heads) -> {out}")
    return 0


def explain_command(args: argparse.Namespace) -> int:
    from bertforge.analysis.explain import attribution_html, explain, plot_attribution
    from bertforge.device import move_model
    from bertforge.io.write import atomic_write_text, prepare_output_file
    from bertforge.model.folder import ModelFolder
    from bertforge.tasks.models import load_task_model

    suffix = _suffix(args.out, (".png", ".html"))
    device = device_of(args)
    out = prepare_output_file(args.out)
    folder = ModelFolder.open(args.model)
    model, _, labels = load_task_model(folder)
    model = move_model(model, device, f"--model {args.model}")
    target = None
    if args.target is not None:
        if not labels or args.target not in labels:
            raise BertforgeError(f"--target {args.target!r} is not one of the model's labels ({labels})")
        target = labels.index(args.target)
    attr = explain(model, folder.tokenizer(), args.text, labels, target, args.steps)
    if suffix == ".png":
        _save(plot_attribution(attr), out)
    else:
        atomic_write_text(out, attribution_html(attr))
    print(f"{attr.label} (p = {attr.probability:.3f}), IG convergence delta {attr.delta:.2e} -> {out}")
    return 0
