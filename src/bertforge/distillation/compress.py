"""Compression: dynamic int8 quantisation (`quantize`) and ONNX export (`export`) of encoders, sentence encoders
and task models.

`quantize` writes a copy of the model folder whose encoder is torch's dynamic int8 quantisation
(`model.for_inference(..., "int8")`: every Linear int8, weights per output channel in 7 bits, activations
quantised per batch in 8 bits; `model.int8.quantize_linears` says why), stored as int8: `model.int8.safetensors` holds the int8 weights and their
scales (`bertforge.model.int8`), and config.json carries `bertforge_quantization`. The folder is smaller on disk
and loads in `embed`, `predict`, `evaluate` and `serve` exactly as the quantised model was before saving (the
copy is reloaded and compared before `quantize` returns); it is bertforge's layout, so transformers does not load
it (it finds no model.safetensors).

`export` traces the model into ONNX (opset 17, dynamic batch and sequence axes) from `model.onnx.for_export`'s copy
of its encoder (attention in the op pattern onnxruntime fuses), runs onnxruntime's BERT optimiser over it (fused
EmbedLayerNormalization, Attention, SkipLayerNormalization, BiasGelu: what the graph gains its speed from), runs
the fused file in onnxruntime on a padded batch and refuses it unless fp32 max |diff| <= 1e-4 against PyTorch;
`--int8` adds onnxruntime's dynamic int8 quantisation of the fused graph (model.int8.onnx: quantising after fusion
gives int8 Attention and MatMul kernels; quantising first would leave nothing for the fusions to match).
`embed`, `predict` and `evaluate` run the exported folder (model.onnx) or either .onnx file through onnxruntime (`bertforge.model.onnx`).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.io.write import atomic_write, atomic_write_text, note_written, write_errors, write_json
from bertforge.model import INT8_WEIGHTS, QUANT_FIELD, for_inference, save_int8
from bertforge.model.folder import ModelFolder
from bertforge.model.int8 import INT8_SCHEME, WEIGHT_RANGE
from bertforge.model.onnx import for_export, unfusable

EXPORTABLE = ("encoder", "sentence-encoder", "classify", "regress", "tag", "qa")
PARITY_TOL = 1e-4
SAMPLE = ["A quick test sentence.", "Distillation keeps most of the accuracy at a fraction of the cost, they say.",
          "Short."]


def _copy_tree(src: Path, dst: Path, skip: set[str] = frozenset()) -> None:
    """Every file of `src` into `dst` (sub-folders too: sentence-transformers modules), each by an atomic rename."""
    for f in sorted(src.rglob("*")):
        rel = f.relative_to(src)
        if f.is_dir() or rel.parts[0].startswith(".") or str(rel) in skip or rel.parts[0] in ("checkpoints",):
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(dst / rel, lambda tmp, f=f: shutil.copyfile(f, tmp))


def _refuse_inference_only(folder: ModelFolder, verb: str) -> None:
    if folder.graph is not None:
        raise BertforgeError(f"--model {folder.path}: already an ONNX export; {verb} the PyTorch model it came from")
    if folder.quantised:
        raise BertforgeError(f"--model {folder.path}: already quantised; {verb} the fp32 model it came from"
                             + (" (and pass --int8)" if verb == "export" else ""))


def _int8_copy(model: nn.Module, kind: str) -> tuple[nn.Module, nn.Module]:
    """(the model with its encoder quantised, the module whose tensors are saved), for each kind quantize takes."""
    if kind == "encoder":
        fast = for_inference(model, "int8")
        return fast, fast
    if kind == "sentence-encoder":
        model.transformer.bert = for_inference(model.transformer.bert, "int8")
        return model, model.transformer.bert
    model.bert = for_inference(model.bert, "int8")
    return model, model


def _weights_bytes(path: Path) -> int:
    return sum((path / name).stat().st_size for name in ("model.safetensors", "pytorch_model.bin", INT8_WEIGHTS)
               if (path / name).is_file())


def quantize(model_dir: "str | Path | ModelFolder", out: str | Path, overwrite: bool = False) -> dict[str, Any]:
    """Write the dynamically int8-quantised model of `model_dir` to `out` (int8 weights on disk); returns its
    agreement with fp32 and the weight files' sizes."""
    from bertforge.io.rundir import claim_output_dir

    folder, out = ModelFolder.open(model_dir), Path(out)
    src, kind = folder.path, folder.kind
    if kind in ("bilstm", "feature", "choice", "decoder", "encoder-decoder"):
        raise BertforgeError(f"--model {src}: a {kind} model cannot be quantised (quantize supports encoders, "
                             "sentence encoders and classify / regress / tag / qa task models)")
    _refuse_inference_only(folder, "quantise")
    config = dict(folder.config)
    model, tok = load_for_export(folder, kind)  # loads (and so checks) the model before anything is written
    fp32 = _first_output(model, kind, tok)
    int8_model, saved = _int8_copy(model, kind)
    expected = _first_output(int8_model, kind, tok)
    with claim_output_dir(out, resume=False, overwrite=overwrite, resume_flag=None, what="--out"):
        _copy_tree(src, out, skip={"config.json", "model.safetensors", "pytorch_model.bin", "run_options.json",
                                   "results.json", "metrics.jsonl", "speed.jsonl"})
        save_int8(saved, out)
        config[QUANT_FIELD] = {"method": "dynamic_int8", "library": "torch.ao.quantization.quantize_dynamic",
                               "scheme": INT8_SCHEME,
                               "weights": f"int8 per output channel in [{WEIGHT_RANGE[0]}, {WEIGHT_RANGE[1]}] "
                                          f"with float64 scales, in {INT8_WEIGHTS}",
                               "activations": "uint8 per batch, full range", "fp32_layers": "embeddings, "
                               "LayerNorms, task heads", "layout": "bertforge (not loadable in "
                               "transformers: use the fp32 model it came from there)"}
        write_json(out / "config.json", config, sort_keys=True)  # last: complete
        reloaded, _ = load_for_export(ModelFolder.open(out, "--out"), kind)
        int8 = _first_output(reloaded, kind, tok)
        if not torch.equal(int8, expected):  # what was saved must be what was quantised, bit for bit
            raise BertforgeError(f"--out {out}: the saved int8 model differs from the quantised one by "
                                 f"{float((int8 - expected).abs().max()):.2e}; please report this")
    cos = torch.nn.functional.cosine_similarity(fp32.flatten(1), int8.flatten(1)).mean().item()
    return {"kind": kind, "out": str(out), "max_abs_diff": float((fp32 - int8).abs().max()), "mean_cosine": cos,
            "weights_bytes_fp32": _weights_bytes(src), "weights_bytes_int8": _weights_bytes(out)}


