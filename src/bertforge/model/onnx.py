"""Exported ONNX graphs run through onnxruntime, called like the PyTorch models they came from.

`bertforge export` writes DIR/model.onnx (and DIR/model.int8.onnx with --int8) next to the model's config.json
and tokenizer; opening a model folder (`model.folder.ModelFolder.open`) says whether a --model argument names such a
graph: the folder (its fp32 model.onnx, when the folder holds no PyTorch weights) or a .onnx file inside it (e.g.
model.int8.onnx).
`OnnxModel` runs it: `model(input_ids, attention_mask, token_type_ids)` returns the graph's outputs by name as
torch tensors (`out["logits"]`, `out.last_hidden_state`), so `predict`, `evaluate` and `embed` use it unchanged.
`for_export(encoder)` is the copy of an encoder that `export` traces: the same weights, its attention in the op
pattern onnxruntime's transformer optimiser fuses (`OnnxSelfAttention`, an additive mask).
"""
from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from bertforge.model.attention import OnnxSelfAttention, SelfAttention
from bertforge.model.encoder import Encoder
from bertforge.errors import BertforgeError



class Outputs(dict):
    """Graph outputs by name; also readable as attributes (`out.last_hidden_state`), like a ModelOutput."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class OnnxModel(nn.Module):
    """An onnxruntime session behind a PyTorch-style forward. It has no weights to train; the one empty
    parameter lets code that asks a model for its device (`next(model.parameters())`) work unchanged."""

    def __init__(self, file: str | Path, threads: int | None = None):
        super().__init__()
        try:
            import onnxruntime as ort
        except ImportError:
            raise BertforgeError(f"{file}: an exported ONNX model; running it needs onnxruntime, which is not "
                                 "installed: pip install 'bertforge[export]'") from None

        self.file = Path(file)
        options = ort.SessionOptions()
        # the same thread count as torch, so that PyTorch and onnxruntime compare on equal terms
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        try:
            self.session = ort.InferenceSession(str(self.file), options, providers=["CPUExecutionProvider"])
        except Exception as err:  # noqa: BLE001 - onnxruntime raises its own exception types
            raise BertforgeError(f"{self.file}: not a loadable ONNX graph ({str(err).splitlines()[0]})") from None
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self._device = nn.Parameter(torch.zeros(0), requires_grad=False)
        self._digest: str | None = None

    @property
    def digest(self) -> str:
        """sha256 of the graph file (what an index fingerprint records for this model)."""
        if self._digest is None:
            self._digest = hashlib.sha256(self.file.read_bytes()).hexdigest()
        return self._digest

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, outputs: Sequence[str] | None = None, **_: Any) -> Outputs:
        """The graph's outputs by name: all of them, or only `outputs`."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        feeds = {name: np.ascontiguousarray(given[name].cpu().numpy(), dtype=np.int64) for name in self.input_names}
        names = list(outputs) if outputs is not None else self.output_names
        outs = self.session.run(names, feeds)
        return Outputs({name: torch.from_numpy(o) for name, o in zip(names, outs)})


class _ExportEncoder(Encoder):
    """An `Encoder` whose mask is additive, built from the graph input as transformers' BERT builds it: the
    Unsqueeze -> Cast -> Sub -> Mul chain that onnxruntime's attention fusion reads its mask from. Always built
    (no "nothing is padded" branch), so the traced graph serves padded and unpadded batches alike."""

    def dense_mask(self, attention_mask: torch.Tensor | None, length: int,
                   device: torch.device) -> torch.Tensor | None:
        if attention_mask is None:
            return None
        mask = attention_mask.unsqueeze(1).unsqueeze(2).to(torch.float32)
        return (1.0 - mask) * torch.finfo(torch.float32).min


def unfusable(encoder: Encoder) -> str | None:
    """Why onnxruntime's BERT fusions do not apply to `encoder`, or None when they do: they need post-norm layers
    with full softmax attention and nothing added to its scores, learned absolute positions, bidirectional, fp32
    (BERT, RoBERTa, XLM-R, DistilBERT, ALBERT, ELECTRA; not ModernBERT, DeBERTa, sparse, causal)."""
    cfg = encoder.config
    reasons = (
        (cfg.family.sparse_attention, "its attention is sparse"),
        (cfg.causal, "its attention is left to right"),
        (cfg.norm_position != "post", "its layers are pre-norm"),
        (cfg.heads_per_layer is not None, "its layers have pruned heads"),
        (cfg.position_embedding_type == "rotary", "its positions rotate queries and keys"),
        (cfg.position_embedding_type == "disentangled", "its attention adds relative-position scores (disentangled "
         "attention), for which onnxruntime's fused Attention node has no input"),
        (any(type(layer.attention.self) is not SelfAttention for layer in encoder.encoder.layer),
         "its attention is not the plain self-attention"),
        (any(p.dtype != torch.float32 for p in encoder.parameters()), "its weights are not fp32"),
    )
    return next((why for bad, why in reasons if bad), None)


def fusable(encoder: Encoder) -> bool:
    """Whether onnxruntime's BERT fusions apply (`unfusable` says why not)."""
    return unfusable(encoder) is None


def for_export(encoder: Encoder) -> Encoder:
    """An eval-mode copy of `encoder` to trace for ONNX: the same forward and weights, with `OnnxSelfAttention`
    and the additive mask, so the exported graph fuses; an encoder the fusions do not cover comes back unchanged."""
    if not fusable(encoder):
        return encoder
    out = copy.deepcopy(encoder).eval()
    swapped: dict[int, OnnxSelfAttention] = {}  # ALBERT's shared attention stays one module
    for layer in out.encoder.layer:
        src = layer.attention.self
        if not isinstance(src, OnnxSelfAttention):
            layer.attention.self = swapped.setdefault(id(src), OnnxSelfAttention(src))
    out.__class__ = _ExportEncoder  # same state and forward; only the mask rule differs
    return out
