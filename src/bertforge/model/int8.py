"""int8 weights on disk: what `bertforge quantize` writes and what loading a quantised folder reads.

A model whose encoder is `for_inference(..., "int8")` (torch's dynamic int8 Linear layers) saves to
`model.int8.safetensors`: every quantised Linear as its int8 weight (per output channel, symmetric) plus the
channel scales (float64, exactly as torch computed them) and its fp32 bias; every other tensor (embeddings,
LayerNorms, task heads; the FFN output projections in scheme 1 folders) as fp32. `quantize_linears` is the
recipe (`INT8_SCHEME`), recorded in config.json so that a folder always loads with the recipe it was saved with. Names are the int8 model's own module
paths (Q/K/V fused into `qkv`), so this is bertforge's layout, not Hugging Face's: transformers finds no
model.safetensors there and says so, instead of loading int8 numbers as if they were weights. Loading puts the
stored int8 weights and scales back into the same quantised modules, so the model computes exactly what the
quantised model that was saved computed.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
from torch.ao.quantization import (PerChannelMinMaxObserver, QConfig, default_dynamic_quant_observer,
                                   per_channel_dynamic_qconfig, quantize_dynamic)

from bertforge.model.checkpoint import INT8_WEIGHTS, read_tensors, write_tensors
from bertforge.errors import BertforgeError

QUANT_FIELD = "bertforge_quantization"  # config.json: how the folder was quantised (also: "load me as int8")
_SCALE = ".weight_scale"
# The int8 recipe, recorded as QUANT_FIELD["scheme"] (absent: 1), so that a folder loads with the recipe it was
# saved with. 1: every Linear but the FFN output projections, 8-bit weights, 7-bit activations (torch's default
# reduce_range). 2: every Linear, 7-bit weights, 8-bit activations (`Int8Linear`).
INT8_SCHEME = 2
# Scheme 2's weight range: |w| <= 64 and activations <= 255 keep fbgemm's AVX2 kernel (vpmaddubsw: two u8 x s8
# products summed in int16) below 32767; full-range weights with full-range activations saturate it there.
WEIGHT_RANGE = (-64, 63)


class Int8Linear(DynamicLinear):
    """torch's dynamic int8 Linear with activations quantised over the full 8 bits (torch's module uses 7,
    `reduce_range`, for the saturation that `WEIGHT_RANGE` rules out instead). The activation scale is one per
    batch, so a few outlier features (BERT's LayerNorm outputs have them) set it: the eighth bit halves the step
    every other feature is rounded to. all-MiniLM-L6-v2, STS-benchmark test, two `embed` calls: Spearman -0.57
    points with scheme 1, -0.12 with this (benchmarks/embed_onnx.py, docs/benchmarks.md)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self._packed_params._packed_params, False).to(x.dtype)


def quantize_linears(model: nn.Module, keep_fp32: set[int], scheme: int = INT8_SCHEME) -> None:
    """Replace `model`'s Linear layers (every path to one, shared ALBERT ones included: qconfigs are looked up by
    path) by dynamic int8 ones in place, except the modules whose ids are in `keep_fp32`."""
    if scheme == 1:
        qconfig, mapping = per_channel_dynamic_qconfig, None
    else:
        weight = PerChannelMinMaxObserver.with_args(dtype=torch.qint8, qscheme=torch.per_channel_symmetric,
                                                    quant_min=WEIGHT_RANGE[0], quant_max=WEIGHT_RANGE[1])
        qconfig = QConfig(activation=default_dynamic_quant_observer, weight=weight)
        mapping = {nn.Linear: Int8Linear}
    spec = {name: qconfig for name, mod in model.named_modules(remove_duplicate=False)
            if isinstance(mod, nn.Linear) and id(mod) not in keep_fp32}
    with warnings.catch_warnings():  # torch.ao deprecation notices: the API is still the supported CPU path
        warnings.simplefilter("ignore")
        quantize_dynamic(model, spec, dtype=torch.qint8, mapping=mapping, inplace=True)


