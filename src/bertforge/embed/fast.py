"""An inference-only copy of an `Encoder` with fused Q/K/V projections.

One [3H, H] matmul instead of three [H, H] ones cuts per-layer kernel launches and Python overhead, which is most
of the cost for short sentences on CPU. The copy never trains: it is rebuilt from the source encoder whenever the
source's parameters change (see `EncoderCache`). `bertforge.model` stays the single trainable implementation.
"""
from __future__ import annotations

import copy
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

from bertforge.model import Encoder, activation


class FusedLayer(nn.Module):
    """A post-LN Transformer layer (same maths as `bertforge.model.Layer`) with one QKV projection."""

    def __init__(self, layer: nn.Module, n_heads: int, hidden_act: str):
        super().__init__()
        sa = layer.attention.self
        h = sa.query.in_features
        self.qkv = nn.Linear(h, 3 * h)
        with torch.no_grad():
            self.qkv.weight.copy_(torch.cat([sa.query.weight, sa.key.weight, sa.value.weight], dim=0))
            self.qkv.bias.copy_(torch.cat([sa.query.bias, sa.key.bias, sa.value.bias], dim=0))
        self.attn_out = copy.deepcopy(layer.attention.output.dense)
        self.attn_norm = copy.deepcopy(layer.attention.output.LayerNorm)
        self.ffn_in = copy.deepcopy(layer.intermediate.dense)
        self.ffn_out = copy.deepcopy(layer.output.dense)
        self.ffn_norm = copy.deepcopy(layer.output.LayerNorm)
        self.n_heads, self.head_dim = n_heads, h // n_heads
        self.act = activation(hidden_act)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        B, T, H = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = self.attn_norm(self.attn_out(ctx.transpose(1, 2).reshape(B, T, H)) + x)
        return self.ffn_norm(self.ffn_out(self.act(self.ffn_in(x))) + x)


class FusedEncoder(nn.Module):
    """Inference copy of an `Encoder`: returns the last hidden state only."""

    def __init__(self, encoder: Encoder):
        super().__init__()
        cfg = encoder.config
        self.embeddings = copy.deepcopy(encoder.embeddings)
        self.embeddings_project = copy.deepcopy(encoder.embeddings_project)
        self.layers = nn.ModuleList(FusedLayer(layer, cfg.num_attention_heads, cfg.hidden_act)
                                    for layer in encoder.encoder.layer)
        self.eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embeddings(input_ids, token_type_ids)
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)
        # None when the batch has no padding: SDPA then takes its unmasked (fastest) kernel.
        mask = attention_mask[:, None, None, :].bool() if attention_mask is not None else None
        for layer in self.layers:
            x = layer(x, mask)
        return x


PRECISIONS = ("fp32", "bf16", "int8")


def build_fast_encoder(encoder: Encoder, precision: str = "fp32") -> nn.Module:
    """A fused copy of `encoder` in fp32, bf16 (weights cast) or int8 (dynamic quantisation of every Linear)."""
    fused = FusedEncoder(encoder)
    if precision == "bf16":
        return fused.to(torch.bfloat16)
    if precision == "int8":
        # Dynamic quantisation: int8 weights (per output channel), activations quantised per batch on the fly, no
        # calibration data. The FFN output projection stays fp32: its input (GELU of the up-projection) has
        # outlier features that a single per-tensor activation scale crushes (mean cosine to fp32 on STS
        # sentences 0.978 with it quantised, 0.988 without; measured in benchmarks/embed_throughput.py).
        spec = {name: per_channel_dynamic_qconfig for name, mod in fused.named_modules()
                if isinstance(mod, nn.Linear) and not name.endswith("ffn_out")}
        with warnings.catch_warnings():  # torch.ao deprecation notices: the API is still the supported CPU path
            warnings.simplefilter("ignore")
            return quantize_dynamic(fused, spec, dtype=torch.qint8)
    return fused


class EncoderCache:
    """Fast copies per precision, rebuilt when any source parameter has been modified in place (training)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[tuple, nn.Module]] = {}

    def get(self, encoder: Encoder, precision: str) -> nn.Module:
        # Every in-place update (optimizer.step, load_state_dict) bumps a tensor's version counter.
        stamp = (id(encoder),) + tuple(p._version for p in encoder.parameters())
        hit = self._entries.get(precision)
        if hit is None or hit[0] != stamp:
            hit = (stamp, build_fast_encoder(encoder, precision))
            self._entries[precision] = hit
        return hit[1]
