"""Layer-wise linear probes (Tenney et al. 2019, "BERT Rediscovers the Classical NLP Pipeline"; Hewitt & Liang
2019 on controls): frozen features from every layer, one scikit-learn logistic regression per layer.

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

from bertforge.errors import BertforgeError
from bertforge.files import tsv_rows
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

    @property
    def best_layer(self) -> int:
        return int(np.argmax(self.accuracy))


def read_items(task: str, path: str | Path, limit: int | None = None) -> list[tuple[list[str], list[str]]]:
    """(words, labels) per sentence: token tasks one label per word; sst2 one label for the whole sentence."""
    from bertforge.tasks.conll import read_conll

    if task not in TASKS:
        raise BertforgeError(f"unknown probing task {task!r} (choose from {', '.join(TASKS)})")
    if task == "sst2":
        rows = tsv_rows(path)
        _, header = next(rows, (0, []))
        if "sentence" not in header or "label" not in header:
            raise BertforgeError(f"{path}: no 'sentence' and 'label' columns in the header (an SST-2 TSV file)")
        s, y = header.index("sentence"), header.index("label")
        items = [(r[s].split(), [r[y]]) for _, r in rows if len(r) > max(s, y)]
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
    feats: list[np.ndarray] = []
    labels: list[str] = []
    for start in tqdm(range(0, len(items), batch_size), desc=desc, disable=not progress, leave=False):
        batch = items[start:start + batch_size]
        texts = [" ".join(words) for words, _ in batch]
        enc = tokenizer(texts, max_length=max_length, return_offsets=True)
        offsets = enc.pop("offset_mapping")
        with torch.no_grad():
            hidden = torch.stack(encoder(**enc, output_hidden_states=True).hidden_states, 0)  # [L+1, B, T, H]
        for b, (words, tags) in enumerate(batch):
            mask = enc["attention_mask"][b].bool()
            if sentence_level:
                feats.append(hidden[:, b][:, mask].mean(1).numpy()[:, None])
                labels.append(tags[0])
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
                feats.append(hidden[:, b, [t for t, _ in keep]].numpy())
                labels.extend(tags[w] for _, w in keep)
    return np.concatenate(feats, axis=1).astype(np.float32), labels


def fit_probe(x_train: np.ndarray, y_train: list[str], x_test: np.ndarray, y_test: list[str],
              max_iter: int = 300, seed: int = 0) -> float:
    """Accuracy of a logistic-regression probe (features standardised) trained on one layer's features."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=max_iter, random_state=seed))
    clf.fit(x_train, y_train)
    return float(clf.score(x_test, y_test))


def random_like(encoder: Encoder, seed: int = 0) -> Encoder:
    """The control: the same architecture (and config) with fresh random weights."""
    torch.manual_seed(seed)
    return Encoder(encoder.config).eval()


def probe(encoder: Encoder, tokenizer: Tokenizer, task: str, train: list, test: list, batch_size: int = 32,
          max_length: int = 128, max_iter: int = 300, seed: int = 0, control: bool = True,
          progress: bool = True) -> ProbeResult:
    """Per-layer probe accuracy of `encoder` on (train, test) items, with the random-init and majority controls."""
    sentence = task == "sst2"
    results = []
    models = [("model", encoder)] + ([("control", random_like(encoder, seed))] if control else [])
    y_train = y_test = []
    for name, model in models:
        x_train, y_train = layer_features(model, tokenizer, train, sentence, batch_size, max_length, progress,
                                          f"{name} features (train)")
        x_test, y_test = layer_features(model, tokenizer, test, sentence, batch_size, max_length, progress,
                                        f"{name} features (test)")
        accs = [fit_probe(x_train[i], y_train, x_test[i], y_test, max_iter, seed)
                for i in tqdm(range(len(x_train)), desc=f"{name} probes", disable=not progress)]
        results.append(accs)
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
