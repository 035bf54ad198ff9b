"""Head importance (Michel et al. 2019, "Are Sixteen Heads Really Better than One?") and head pruning.

A head's importance is the expected absolute gradient of the task loss with respect to a mask weight on that head
(all weights 1): I_h = E_x |dL/dxi_h|, normalised per layer by the L2 norm as in the paper. The same function scores
heads for `bertforge analyze importance` and chooses what `bertforge prune` removes (one implementation).

    model, kind, enc, labels, task = load_task_data("sst2-model/", "sst2", "dev.tsv")
    scores = head_importance(model, enc)                    # [L, H] numpy, NaN where a head was pruned earlier
    mask = iterative_mask(model, enc, fraction=0.4)         # [L, H] 0/1: the heads to keep
    prune_masked(model, mask)                               # physically remove the zeros
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from bertforge.errors import BertforgeError
from bertforge.io.tables import source_name
from bertforge.families.family import CANONICAL_ENCODER
from bertforge.model import Encoder
from bertforge.tasks.batching import TRAIN_KEYS, make_collate, row_length


def encoder_of(model: nn.Module) -> Encoder:
    """The Encoder inside a task model (`.bert`) or the model itself."""
    enc = model if isinstance(model, Encoder) else getattr(model, CANONICAL_ENCODER, None)
    if not isinstance(enc, Encoder):
        raise BertforgeError(f"{type(model).__name__} has no bertforge encoder to score heads on")
    return enc


def load_task_data(model_dir: Any, task: str, data: Any, split: str = "dev", data_config: str | None = None,
                   text_col: str | None = None, text_pair_col: str | None = None,
                   label_col: str | None = None) -> tuple[nn.Module, Any, Any, Any, dict]:
    """A fine-tuned model (a folder, or an opened `ModelFolder`) and its labelled task data, encoded: (model, kind,
    encoded, labels, saved task). `data` is one file (or table), or a folder of splits / a hub dataset whose `split`
    is read (the other of train and dev where it has no such split); columns not named are the model's own where
    the data has them."""
    from bertforge.model.folder import ModelFolder
    from bertforge.tasks.finetune import fit_task_length
    from bertforge.tasks.folders import saved_task
    from bertforge.tasks.kinds import kind_from_saved
    from bertforge.tasks.models import load_task_model

    folder = ModelFolder.open(model_dir)
    path = folder.path
    saved, labels = saved_task(folder)
    if task not in (saved.get("name"), saved.get("kind")):
        raise BertforgeError(f"{path}: this model was fine-tuned for {saved.get('name')!r} "
                             f"({saved.get('kind')}), not --task {task!r}")
    kind = kind_from_saved(path, saved, labels, text_col, text_pair_col, label_col)
    fit_task_length(kind, folder, flag=None)  # the length its config.json records must fit its positions
    other = "train" if split != "train" else "dev"
    source = kind.split_source(data, split, data_config)
    if source is None:
        source = kind.split_source(data, other, data_config)
    if source is None:
        raise BertforgeError(f"{source_name(data)}: no {split} or {other} split (expected {kind.data_files(split)[0]})")
    examples = kind.read(source)
    kind.check(examples, source)
    enc = kind.encode(examples, folder.tokenizer())
    model, saved, labels = load_task_model(folder)
    return model, kind, enc, labels, saved


def _batches(enc, batch_size: int):
    """Length-sorted padded batches of the encoded rows, with their labels."""
    collate = make_collate(enc.pad_id)
    order = sorted(range(len(enc.rows)), key=lambda i: -row_length(enc.rows[i]))
    for start in range(0, len(order), batch_size):
        rows = [{k: v for k, v in enc.rows[i].items() if k in TRAIN_KEYS} for i in order[start:start + batch_size]]
        yield collate(rows)


def head_importance(model: nn.Module, enc, mask: np.ndarray | None = None, batch_size: int = 32,
                    max_examples: int | None = None, normalize: bool = True, progress: bool = True) -> np.ndarray:
    """[L, H] importance of every head on the encoded task data (`mask`: [L, H] weights, 1 = keep; default all
    ones). Heads already pruned from the model are NaN. The model is left as it was (eval mode, no mask)."""
    encoder = encoder_of(model)
    counts = [layer.attention.self.n_heads for layer in encoder.encoder.layer]
    width = encoder.config.num_attention_heads
    base = np.ones((len(counts), width)) if mask is None else mask
    device = next(model.parameters()).device
    weights = [torch.tensor(base[i, :n], dtype=torch.float32, device=device, requires_grad=True)
               for i, n in enumerate(counts)]
    if max_examples is not None and len(enc.rows) > max_examples:
        enc = type(enc)(enc.examples[:max_examples], enc.rows[:max_examples], enc.pad_id, enc.windows)
    was_training, grads_were = model.training, [p.requires_grad for p in model.parameters()]
    model.eval()  # no dropout: the gradient of the function the model computes at inference
    model.requires_grad_(False)  # only the mask needs gradients
    encoder.head_mask = weights
    total = [torch.zeros(n, device=device) for n in counts]
    try:
        n_batches = math.ceil(len(enc.rows) / batch_size)
        for batch in tqdm(_batches(enc, batch_size), total=n_batches, desc="head importance", disable=not progress):
            out = model(**{k: v.to(device) for k, v in batch.items()})
            if "loss" not in out:
                raise BertforgeError("head importance needs labelled data (the model returned no loss)")
            grads = torch.autograd.grad(out["loss"], weights)
            for t, g in zip(total, grads):
                t += g.abs()
    finally:
        encoder.head_mask = None
        model.train(was_training)
        for p, g in zip(model.parameters(), grads_were):
            p.requires_grad_(g)
    scores = np.full((len(counts), width), np.nan)
    for i, t in enumerate(total):
        v = t.cpu().numpy()
        if normalize:  # Michel et al.: importance normalised per layer (L2), so layers compare
            v = v / (np.linalg.norm(v) + 1e-20)
        scores[i, :len(v)] = v
    return scores


def iterative_mask(model: nn.Module, enc, fraction: float, step: float = 0.1, batch_size: int = 32,
                   max_examples: int | None = None, progress: bool = True) -> np.ndarray:
    """Michel et al.'s iterative pruning: remove the least important `step` share of heads, re-score with them
    masked, repeat until `fraction` of the heads are gone. Every layer keeps at least one head. [L, H] 0/1."""
    mask = None
    for mask in iterative_masks(model, enc, fraction, step, batch_size, max_examples, progress):
        pass
    return mask


def iterative_masks(model: nn.Module, enc, fraction: float, step: float = 0.1, batch_size: int = 32,
                    max_examples: int | None = None, progress: bool = True):
    """The masks of `iterative_mask` after each of its steps (a copy each), from all ones to the final one:
    one pass gives a whole pruning curve."""
    if not 0.0 < fraction < 1.0:
        raise BertforgeError(f"--fraction must be between 0 and 1 (exclusive), got {fraction}")
    encoder = encoder_of(model)
    counts = [layer.attention.self.n_heads for layer in encoder.encoder.layer]
    width = encoder.config.num_attention_heads
    mask = np.zeros((len(counts), width))
    for i, n in enumerate(counts):
        mask[i, :n] = 1.0
    total = sum(counts)
    target = min(int(round(fraction * total)), total - len(counts))
    per_step = max(1, int(round(step * total)))
    yield mask.copy()
    while total - int(mask.sum()) < target:
        scores = head_importance(model, enc, mask, batch_size, max_examples, progress=progress)
        candidates = [(scores[i, h], i, h) for i in range(len(counts)) for h in range(counts[i]) if mask[i, h]]
        removed, quota = 0, min(per_step, target - (total - int(mask.sum())))
        for _, i, h in sorted(candidates):
            if removed == quota:
                break
            if mask[i].sum() > 1:  # a layer without heads would need a special case; keep one
                mask[i, h] = 0.0
                removed += 1
        if removed == 0:
            break
        yield mask.copy()


def prune_masked(model: nn.Module, mask: np.ndarray) -> dict[int, list[int]]:
    """Physically remove every head whose mask is 0; returns {layer: [removed heads]}. A task model's config
    follows the encoder's (heads_per_layer), so `save_task_model` writes the smaller layout."""
    encoder = encoder_of(model)
    heads = {i: [int(h) for h in np.flatnonzero(row[:layer.attention.self.n_heads] == 0)]
             for i, (row, layer) in enumerate(zip(mask, encoder.encoder.layer))}
    encoder.prune_heads(heads)
    if hasattr(model, "config") and model is not encoder:
        model.config = model.config.replace(heads_per_layer=encoder.config.heads_per_layer)
    return {i: h for i, h in heads.items() if h}