# ---- one forward function per kind: (input_ids, attention_mask, token_type_ids) -> outputs ----------------------------
class _Exportable(nn.Module):
    """A plain-tensor-in, tuple-out view of a model (what the ONNX tracer needs)."""

    def __init__(self, model: nn.Module, kind: str):
        super().__init__()
        self.model, self.kind = model, kind

    def forward(self, input_ids, attention_mask, token_type_ids):
        if self.kind == "encoder":
            out = self.model(input_ids, attention_mask, token_type_ids)
            return (out.last_hidden_state,) if out.pooler_output is None else (out.last_hidden_state, out.pooler_output)
        if self.kind == "sentence-encoder":  # the whole pipeline, and the token embeddings bertforge pools itself
            feats = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
            feats = self.model(feats)
            return feats["sentence_embedding"], feats["token_embeddings"]
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return (out["start_logits"], out["end_logits"]) if self.kind == "qa" else (out["logits"],)


def output_names(kind: str, n: int) -> list[str]:
    names = {"encoder": ["last_hidden_state", "pooler_output"],
             "sentence-encoder": ["sentence_embedding", "last_hidden_state"],
             "qa": ["start_logits", "end_logits"]}.get(kind, ["logits"])
    return names[:n]


def load_for_export(folder: ModelFolder, kind: str) -> tuple[nn.Module, Any]:
    """(model in eval mode, tokenizer) of an opened model folder, for a kind `export` supports."""
    from bertforge.embedding import SentenceEncoder
    from bertforge.model import Encoder
    from bertforge.tasks.models import load_task_model

    if kind == "sentence-encoder":
        st = SentenceEncoder.from_pretrained(folder)
        return st.eval(), st.tokenizer
    tok = folder.tokenizer()
    if kind == "encoder":
        return Encoder.from_pretrained(folder).eval(), tok
    return load_task_model(folder)[0].eval(), tok


