"""Token attributions for a task model's prediction with Integrated Gradients (Sundararajan et al. 2017), through
captum: the path integral of the gradient from a baseline (every token [PAD] but [CLS] and [SEP]) to the input,
taken at the word-embedding layer and summed over the embedding dimensions.

    attr = explain(model, tokenizer, "a great film")   # attr.tokens, attr.scores, attr.label, attr.delta
    Path("why.html").write_text(attribution_html(attr))
"""
from __future__ import annotations

import html
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.tokenization import Tokenizer

INSTALL = "captum is not installed: pip install 'bertforge[analysis]'"


@dataclass
class Attribution:
    tokens: list[str]
    scores: np.ndarray     # one attribution per token (sums to f(x) - f(baseline) up to `delta`)
    label: str
    probability: float
    delta: float           # captum's convergence delta: the completeness error of the integral


def explain(model: nn.Module, tokenizer: Tokenizer, text: str, labels: list[str] | None = None,
            target: int | None = None, steps: int = 50, max_length: int = 512) -> Attribution:
    """Integrated Gradients of the predicted (or `target`) class's logit with respect to the input tokens."""
    try:
        from captum.attr import LayerIntegratedGradients
    except ImportError:
        raise BertforgeError(INSTALL) from None
    if getattr(model, "kind", None) not in ("classify", "regress"):
        raise BertforgeError("explain needs a sentence classification or regression model "
                             f"(this one is {getattr(model, 'kind', type(model).__name__)!r})")
    if not text.strip():
        raise BertforgeError("--text is empty")
    model.eval()
    enc = tokenizer(text, max_length=min(max_length, model.config.max_position_embeddings))
    device = next(model.parameters()).device  # the model's: a GPU model gets GPU inputs
    ids, types, mask = (enc[k].to(device) for k in ("input_ids", "token_type_ids", "attention_mask"))
    special = torch.tensor([[i in tokenizer.special_ids for i in ids[0].tolist()]], device=device)
    baseline = torch.where(special, ids, torch.full_like(ids, tokenizer.pad_token_id))

    def forward(input_ids):
        n = input_ids.shape[0]
        return model(input_ids=input_ids, attention_mask=mask.expand(n, -1),
                     token_type_ids=types.expand(n, -1))["logits"]

    with torch.no_grad():
        logits = forward(ids)[0]
    if target is None:
        target = int(logits.argmax()) if logits.numel() > 1 else 0
    probability = float(logits.softmax(-1)[target]) if logits.numel() > 1 else float(logits[0])
    lig = LayerIntegratedGradients(forward, model.bert.embeddings.word_embeddings)
    attr, delta = lig.attribute(ids, baselines=baseline, target=target, n_steps=steps,
                                return_convergence_delta=True)
    scores = attr.sum(-1)[0].detach().cpu().numpy()
    name = labels[target] if labels else str(target)
    return Attribution(tokenizer.convert_ids_to_tokens(ids[0].tolist()), scores, name, probability,
                       float(delta.abs().max()))


def attribution_html(attr: Attribution) -> str:
    """The text with each token shaded by its attribution (green for, red against the predicted label)."""
    peak = float(np.abs(attr.scores).max()) or 1.0
    spans = []
    for tok, s in zip(attr.tokens, attr.scores):
        a = abs(float(s)) / peak
        color = f"rgba(0,150,0,{a:.3f})" if s >= 0 else f"rgba(200,0,0,{a:.3f})"
        spans.append(f'<span title="{float(s):+.4f}" style="background:{color};padding:2px 3px;margin:1px;'
                     f'border-radius:3px">{html.escape(tok)}</span>')
    return ("<!doctype html><html><head><meta charset='utf-8'><title>bertforge explain</title></head>"
            "<body style='font-family:sans-serif;margin:16px'>"
            f"<p>prediction: <b>{html.escape(attr.label)}</b> (p = {attr.probability:.3f}); Integrated Gradients, "
            f"convergence delta {attr.delta:.2e}. Green supports the prediction, red opposes it.</p>"
            f"<p style='line-height:2'>{''.join(spans)}</p></body></html>\n")


def plot_attribution(attr: Attribution):
    """A bar per token. Returns the matplotlib Figure."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4.0, 0.35 * len(attr.tokens)), 2.8))
    ax.bar(range(len(attr.tokens)), attr.scores, color=["C2" if s >= 0 else "C3" for s in attr.scores])
    ax.set_xticks(range(len(attr.tokens)))
    ax.set_xticklabels(attr.tokens, rotation=90, fontsize=7)
    ax.set_title(f"Integrated Gradients for '{attr.label}' (p = {attr.probability:.2f})", fontsize=9)
    fig.tight_layout()
    return fig
