"""Looking inside a model: `attention_maps`, `head_statistics` (Clark et al. 2019), `probe` (a linear probe per
layer), `head_importance` (Michel et al. 2019) and `explain` (Integrated Gradients), one per `bertforge analyze`
subcommand. Each returns what `bertforge.analysis` computes; with `out` it also writes the files the command
writes there (PNG, HTML, JSON).

    maps = bertforge.attention_maps("runs/pretrain-bert", "The cat sat on the mat.", out="cat.html")
    maps.attn.shape                                     # (layers, heads, tokens, tokens)
    bertforge.head_statistics("bert-base-uncased", "sentences.txt", out="runs/heads").patterns()
    bertforge.probe("bert-base-uncased", "conll2003/train.txt", task="pos").best_layer
    bertforge.head_importance("runs/sst2", "glue/SST-2", task="sst2")    # [layers, heads] scores
    bertforge.explain("runs/sst2", "a gripping film", out="why.html").scores
"""
from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from bertforge.api.inputs import device_for, model_name
from bertforge.config.arguments import (BOOL, COUNT, DATA, DEVICE, LENGTH, MODEL, PATH, SEED, TEXT, check_args,
                                        maybe)
from bertforge.errors import ArgumentError, BertforgeError


def _suffix(out: Any, allowed: tuple[str, ...]) -> str:
    suffix = Path(out).suffix.lower()
    if suffix not in allowed:
        raise ArgumentError.about("out", out, f"expected a {' or '.join(allowed)} file")
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


def _claim(out: Any, overwrite: bool):
    """`out`, claimed before any work (an earlier analysis there is replaced only with `overwrite`); nothing
    without `out`."""
    if out is None:
        return contextlib.nullcontext()
    from bertforge.io.rundir import claim_output_dir

    return claim_output_dir(out, resume=False, overwrite=overwrite, resume_flag=None)


def _encoder(model: Any, tokenizer: Any, device: Any, revision: str | None):
    """The encoder (eager attention) and tokenizer of `model` (a folder, Hub id or opened ModelFolder; or an
    encoder already loaded, with its `tokenizer`) on `device`."""
    from bertforge.device import move_model

    what = f"--model {model}" if isinstance(model, (str, Path)) else "--model"
    if tokenizer is None:
        from bertforge.analysis.attention import load_encoder

        model, tokenizer = load_encoder(model_name(model, revision))
    return move_model(model, device, what), tokenizer


def attention_maps(model: Any, text: str, pair: str | None = None, *, out: Any = None,
                   layers: list[int] | None = None, heads: list[int] | None = None, max_length: int | None = None,
                   tokenizer: Any = None, device: str = "auto", revision: str | None = None):
    """Every layer's and head's attention probabilities for `text` (and its `pair`), truncated to `max_length`
    tokens (default the model's maximum): an `AttentionMaps` (tokens, attn [layers, heads, tokens, tokens],
    truncated). `out`: F.png (heat maps, needs matplotlib) or F.html (an interactive offline view) of `layers` x
    `heads` (default all). `model`: a folder or Hub id, or a loaded `Encoder` with its `tokenizer`."""
    from bertforge.analysis.attention import attention_html, attention_maps as compute, plot_attention
    from bertforge.io.write import atomic_write_text, prepare_output_file

    check_args(locals(), model=MODEL, text=TEXT, pair=maybe(TEXT), out=maybe(PATH), max_length=maybe(LENGTH),
               device=DEVICE, revision=maybe(TEXT))
    suffix = _suffix(out, (".png", ".html")) if out is not None else None
    run_on = device_for(device)
    path = prepare_output_file(out) if out is not None else None
    encoder, tok = _encoder(model, tokenizer, run_on, revision)
    maps = compute(encoder, tok, text, pair, max_length)
    if suffix == ".png":
        _save(plot_attention(maps, layers, heads), path)
    elif suffix == ".html":
        atomic_write_text(path, attention_html(maps, layers, heads))
    return maps


def heads_record(stats, seconds: float) -> dict[str, Any]:
    """What OUT/heads.json holds for head statistics computed in `seconds`."""
    return {"sentences": stats.sentences, "tokens": stats.tokens, "seconds": round(seconds, 2),
            "patterns_over_0.5": stats.patterns(), "clusters": stats.clusters, "heads": stats.table()}