def _sample_batch(tok, max_len: int = 64) -> dict[str, torch.Tensor]:
    """A padded batch (so that the traced graph keeps the attention-mask path)."""
    return tok(SAMPLE, max_length=max_len, padding="longest", truncation=True, return_tensors="pt")


def _first_output(model: nn.Module, kind: str, tok) -> torch.Tensor:
    """The model's first output on the sample batch (quantize's fp32 vs int8 agreement)."""
    batch = _sample_batch(tok)
    with torch.no_grad():
        outs = _Exportable(model.eval(), kind)(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    return outs[0].float()


def _encoder_of(model: nn.Module, kind: str) -> nn.Module:
    if kind == "encoder":
        return model
    return model.transformer.bert if kind == "sentence-encoder" else model.bert


def _with_encoder(model: nn.Module, kind: str, encoder: nn.Module) -> nn.Module:
    """`model` with `encoder` in its encoder's place (for kind "encoder": `encoder` itself)."""
    if kind == "encoder":
        return encoder
    if kind == "sentence-encoder":
        model.transformer.bert = encoder
    else:
        model.bert = encoder
    return model


FUSED_OPS = ("EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu", "FastGelu", "Gelu")


def _optimise(path: Path, config) -> dict[str, int]:
    """Rewrite the graph at `path` in place with onnxruntime's BERT fusions; returns the fused nodes by type."""
    import logging

    from onnxruntime.transformers.optimizer import optimize_model

    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)  # its per-fusion chatter
    # opt_level 0: the Python fusions only; onnxruntime's own graph optimisations run when a session loads it
    opt = optimize_model(str(path), model_type="bert", num_heads=config.num_attention_heads,
                         hidden_size=config.hidden_size, opt_level=0)
    opt.save_model_to_file(str(path))
    counts: dict[str, int] = {}
    for node in opt.model.graph.node:
        if node.op_type in FUSED_OPS:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def export_onnx(model_dir: "str | Path | ModelFolder", out: str | Path, int8: bool = False, opset: int = 17,
                overwrite: bool = False) -> dict[str, Any]:
    """Export to `out`/model.onnx (+ model.int8.onnx), checked in onnxruntime; returns the parity record."""
    import onnxruntime  # noqa: F401 -- missing onnxruntime fails here, before the model is loaded

    from bertforge.io.rundir import claim_output_dir

    folder, out = ModelFolder.open(model_dir), Path(out)
    src, kind = folder.path, folder.kind
    if kind not in EXPORTABLE:
        raise BertforgeError(f"--model {src}: a {kind} model cannot be exported to ONNX (export supports "
                             f"{', '.join(EXPORTABLE)} models)")
    _refuse_inference_only(folder, "export")
    model, tok = load_for_export(folder, kind)
    wrapper = _Exportable(model, kind).eval()
    batch = _sample_batch(tok)
    args = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    with torch.no_grad():
        expected = [o.float().numpy() for o in wrapper(*args)]
    names = output_names(kind, len(expected))
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
            "token_type_ids": {0: "batch", 1: "sequence"}}
    for name in names:
        axes[name] = {0: "batch"} if name in ("sentence_embedding", "pooler_output") or kind in ("classify", "regress") \
            else {0: "batch", 1: "sequence"}
    encoder = _encoder_of(model, kind)
    why_not = unfusable(encoder)
    fuse = why_not is None
    if fuse:  # traced from the fusable copy; `expected` above came from the model as it runs in PyTorch
        wrapper = _Exportable(_with_encoder(model, kind, for_export(encoder)), kind).eval()
    with claim_output_dir(out, resume=False, overwrite=overwrite, resume_flag=None, what="--out"):
        # partial files carry the pid (io.write's temporary pattern): a killed export's are swept by the next claim
        tmp = out / f".model.onnx.{os.getpid()}.partial.tmp"
        qtmp = out / f".model.int8.onnx.{os.getpid()}.partial.tmp"
        try:
            record = _write_onnx(src, out, wrapper, args, names, axes, expected, kind, opset, int8, tmp, qtmp,
                                 encoder.config if fuse else None)
        finally:  # a write error, a parity failure or an interrupt leaves no partial file behind
            tmp.unlink(missing_ok=True)
            qtmp.unlink(missing_ok=True)
        if why_not is not None:  # the plain graph, as exact as the fused one; onnxruntime runs it op by op
            record["unfused"] = why_not
        _copy_tree(src, out, skip={"model.safetensors", "pytorch_model.bin", "run_options.json", "results.json",
                                   "metrics.jsonl", "speed.jsonl", "best_metrics.json"})
        atomic_write_text(out / "export.json", json.dumps(record, indent=2) + "\n")
    return record


