"""Layer-wise linear probes (Tenney et al. 2019, "BERT Rediscovers the Classical NLP Pipeline"; Hewitt & Liang
2019 on controls): frozen features from every layer, one logistic-regression probe per layer (scikit-learn's
objective, all layers trained together in torch: `fit_probes`).

Token tasks (pos, chunk, ner: CoNLL-2003's columns 2, 3 and 4) probe each word's first sub-token; sst2 probes the
mean of a sentence's tokens. Controls: the same architecture randomly initialised (what the architecture and the
word identities give without pretraining) and the majority class.

    result = probe(encoder, tokenizer, "pos", train_items, test_items)
    result.accuracy, result.control, result.majority   # per layer (embeddings = layer 0)
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from bertforge.config.positions import fit_length
from bertforge.errors import BertforgeError
from bertforge.io.tables import open_table, text_value, value
from bertforge.model import Encoder
from bertforge.tokenization import Tokenizer

TASK_COLUMNS = {"pos": 1, "chunk": 2, "ner": 3}  # CoNLL-2003: token POS chunk NER
TASKS = (*TASK_COLUMNS, "sst2")


@dataclass
class ProbeResult:
    task: str
    accuracy: list[float]       # per layer, the trained encoder (0 = embeddings)
    control: list[float]        # per layer, the same architecture randomly initialised
    majority: float             # the most frequent training label, on the test items
    n_train: int
    n_test: int
    seconds: float = 0.0        # how long the probes took

    @property
    def best_layer(self) -> int:
        return int(np.argmax(self.accuracy))


def read_items(task: str, path: str | Path, limit: int | None = None) -> list[tuple[list[str], list[str]]]:
    """(words, labels) per sentence: token tasks one label per word; sst2 one label for the whole sentence (a table
    with sentence and label columns, in any format `bertforge.io.tables.open_table` reads)."""
    from bertforge.tasks.conll import read_conll

    if task not in TASKS:
        raise BertforgeError(f"unknown probing task {task!r} (choose from {', '.join(TASKS)})")
    if task == "sst2":
        table = open_table(path)
        for column in ("sentence", "label"):
            table.require(column, "SST-2")
        items = [(text_value(row, "sentence").split(), [str(value(row, "label"))]) for row in table]
    else:
        # IOB2 for chunk and NER (CoNLL-2003 ships IOB1); POS tags are plain labels
        items = [(ex.tokens, ex.tags) for ex in read_conll(path, TASK_COLUMNS[task],
                                                           scheme="iob2" if task == "pos" else "auto")]
    items = [it for it in items if it[0]]
    if not items:
        raise BertforgeError(f"{path}: no examples for --task {task}")
    return items[:limit] if limit else items


def layer_features(encoder: Encoder, tokenizer: Tokenizer, items: list[tuple[list[str], list[str]]],
                   sentence_level: bool, batch_size: int = 32, max_length: int = 128,
                   progress: bool = True, desc: str = "features") -> tuple[np.ndarray, list[str]]:
    """[L+1, N, H] float32 features (N words, or N sentences for sentence-level) and their N labels. Words cut
    off by truncation are left out."""
    encoder.eval()
    device = next(encoder.parameters()).device  # the model's: a GPU model gets GPU inputs
    # Batches of similar length (then put back in order): CoNLL sentences run from 1 to 100+ words, and padding
    # every batch to its longest sentence doubles the encoder's work.
    order = sorted(range(len(items)), key=lambda i: len(items[i][0]))
    per_item: list[tuple[np.ndarray, list[str]] | None] = [None] * len(items)
    for start in tqdm(range(0, len(items), batch_size), desc=desc, disable=not progress, leave=False):
        idx = order[start:start + batch_size]
        batch = [items[i] for i in idx]
        texts = [" ".join(words) for words, _ in batch]
        enc = tokenizer(texts, max_length=max_length, return_offsets=True)
        offsets = enc.pop("offset_mapping")
        with torch.no_grad():
            out = encoder(**{k: v.to(device) for k, v in enc.items()}, output_hidden_states=True)
            hidden = torch.stack(out.hidden_states, 0).cpu()  # [L+1, B, T, H]
        for b, (words, tags) in enumerate(batch):
            mask = enc["attention_mask"][b].bool()
            if sentence_level:
                per_item[idx[b]] = (hidden[:, b][:, mask].mean(1).float().numpy()[:, None], [tags[0]])
                continue
            starts, pos = {}, 0
            for w, word in enumerate(words):  # character start of every word in the joined text
                starts[pos] = w
                pos += len(word) + 1
            first = [(t, starts[int(o[0])]) for t, o in enumerate(offsets[b].tolist())
                     if o[1] > o[0] and int(o[0]) in starts]
            seen: set[int] = set()
            keep = [(t, w) for t, w in first if not (w in seen or seen.add(w))]  # the first sub-token per word
            if keep:
                per_item[idx[b]] = (hidden[:, b, [t for t, _ in keep]].float().numpy(), [tags[w] for _, w in keep])
    kept = [x for x in per_item if x is not None]
    feats = [f for f, _ in kept]
    labels = [label for _, labels_ in kept for label in labels_]
    return np.concatenate(feats, axis=1).astype(np.float32, copy=False), labels


def fit_probes(x_train: np.ndarray, y_train: list[str], x_test: np.ndarray, y_test: list[str], epochs: int = 8,
               batch_size: int = 1024, lr: float = 3e-2, c: float = 1.0, min_steps: int = 500, seed: int = 0,
               progress: bool = False, desc: str = "probes") -> list[float]:
    """Test accuracy of one softmax-regression probe per layer, all layers trained at once: x [L, N, H] -> L
    accuracies. Each layer's features are standardised with its training mean and std; the objective is
    scikit-learn's LogisticRegression's (mean cross-entropy + ||W||^2 / (2 C N)), minimised with Adam over
    shuffled mini-batches instead of L-BFGS, because one batched [L, B, H] x [L, H, C] product trains every layer's
    probe in the time lbfgs takes for one (the full CoNLL train split is ~200k words). A test label never seen in
    training counts as wrong. Small training sets get more epochs, so that every fit takes at least `min_steps`
    steps."""
    classes = sorted(set(y_train))
    index = {label: k for k, label in enumerate(classes)}
    gen = torch.Generator().manual_seed(seed)
    x = torch.from_numpy(np.ascontiguousarray(x_train, dtype=np.float32))
    mean, std = x.mean(1, keepdim=True), x.std(1, keepdim=True).clamp_min(1e-6)
    x = (x - mean) / std
    y = torch.tensor([index[label] for label in y_train])
    layers, n, h = x.shape
    weight = torch.zeros(layers, h, len(classes), requires_grad=True)
    bias = torch.zeros(layers, 1, len(classes), requires_grad=True)
    opt = torch.optim.Adam([weight, bias], lr=lr)
    per_epoch = -(-n // batch_size)
    epochs = max(epochs, -(-min_steps // per_epoch))
    steps = epochs * per_epoch
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 - step / steps)  # linear decay to 0
    l2 = 1.0 / (2 * c * n)
    for _ in tqdm(range(epochs), desc=desc, disable=not progress, leave=False):
        for idx in torch.randperm(n, generator=gen).split(batch_size):
            logits = torch.baddbmm(bias, x[:, idx], weight)  # [L, B, C]
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y[idx].repeat(layers), reduction="sum")
            loss = loss / len(idx) + l2 * weight.pow(2).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    with torch.no_grad():
        xt = (torch.from_numpy(np.ascontiguousarray(x_test, dtype=np.float32)) - mean) / std
        pred = torch.baddbmm(bias, xt, weight).argmax(-1)  # [L, N_test]
    yt = torch.tensor([index.get(label, -1) for label in y_test])
    return [float(v) for v in (pred == yt).float().mean(1)]


def random_like(encoder: Encoder, seed: int = 0) -> Encoder:
    """The control: the same architecture (and config) with fresh random weights, on the encoder's device."""
    torch.manual_seed(seed)
    return Encoder(encoder.config).to(next(encoder.parameters()).device).eval()