def short_finetune(model: nn.Module, enc, steps: int, lr: float = 2e-5, batch_size: int = 32,
                   seed: int = 0, progress: bool = True) -> None:
    """A few AdamW steps on the task data, to recover what pruning cost (Michel et al. do not; many do)."""
    if steps <= 0:
        return
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    collate = make_collate(enc.pad_id)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    for _ in tqdm(range(steps), desc="re-fine-tune", disable=not progress):
        idx = torch.randint(len(enc.rows), (min(batch_size, len(enc.rows)),), generator=gen).tolist()
        batch = collate([{k: v for k, v in enc.rows[i].items() if k in TRAIN_KEYS} for i in idx])
        loss = model(**{k: v.to(device) for k, v in batch.items()})["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def plot_importance(scores: np.ndarray, title: str = "head importance (Michel et al.)"):
    """A layer x head heat map of importance scores. Returns the matplotlib Figure."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    L, H = scores.shape
    fig, ax = plt.subplots(figsize=(0.45 * H + 1.5, 0.45 * L + 1.2))
    im = ax.imshow(np.ma.masked_invalid(scores), cmap="viridis")
    for i in range(L):
        for h in range(H):
            if not np.isnan(scores[i, h]):
                ax.text(h, i, f"{scores[i, h]:.2f}", ha="center", va="center", fontsize=5, color="w")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    return fig