def head_statistics(model: Any, texts: Any, *, out: Any = None, max_sentences: int = 1000,
                    max_length: int | None = None, js_sentences: int = 200, clusters: int = 8, batch_size: int = 32,
                    text_col: Any = None, data_split: str | None = None, data_config: str | None = None,
                    tokenizer: Any = None, device: str = "auto", progress: bool = True, overwrite: bool = False,
                    revision: str | None = None):
    """Clark et al.'s statistics of every head (attention to [CLS], [SEP], punctuation, itself, the previous and
    next token; entropy) over the first `max_sentences` non-empty `texts` (a list of strings, a text file, or a
    column `text_col` of a table, a saved or Hub dataset), each truncated to `max_length` tokens (default 128, or
    the model's positions if fewer); the JS distances between heads over `js_sentences`, and `clusters` clusters
    of them: a `HeadStats` whose `seconds` is the time taken. `out`: a folder for heads.json, head_stats.png and
    head_clusters.png (needs matplotlib and scipy)."""
    from bertforge.analysis.head_statistics import head_statistics as compute, plot_clusters, plot_statistics
    from bertforge.config.positions import check_length, fit_length
    from bertforge.io.tables import read_texts, single_source
    from bertforge.model.folder import ModelFolder

    check_args(locals(), model=MODEL, texts=DATA, out=maybe(PATH), max_sentences=COUNT, max_length=maybe(LENGTH),
               js_sentences=COUNT, clusters=COUNT, batch_size=COUNT, text_col=maybe(TEXT), data_split=maybe(TEXT),
               data_config=maybe(TEXT), device=DEVICE, progress=BOOL, overwrite=BOOL, revision=maybe(TEXT))
    run_on = device_for(device)  # before any reading
    sentences = [t.strip() for t in read_texts(single_source(texts, data_split, data_config), text_col)
                 if t.strip()][:max_sentences]
    if tokenizer is None:
        name = model_name(model, revision)
        model = ModelFolder.open(name)
        config = model.model_config
    else:
        config, name = model.config, "--model"
    length = max_length or 128
    if config is not None:  # the positions rule, before the model is loaded
        length = check_length(max_length, config, name, "--max-length") if max_length else fit_length(128, config)
    with _claim(out, overwrite):
        encoder, tok = _encoder(model, tokenizer, run_on, revision)
        start = time.perf_counter()
        stats = compute(encoder, tok, sentences, batch_size, length, js_sentences, clusters, progress=progress)
        stats.seconds = time.perf_counter() - start
        if out is not None:
            _write_json(Path(out) / "heads.json", heads_record(stats, stats.seconds))
            _save(plot_statistics(stats), Path(out) / "head_stats.png")
            if stats.js is not None:
                _save(plot_clusters(stats), Path(out) / "head_clusters.png")
    return stats


def probe_record(result, seconds: float) -> dict[str, Any]:
    """What OUT/probe.json holds for a probe run in `seconds`."""
    return {"task": result.task, "train": result.n_train, "test": result.n_test, "seconds": round(seconds, 1),
            "accuracy": result.accuracy, "control": result.control, "majority": result.majority,
            "best_layer": result.best_layer}


def probe(model: Any, data: Any, *, task: str, eval: Any = None, out: Any = None, max_sentences: int | None = None,
          epochs: int = 8, control: bool = True, batch_size: int = 32, seed: int = 0, tokenizer: Any = None,
          device: str = "auto", progress: bool = True, overwrite: bool = False, revision: str | None = None):
    """A linear probe per layer (0 = the embeddings) for `task` (pos, chunk, ner: a CoNLL-2003 file; sst2: a table
    with sentence and label columns), trained on `data` (its first `max_sentences`; or items in memory: a list of
    (words, labels)) and scored on `eval` (default: the last 20% of `data`), with a random-init control
    (`control`) and the majority class: a `ProbeResult` (accuracy and control per layer, majority, best_layer)
    whose `seconds` is the time taken. `out`: a folder for probe.json and probe.png (needs matplotlib)."""
    from bertforge.analysis.probe import plot_probe, probe as compute, read_items

    check_args(locals(), model=MODEL, data=DATA, task=TEXT, eval=maybe(DATA), out=maybe(PATH),
               max_sentences=maybe(COUNT), epochs=COUNT, control=BOOL, batch_size=COUNT, seed=SEED, device=DEVICE,
               progress=BOOL, overwrite=BOOL, revision=maybe(TEXT))
    run_on = device_for(device)  # before any reading

    def items_of(source: Any, limit: int | None = None) -> list:
        if isinstance(source, (list, tuple)):
            return list(source)[:limit]
        return read_items(task, source, limit)

    items = items_of(data, max_sentences)
    if eval is not None:
        train, test = items, items_of(eval)
    else:
        if len(items) < 5:
            where = data if isinstance(data, (str, Path)) else "data"
            raise ArgumentError(f"{where}: {len(items)} examples is too few to split; give eval",
                                flag_message=f"{where}: {len(items)} examples is too few to split; give --eval")
        cut = int(len(items) * 0.8)
        train, test = items[:cut], items[cut:]
    with _claim(out, overwrite):
        encoder, tok = _encoder(model, tokenizer, run_on, revision)
        start = time.perf_counter()
        result = compute(encoder, tok, task, train, test, batch_size, epochs=epochs, seed=seed, control=control,
                         progress=progress)
        result.seconds = time.perf_counter() - start
        if out is not None:
            _write_json(Path(out) / "probe.json", probe_record(result, result.seconds))
            _save(plot_probe([result]), Path(out) / "probe.png")
    return result


