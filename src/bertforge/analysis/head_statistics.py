"""Per-head attention statistics over a corpus (Clark et al. 2019, "What Does BERT Look At?").

For every head, averaged over all (non-padding) attending tokens of the corpus: the attention mass on [CLS], on
[SEP], on punctuation, on the token itself, on the previous and on the next token, and the entropy of the
distribution. Heads are clustered by the Jensen-Shannon distance between their attention distributions on the
same tokens (Clark et al., section 6), with scipy's hierarchical clustering.

    stats = head_statistics(encoder, tokenizer, sentences)  # stats.values["sep"] is [L, H], ...
    stats.table()                                          # rows for the docs
"""
from __future__ import annotations

import string
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from bertforge.errors import BertforgeError
from bertforge.model import Encoder
from bertforge.tokenization import Tokenizer

STATS = ("cls", "sep", "punct", "self", "prev", "next", "entropy")
PUNCT = set(string.punctuation) | set("“”‘’–—…«»")


def is_punctuation(token: str) -> bool:
    t = token.removeprefix("##").lstrip("Ġ▁")
    return bool(t) and all(c in PUNCT for c in t)


def sentence_sums(attn: np.ndarray, sep: np.ndarray, punct: np.ndarray) -> dict[str, np.ndarray]:
    """Sums over the attending tokens of one sentence: attn [L, H, T, T] (rows sum to 1), sep/punct bool [T].
    Position 0 is [CLS]. `prev` at the first token and `next` at the last count as 0 (no such token)."""
    T = attn.shape[-1]
    idx = np.arange(T)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(attn > 0, attn * np.log(attn), 0.0).sum(-1)
    return {
        "cls": attn[..., 0].sum(-1),
        "sep": attn[..., sep].sum(-1).sum(-1),
        "punct": attn[..., punct].sum(-1).sum(-1),
        "self": attn[..., idx, idx].sum(-1),
        "prev": attn[..., idx[1:], idx[:-1]].sum(-1),
        "next": attn[..., idx[:-1], idx[1:]].sum(-1),
        "entropy": ent.sum(-1),
    }


def js_distances(attn: np.ndarray) -> np.ndarray:
    """Summed Jensen-Shannon divergence between every pair of heads over one sentence's attending tokens:
    attn [N heads, T, T] -> [N, N]."""
    p = attn[:, None]                    # [N, 1, T, T]
    q = attn[None, :]                    # [1, N, T, T]
    m = (p + q) / 2

    def kl(a, b):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(a > 0, a * (np.log(a) - np.log(b)), 0.0).sum(-1)

    return (0.5 * kl(p, m) + 0.5 * kl(q, m)).sum(-1)


@dataclass
class HeadStats:
    values: dict[str, np.ndarray]        # name -> [L, H] averages per attending token
    tokens: int                          # attending tokens averaged over
    sentences: int
    js: np.ndarray | None = None         # [L*H, L*H] mean JS divergence per token (heads in layer-major order)
    clusters: list[int] = field(default_factory=list)  # a cluster id per head (layer-major)
    seconds: float = 0.0                 # how long computing it took

    def table(self) -> list[dict]:
        """One row per head: layer, head and every statistic (rounded)."""
        L, H = self.values["cls"].shape
        return [{"layer": i, "head": h, **{k: round(float(self.values[k][i, h]), 4) for k in STATS}}
                for i in range(L) for h in range(H)]

    def patterns(self, threshold: float = 0.5) -> dict[str, list[str]]:
        """Clark et al.'s patterns: heads with more than `threshold` of their mass on one target."""
        return {k: [f"L{i}H{h}" for i, h in zip(*np.nonzero(self.values[k] > threshold))]
                for k in ("cls", "sep", "punct", "self", "prev", "next")}