def probe(encoder: Encoder, tokenizer: Tokenizer, task: str, train: list, test: list, batch_size: int = 32,
          max_length: int = 128, epochs: int = 8, seed: int = 0, control: bool = True,
          progress: bool = True) -> ProbeResult:
    """Per-layer probe accuracy of `encoder` on (train, test) items, with the random-init and majority controls."""
    sentence = task == "sst2"
    max_length = fit_length(max_length, encoder.config)  # a default: never past the model's positions
    results = []
    models = [("model", encoder)] + ([("control", random_like(encoder, seed))] if control else [])
    y_train = y_test = []
    for name, model in models:
        x_train, y_train = layer_features(model, tokenizer, train, sentence, batch_size, max_length, progress,
                                          f"{name} features (train)")
        x_test, y_test = layer_features(model, tokenizer, test, sentence, batch_size, max_length, progress,
                                        f"{name} features (test)")
        results.append(fit_probes(x_train, y_train, x_test, y_test, epochs, seed=seed, progress=progress,
                                  desc=f"{name} probes ({len(x_train)} layers)"))
        del x_train, x_test  # [L+1, N, H] each: gone before the next model's features are computed
    majority_label = Counter(y_train).most_common(1)[0][0]
    majority = float(np.mean([y == majority_label for y in y_test]))
    return ProbeResult(task, results[0], results[1] if control else [], majority, len(y_train), len(y_test))


def plot_probe(results: list[ProbeResult]):
    """Accuracy per layer: solid the trained encoder, dashed the random-init control, dotted the majority class."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    for k, r in enumerate(results):
        color = f"C{k}"
        ax.plot(range(len(r.accuracy)), r.accuracy, "o-", color=color, label=f"{r.task}")
        if r.control:
            ax.plot(range(len(r.control)), r.control, "s--", color=color, alpha=0.6, label=f"{r.task} random init")
        ax.axhline(r.majority, color=color, ls=":", alpha=0.6)
    ax.set_xlabel("layer (0 = embeddings)")
    ax.set_ylabel("probe accuracy")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