def _quantised(model: nn.Module) -> dict[str, DynamicLinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, DynamicLinear)}


def _plain_state(model: nn.Module, qmods: dict[str, DynamicLinear]) -> dict[str, torch.Tensor]:
    """state_dict entries outside the quantised Linears, each shared tensor (ALBERT's layers) under its first name."""
    prefixes, seen, out = tuple(f"{name}." for name in qmods), set(), {}
    for key, value in model.state_dict().items():
        if key.startswith(prefixes) or not isinstance(value, torch.Tensor):
            continue
        ident = (value.data_ptr(), tuple(value.shape), value.dtype) if value.numel() else key
        if ident not in seen:
            seen.add(ident)
            out[key] = value
    return out


def int8_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors that describe `model` exactly: int8 weights + scales for quantised Linears, fp32 for the rest."""
    qmods = _quantised(model)
    if not qmods:
        raise BertforgeError("int8_state: the model has no quantised Linear layers")
    tensors: dict[str, torch.Tensor] = {}
    for name, m in qmods.items():
        weight, bias = m._weight_bias()
        if weight.qscheme() not in (torch.per_channel_affine, torch.per_channel_symmetric) \
                or weight.q_per_channel_axis() != 0 or bool(weight.q_per_channel_zero_points().any()):
            raise BertforgeError(f"{name}: only symmetric per-output-channel int8 weights can be saved")
        tensors[f"{name}.weight"] = weight.int_repr().contiguous()
        tensors[f"{name}{_SCALE}"] = weight.q_per_channel_scales().double().contiguous()
        if bias is not None:
            tensors[f"{name}.bias"] = bias.detach().float().contiguous()
    tensors.update({k: v.detach().contiguous() for k, v in _plain_state(model, qmods).items()})
    return tensors


def save_int8(model: nn.Module, directory: str | Path) -> Path:
    """Write `model`'s int8 state to directory/model.int8.safetensors (atomically)."""
    tensors = int8_state(model)
    path = Path(directory) / INT8_WEIGHTS
    write_tensors(path, tensors, bertforge="int8")
    return path


def load_int8(model: nn.Module, directory: str | Path) -> None:
    """Fill `model` (already in its int8 shape: quantised Linears in place) from directory/model.int8.safetensors."""
    path = Path(directory) / INT8_WEIGHTS
    if not path.is_file():
        raise BertforgeError(f"{path}: missing (a quantised folder keeps its weights there)")
    state = read_tensors(path)
    qmods = _quantised(model)
    for name, m in qmods.items():
        try:
            q, scales = state.pop(f"{name}.weight"), state.pop(f"{name}{_SCALE}")
        except KeyError:
            raise BertforgeError(f"{path}: no int8 weight for {name} (saved from another model shape?)") from None
        if q.dtype != torch.int8 or tuple(q.shape) != (m.out_features, m.in_features):
            raise BertforgeError(f"{path}: {name}.weight is {q.dtype} {tuple(q.shape)}, expected int8 "
                                 f"{(m.out_features, m.in_features)}")
        weight = torch._make_per_channel_quantized_tensor(q, scales.double(), torch.zeros(len(scales),
                                                                                          dtype=torch.long), 0)
        m.set_weight_bias(weight, state.pop(f"{name}.bias", None))
    expected = set(_plain_state(model, qmods))
    missing = sorted(expected - set(state))
    if missing:
        raise BertforgeError(f"{path}: tensor {missing[0]!r} is missing")
    unexpected = sorted(set(state) - expected)
    if unexpected:
        raise BertforgeError(f"{path}: unexpected tensor {unexpected[0]!r} (saved from another model shape?)")
    # copied tensor by tensor: load_state_dict would ask the quantised modules for keys they never saved
    targets = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers(remove_duplicate=False))
    with torch.no_grad():
        for key, value in state.items():
            if tuple(targets[key].shape) != tuple(value.shape):
                raise BertforgeError(f"{path}: {key} has shape {tuple(value.shape)}, config.json says "
                                     f"{tuple(targets[key].shape)}")
            targets[key].copy_(value)