def head_statistics(encoder: Encoder, tokenizer: Tokenizer, sentences: list[str], batch_size: int = 32,
                    max_length: int = 128, js_sentences: int = 200, n_clusters: int = 8,
                    progress: bool = True) -> HeadStats:
    """Clark et al.'s statistics of every head over `sentences` (one text each). JS distances use the first
    `js_sentences` (pairwise over heads, the costly part)."""
    if not sentences:
        raise BertforgeError("no sentences to analyse (the input is empty)")
    cfg = encoder.config
    if cfg.heads_per_layer is not None:
        raise BertforgeError("head statistics need every head: analyse the model before pruning")
    L, H = cfg.num_hidden_layers, cfg.num_attention_heads
    sums = {k: np.zeros((L, H)) for k in STATS}
    js_sum, js_tokens, tokens = np.zeros((L * H, L * H)), 0, 0
    sep_id = tokenizer.token_to_id(tokenizer.sep_token)
    encoder.eval()
    device = next(encoder.parameters()).device  # the model's: a GPU model gets GPU inputs
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))  # similar lengths, less padding
    for start in tqdm(range(0, len(order), batch_size), desc="head statistics", disable=not progress):
        idx = order[start:start + batch_size]
        enc = tokenizer([sentences[i] for i in idx], max_length=max_length)
        with torch.no_grad():
            out = encoder(**{k: v.to(device) for k, v in enc.items()}, output_attentions=True)
        attn = torch.stack(out.attentions, 1).float().cpu().numpy()  # [B, L, H, T, T]
        for b, i in enumerate(idx):
            n = int(enc["attention_mask"][b].sum())
            ids = enc["input_ids"][b, :n].tolist()
            a = attn[b, :, :, :n, :n]
            punct = np.array([is_punctuation(t) for t in tokenizer.convert_ids_to_tokens(ids)])
            for k, v in sentence_sums(a, np.array(ids) == sep_id, punct).items():
                sums[k] += v
            tokens += n
            if i < js_sentences:
                js_sum += js_distances(a.reshape(L * H, n, n))
                js_tokens += n
    stats = HeadStats({k: v / tokens for k, v in sums.items()}, tokens, len(sentences))
    if js_tokens:
        stats.js = js_sum / js_tokens
        stats.clusters = cluster_heads(stats.js, n_clusters)
    return stats


def cluster_heads(js: np.ndarray, n_clusters: int = 8) -> list[int]:
    """Average-linkage hierarchical clustering of heads on sqrt(JS divergence) (a metric)."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    dist = np.sqrt(np.clip((js + js.T) / 2, 0.0, None))
    np.fill_diagonal(dist, 0.0)
    z = linkage(squareform(dist, checks=False), method="average")
    return [int(c) for c in fcluster(z, t=min(n_clusters, len(js)), criterion="maxclust")]


def plot_statistics(stats: HeadStats):
    """One layer x head heat map per statistic. Returns the matplotlib Figure."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(STATS), figsize=(2.3 * len(STATS), 2.8))
    for ax, k in zip(axes, STATS):
        v = stats.values[k]
        im = ax.imshow(v, cmap="magma", vmin=0, vmax=None if k == "entropy" else 1)
        ax.set_title(k, fontsize=9)
        ax.set_xlabel("head", fontsize=7)
        ax.set_ylabel("layer", fontsize=7)
        ax.set_xticks(range(v.shape[1]))
        ax.set_yticks(range(v.shape[0]))
        ax.tick_params(labelsize=5)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    return fig


def plot_clusters(stats: HeadStats):
    """The heads in 2-D by classical multidimensional scaling of their JS distances, coloured by layer (Clark
    et al., Figure 6). Returns the matplotlib Figure."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if stats.js is None:
        raise BertforgeError("no JS distances were computed")
    d2 = np.clip((stats.js + stats.js.T) / 2, 0.0, None)  # squared distances: JS divergence = sqrt(JS)^2
    n = len(d2)
    j = np.eye(n) - 1.0 / n
    b = -0.5 * j @ d2 @ j
    w, v = np.linalg.eigh(b)
    xy = v[:, -2:] * np.sqrt(np.clip(w[-2:], 0, None))
    L, H = stats.values["cls"].shape
    fig, ax = plt.subplots(figsize=(5, 4))
    sc = ax.scatter(xy[:, 1], xy[:, 0], c=np.repeat(np.arange(L), H), cmap="viridis", s=18)
    for k in range(n):
        ax.annotate(f"{k // H}-{k % H}", (xy[k, 1], xy[k, 0]), fontsize=5)
    fig.colorbar(sc, ax=ax, label="layer")
    ax.set_title("heads by Jensen-Shannon distance (MDS)", fontsize=9)
    fig.tight_layout()
    return fig