def _write_onnx(src: Path, out: Path, wrapper, args, names, axes, expected, kind: str, opset: int, int8: bool,
                tmp: Path, qtmp: Path, fuse_config: Any = None) -> dict[str, Any]:
    """model.onnx (+ model.int8.onnx) in `out` through the partial files `tmp` / `qtmp`, parity-checked; with
    `fuse_config` (the encoder's config) onnxruntime's BERT optimiser fuses the graph first."""
    import onnxruntime as ort

    with torch.no_grad(), write_errors(out / "model.onnx"):
        torch.onnx.export(wrapper, args, str(tmp), input_names=list(axes)[:3], output_names=names,
                          dynamic_axes=axes, opset_version=opset, dynamo=False, do_constant_folding=True)
    fused = _optimise(tmp, fuse_config) if fuse_config is not None else {}
    session = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
    # the inputs the graph kept: a model without token types (DeBERTa-v3, DistilBERT) has no token_type_ids
    given = {k: v.numpy() for k, v in zip(("input_ids", "attention_mask", "token_type_ids"), args)}
    feeds = {i.name: given[i.name] for i in session.get_inputs()}
    got = session.run(names, feeds)
    diff = max(float(np.abs(g - e).max()) for g, e in zip(got, expected))
    if diff > PARITY_TOL:
        raise BertforgeError(f"--model {src}: the ONNX graph differs from PyTorch by {diff:.2e} "
                             f"(> {PARITY_TOL}); not written")
    os.replace(tmp, out / "model.onnx")
    note_written(out / "model.onnx")
    record: dict[str, Any] = {"kind": kind, "format": "onnx", "opset": opset, "inputs": list(feeds),
                              "outputs": names, "fp32_max_abs_diff": diff, "fused_nodes": fused}
    if int8:
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic

        # the fused nodes are onnxruntime's own (com.microsoft), whose outputs ONNX shape inference cannot type.
        # The embeddings stay fp32: a lookup gains no speed from int8, and QEmbedLayerNormalization drops the
        # position ids that RoBERTa's padding-aware positions feed EmbedLayerNormalization (cosine 0.78 to fp32)
        with write_errors(out / "model.int8.onnx"):
            quantize_dynamic(str(out / "model.onnx"), str(qtmp), weight_type=QuantType.QInt8, per_channel=True,
                             op_types_to_quantize=["MatMul", "Attention"],
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        qgot = ort.InferenceSession(str(qtmp), providers=["CPUExecutionProvider"]).run(names, feeds)
        record["int8_max_abs_diff"] = max(float(np.abs(g - e).max()) for g, e in zip(qgot, expected))
        e0, q0 = expected[0].reshape(len(SAMPLE), -1), qgot[0].reshape(len(SAMPLE), -1)
        record["int8_mean_cosine"] = float(np.mean(np.sum(e0 * q0, 1) / (np.linalg.norm(e0, axis=1)
                                                                        * np.linalg.norm(q0, axis=1))))
        os.replace(qtmp, out / "model.int8.onnx")
        note_written(out / "model.int8.onnx")
    return record
