"""Attention maps of one input: arrays, a matplotlib grid of heat maps, and a self-contained HTML viewer.

    encoder, tok = load_encoder("model/")
    maps = attention_maps(encoder, tok, "The cat sat.")     # maps.tokens, maps.attn [L, H, T, T]
    fig = plot_attention(maps, layers=[0, 5], heads=None)  # a matplotlib Figure
    Path("att.html").write_text(attention_html(maps))      # hover a token: where every head attends from it
"""
from __future__ import annotations

import html
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bertforge.config.positions import check_length, position_limit
from bertforge.errors import BertforgeError
from bertforge.model import Encoder, ModelFolder
from bertforge.tokenization import Tokenizer

log = logging.getLogger(__name__)


@dataclass
class AttentionMaps:
    tokens: list[str]
    attn: np.ndarray          # [L, H, T, T]: row = the attending token, column = the attended one
    truncated: bool = False   # the input was longer than the model's maximum and was cut


def load_encoder(path: "str | Path | ModelFolder") -> tuple[Encoder, Tokenizer]:
    """The encoder (eager attention, so probabilities exist) and tokenizer of any bertforge/HF checkpoint dir."""
    folder = ModelFolder.open(path)
    if folder.graph is not None:
        raise BertforgeError(f"{folder.graph}: an ONNX export has no attention outputs; analyse the PyTorch "
                             "checkpoint it was exported from")
    return Encoder.from_pretrained(folder, attn_implementation="eager"), folder.tokenizer()


def token_strings(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    return tokenizer.convert_ids_to_tokens(ids)


def attention_maps(encoder: Encoder, tokenizer: Tokenizer, text: str, pair: str | None = None,
                   max_length: int | None = None) -> AttentionMaps:
    """Every layer's and head's attention probabilities for one text (pair). Longer inputs are truncated to
    `max_length` (beyond the model's positions: refused), by default the model's maximum (and said so in the log
    and in `truncated`)."""
    if not text.strip():
        raise BertforgeError("--text is empty")
    if max_length is not None:
        check_length(max_length, encoder.config, "the model", "--max-length")
    limit = max_length or position_limit(encoder.config) or encoder.config.max_position_embeddings
    full = tokenizer(text, pair, max_length=10 ** 6, truncation=False)["input_ids"].shape[1]
    enc = tokenizer(text, pair, max_length=limit)
    truncated = full > enc["input_ids"].shape[1]
    if truncated:
        log.warning("the input has %d tokens, more than the model's maximum %d: truncated", full, limit)
    device = next(encoder.parameters()).device  # the model's: a GPU model gets GPU inputs
    with torch.no_grad():
        out = encoder(**{k: v.to(device) for k, v in enc.items()}, output_attentions=True)
    if out.attentions is None or any(a is None for a in out.attentions):
        raise BertforgeError("this model returned no attention probabilities")
    width = encoder.config.num_attention_heads
    layers = []
    for a in out.attentions:  # pruned layers have fewer heads: pad with NaN so the array stays rectangular
        a = a[0].float().cpu().numpy()
        if a.shape[0] < width:
            a = np.concatenate([a, np.full((width - a.shape[0], *a.shape[1:]), np.nan)])
        layers.append(a)
    return AttentionMaps(token_strings(tokenizer, enc["input_ids"][0].tolist()), np.stack(layers), truncated)


def _select(n: int, chosen: list[int] | None, what: str) -> list[int]:
    if chosen is None:
        return list(range(n))
    bad = [i for i in chosen if not 0 <= i < n]
    if bad:
        raise BertforgeError(f"--{what} {bad[0]} out of range (the model has {n} {what}: 0..{n - 1})")
    return list(chosen)


def plot_attention(maps: AttentionMaps, layers: list[int] | None = None, heads: list[int] | None = None):
    """A grid of heat maps: one row per layer, one column per head. Returns the matplotlib Figure."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    L, H, T, _ = maps.attn.shape
    rows, cols = _select(L, layers, "layers"), _select(H, heads, "heads")
    size = 1.6 if T <= 24 else 2.4
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(size * len(cols) + 1, size * len(rows) + 1),
                             squeeze=False)
    labels = T <= 40  # beyond that tick labels overlap: the HTML view is the one to read tokens in
    for r, layer in enumerate(rows):
        for c, head in enumerate(cols):
            ax = axes[r][c]
            ax.imshow(maps.attn[layer, head], cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_xticks(range(T) if labels else [])
            ax.set_yticks(range(T) if labels and c == 0 else [])
            if labels:
                ax.set_xticklabels(maps.tokens, rotation=90, fontsize=5)
                if c == 0:
                    ax.set_yticklabels(maps.tokens, fontsize=5)
            ax.set_title(f"L{layer} H{head}", fontsize=7)
    fig.tight_layout()
    return fig


_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><title>bertforge attention</title>
<style>
body{font-family:sans-serif;margin:16px}
.tok{display:inline-block;padding:2px 4px;margin:1px;border-radius:3px;cursor:pointer;font-size:13px}
.head{margin:4px 0;white-space:nowrap}
.lab{display:inline-block;width:46px;font-size:11px;color:#555}
#src .tok:hover{outline:2px solid #c00}
</style></head><body>
<h3>Attention, layer <select id="layer"></select> &mdash; hover a token</h3>
<div id="src"></div><p id="note">__NOTE__</p><div id="heads"></div>
<script>
const DATA = __DATA__;
const sel = document.getElementById('layer');
DATA.layers.forEach((l, i) => { const o = document.createElement('option'); o.value = i; o.text = l; sel.add(o); });
function esc(s){return s.replace(/[&<>]/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;'}[c]));}
const src = document.getElementById('src');
DATA.tokens.forEach((t, i) => {
  const s = document.createElement('span'); s.className = 'tok'; s.textContent = t; s.style.background = '#eee';
  s.onmouseenter = () => show(i); src.appendChild(s);
});
function show(q){
  const li = +sel.value, box = document.getElementById('heads'); box.innerHTML = '';
  DATA.heads.forEach((h, hi) => {
    const row = DATA.attn[li][hi][q]; if (row === null) return;
    let out = '<div class="head"><span class="lab">H' + h + '</span>';
    DATA.tokens.forEach((t, k) => {
      const w = row[k];
      out += '<span class="tok" title="' + w.toFixed(3) + '" style="background:rgba(30,90,200,' + w + ')">'
             + esc(t) + '</span>';
    });
    box.innerHTML += out + '</div>';
  });
}
sel.onchange = () => show(0); show(0);
</script></body></html>
"""


def attention_html(maps: AttentionMaps, layers: list[int] | None = None, heads: list[int] | None = None) -> str:
    """A self-contained page (no CDN, works offline): pick a layer, hover a token, and every head's attention
    from that token colours the sentence."""
    L, H, T, _ = maps.attn.shape
    rows, cols = _select(L, layers, "layers"), _select(H, heads, "heads")
    # float64 before rounding: rounded float32 values print as 0.12800000607967377 in JSON
    attn = [[None if np.isnan(a).any() else np.round(a.astype(np.float64), 3).tolist()
             for a in (maps.attn[layer, head] for head in cols)] for layer in rows]
    data = {"tokens": maps.tokens, "layers": rows, "heads": cols, "attn": attn}
    note = "The input was longer than the model's maximum and was truncated." if maps.truncated else ""
    # "</" inside the JSON would close the <script> element early
    return _HTML.replace("__DATA__", json.dumps(data).replace("</", "<\\/")).replace("__NOTE__", html.escape(note))
