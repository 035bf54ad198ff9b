"""`bertforge analyze attention|heads|probe|importance|explain`: looking inside a model (see bertforge.analysis)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bertforge.commands.bounds import COUNT, LENGTH
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
    a.set_defaults(func=attention_command)

    h = verbs.add_parser("heads", help="per-head attention statistics over a corpus (Clark et al. 2019)")
    h.add_argument("--model", required=True, metavar="DIR")
    h.add_argument("--input", required=True, metavar="FILE", help="one sentence per line")
    h.add_argument("--out", required=True, metavar="DIR")
    h.add_argument("--max-sentences", type=COUNT, default=1000)
    h.add_argument("--max-length", type=LENGTH, metavar="N",
                   help="truncate longer sentences (default: 128, or the model's positions if fewer; longer than "
                        "its positions is refused)")
    h.add_argument("--js-sentences", type=COUNT, default=200, help="sentences for the JS distances (default 200)")
    h.add_argument("--clusters", type=COUNT, default=8)
    h.add_argument("--batch-size", type=COUNT, default=32)
    h.set_defaults(func=heads_command)

    r = verbs.add_parser("probe", help="a linear probe per layer with random-init and majority controls")
    r.add_argument("--model", required=True, metavar="DIR")
    r.add_argument("--task", required=True, choices=["pos", "chunk", "ner", "sst2"])
    r.add_argument("--data", required=True, metavar="PATH", help="CoNLL-2003 file (pos|chunk|ner) or SST-2 TSV")
    r.add_argument("--eval", metavar="PATH", help="held-out file (default: the last 20%% of --data)")
    r.add_argument("--out", required=True, metavar="DIR")
    r.add_argument("--max-sentences", type=COUNT, help="use only the first N sentences of --data")
    r.add_argument("--epochs", type=COUNT, default=8, help="passes of the probes over the training words (default 8)")
    r.add_argument("--no-control", action="store_true", help="skip the random-init control")
    r.add_argument("--batch-size", type=COUNT, default=32)
    r.set_defaults(func=probe_command)

    i = verbs.add_parser("importance", help="Michel et al. head importance as a layer x head heat map")
    i.add_argument("--model", required=True, metavar="DIR", help="a fine-tuned task model")
    i.add_argument("--task", required=True)
    i.add_argument("--data", required=True, metavar="PATH", help="labelled task data")
    i.add_argument("--out", required=True, metavar="DIR")
    i.add_argument("--max-examples", type=COUNT, default=2000)
    i.add_argument("--batch-size", type=COUNT, default=32)
    i.set_defaults(func=importance_command)

    e = verbs.add_parser("explain", help="Integrated Gradients token attributions (needs captum)")
    e.add_argument("--model", required=True, metavar="DIR", help="a fine-tuned classification model")
    e.add_argument("--text", required=True)
    e.add_argument("--out", required=True, metavar="F.html|F.png")
    e.add_argument("--target", help="label to explain (default: the predicted one)")
    e.add_argument("--steps", type=COUNT, default=50)
    e.set_defaults(func=explain_command)


def _suffix(out: str, allowed: tuple[str, ...]) -> str:
    suffix = Path(out).suffix.lower()
    if suffix not in allowed:
        raise BertforgeError(f"--out {out}: expected a {' or '.join(allowed)} file")
    return suffix


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def attention_command(args: argparse.Namespace) -> int:
    from bertforge.analysis.attention import attention_html, attention_maps, load_encoder, plot_attention

    suffix = _suffix(args.out, (".png", ".html"))
    encoder, tok = load_encoder(args.model)
    maps = attention_maps(encoder, tok, args.text, args.pair, args.max_length)
    if maps.truncated:
        print(f"note: the input is longer than the model's maximum; truncated to {len(maps.tokens)} tokens",
              file=sys.stderr)
    out = Path(args.out)
    if suffix == ".png":
        _save(plot_attention(maps, args.layers, args.heads), out)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(attention_html(maps, args.layers, args.heads), encoding="utf-8")
    print(f"attention of {len(maps.tokens)} tokens -> {out}")
    return 0


def heads_command(args: argparse.Namespace) -> int:
    from bertforge.analysis.attention import load_encoder
    from bertforge.analysis.head_statistics import head_statistics, plot_clusters, plot_statistics
    from bertforge.config import ModelConfig
    from bertforge.config.positions import check_length, fit_length
    from bertforge.io.read import text_lines

    sentences = [line.strip() for _, line in text_lines(args.input)][:args.max_sentences]
    config = ModelConfig.from_file(args.model)  # the positions rule, before the model is loaded
    length = check_length(args.max_length, config, args.model, "--max-length") if args.max_length \
        else fit_length(128, config)
    encoder, tok = load_encoder(args.model)
    start = time.perf_counter()
    stats = head_statistics(encoder, tok, sentences, args.batch_size, length, args.js_sentences, args.clusters)
    seconds = time.perf_counter() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"sentences": stats.sentences, "tokens": stats.tokens, "seconds": round(seconds, 2),
              "patterns_over_0.5": stats.patterns(), "clusters": stats.clusters, "heads": stats.table()}
    (out / "heads.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    _save(plot_statistics(stats), out / "head_stats.png")
    if stats.js is not None:
        _save(plot_clusters(stats), out / "head_clusters.png")
    print(f"{stats.sentences} sentences, {stats.tokens} tokens in {seconds:.1f}s -> {out}")
    for k, heads in stats.patterns().items():
        print(f"  heads with > 0.5 of their attention on {k}: {', '.join(heads) or 'none'}")
    return 0


def probe_command(args: argparse.Namespace) -> int:
    from bertforge.analysis.attention import load_encoder
    from bertforge.analysis.probe import plot_probe, probe, read_items

    items = read_items(args.task, args.data, args.max_sentences)
    if args.eval:
        train, test = items, read_items(args.task, args.eval)
    else:
        if len(items) < 5:
            raise BertforgeError(f"{args.data}: {len(items)} examples is too few to split; give --eval")
        cut = int(len(items) * 0.8)
        train, test = items[:cut], items[cut:]
    encoder, tok = load_encoder(args.model)
    start = time.perf_counter()
    result = probe(encoder, tok, args.task, train, test, args.batch_size, epochs=args.epochs,
                   control=not args.no_control)
    seconds = time.perf_counter() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"task": args.task, "train": result.n_train, "test": result.n_test, "seconds": round(seconds, 1),
              "accuracy": result.accuracy, "control": result.control, "majority": result.majority,
              "best_layer": result.best_layer}
    (out / "probe.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    _save(plot_probe([result]), out / "probe.png")
    print("layer  model   random-init")
    for k, acc in enumerate(result.accuracy):
        ctrl = f"{result.control[k]:.4f}" if result.control else "-"
        print(f"{k:5d}  {acc:.4f}  {ctrl}")
    print(f"majority class {result.majority:.4f}; best layer {result.best_layer}; {seconds:.0f}s -> {out}")
    return 0


def importance_command(args: argparse.Namespace) -> int:
    from bertforge.analysis.importance import head_importance, load_task_data, plot_importance

    model, _, enc, _, _ = load_task_data(args.model, args.task, args.data)
    scores = head_importance(model, enc, batch_size=args.batch_size, max_examples=args.max_examples)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [[None if s != s else round(float(s), 5) for s in row] for row in scores]
    (out / "importance.json").write_text(json.dumps({"importance": rows}, indent=1) + "\n", encoding="utf-8")
    _save(plot_importance(scores), out / "importance.png")
    print(f"head importance ({scores.shape[0]} layers x {scores.shape[1]} heads) -> {out}")
    return 0


def explain_command(args: argparse.Namespace) -> int:
    from bertforge.analysis.explain import attribution_html, explain, plot_attribution
    from bertforge.tasks.models import load_task_model
    from bertforge.tokenization import Tokenizer

    suffix = _suffix(args.out, (".png", ".html"))
    model, _, labels = load_task_model(args.model)
    target = None
    if args.target is not None:
        if not labels or args.target not in labels:
            raise BertforgeError(f"--target {args.target!r} is not one of the model's labels ({labels})")
        target = labels.index(args.target)
    attr = explain(model, Tokenizer.from_pretrained(args.model), args.text, labels, target, args.steps)
    out = Path(args.out)
    if suffix == ".png":
        _save(plot_attribution(attr), out)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(attribution_html(attr), encoding="utf-8")
    print(f"{attr.label} (p = {attr.probability:.3f}), IG convergence delta {attr.delta:.2e} -> {out}")
    return 0