def head_importance(model: Any, data: Any, *, task: str, out: Any = None, max_examples: int = 2000,
                    batch_size: int = 32, data_config: str | None = None, text_col: Any = None,
                    text_pair_col: Any = None, label_col: Any = None, device: str = "auto", progress: bool = True,
                    overwrite: bool = False, revision: str | None = None):
    """Michel et al.'s importance of every head of `model` (fine-tuned for `task`: a folder or Hub id) on `data`
    (a folder of splits: its dev split, a saved or Hub dataset, one file or a table): the gradient of a head mask
    over the first `max_examples`, normalised per layer, as a numpy array [layers, heads]. `out`: a folder for
    importance.json and importance.png (needs matplotlib)."""
    from bertforge.analysis.importance import head_importance as compute, load_task_data, plot_importance
    from bertforge.device import move_model

    check_args(locals(), model=MODEL, data=DATA, task=TEXT, out=maybe(PATH), max_examples=COUNT, batch_size=COUNT,
               data_config=maybe(TEXT), text_col=maybe(TEXT), text_pair_col=maybe(TEXT), label_col=maybe(TEXT),
               device=DEVICE, progress=BOOL, overwrite=BOOL, revision=maybe(TEXT))
    run_on = device_for(device)
    with _claim(out, overwrite):
        name = model_name(model, revision)
        net, _, enc, _, _ = load_task_data(name, task, data, data_config=data_config, text_col=text_col,
                                           text_pair_col=text_pair_col, label_col=label_col)
        net = move_model(net, run_on, f"--model {name}")
        scores = compute(net, enc, batch_size=batch_size, max_examples=max_examples, progress=progress)
        if out is not None:
            rows = [[None if s != s else round(float(s), 5) for s in row] for row in scores]
            _write_json(Path(out) / "importance.json", {"importance": rows})
            _save(plot_importance(scores), Path(out) / "importance.png")
    return scores


def explain(model: Any, text: str, *, out: Any = None, target: str | None = None, steps: int = 50,
            device: str = "auto", revision: str | None = None):
    """Integrated Gradients (captum, `steps` steps) of a fine-tuned classifier's logit for the `target` label
    (default: the predicted one) with respect to the tokens of `text`: an `Attribution` (tokens, scores, label,
    probability, delta: the completeness error). `out`: F.html or F.png (needs matplotlib)."""
    from bertforge.analysis.explain import attribution_html, explain as compute, plot_attribution
    from bertforge.device import move_model
    from bertforge.io.write import atomic_write_text, prepare_output_file
    from bertforge.model.folder import ModelFolder
    from bertforge.tasks.models import load_task_model

    check_args(locals(), model=MODEL, text=TEXT, out=maybe(PATH), target=maybe(TEXT), steps=COUNT, device=DEVICE,
               revision=maybe(TEXT))
    suffix = _suffix(out, (".png", ".html")) if out is not None else None
    run_on = device_for(device)
    path = prepare_output_file(out) if out is not None else None
    name = model_name(model, revision)
    folder = ModelFolder.open(name)
    net, _, labels = load_task_model(folder)
    net = move_model(net, run_on, f"--model {name}")
    index = None
    if target is not None:
        if not labels or target not in labels:
            raise ArgumentError.about("target", target, f"not one of the model's labels ({labels})")
        index = labels.index(target)
    attr = compute(net, folder.tokenizer(), text, labels, index, steps)
    if suffix == ".png":
        _save(plot_attribution(attr), path)
    elif suffix == ".html":
        atomic_write_text(path, attribution_html(attr))
    return attr
