"""Hugging Face-compatible checkpoint directories: config.json + model.safetensors (+ tokenizer files).

Inside bertforge every encoder uses BERT's names (`bert.embeddings...`, `bert.encoder.layer.N...`, `cls.predictions...`,
task heads such as `classifier`); `hf_name` translates one canonical name into a family's Hugging Face name. Loading
walks the model's own parameters and looks each one up in the file under its HF name, so there is a single map,
used in both directions. The decoder (gpt2) already uses GPT2LMHeadModel's names (`transformer.h.N.attn.c_attn`,
`lm_head`); its only translation is the layout of GPT-2's Conv1D weights, stored [in, out] (transposed here).
used in both directions. Where a family fuses tensors that bertforge keeps apart (ModernBERT's `Wqkv` holds Q, K and
V), `hf_part` says which slice of the fused tensor a canonical one is: saving concatenates the parts in order,
loading slices them out.
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any, Iterable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from bertforge.config import FAMILIES, ModelConfig
from bertforge.errors import BertforgeError
from bertforge.fileio import atomic_write, atomic_write_text

log = logging.getLogger(__name__)

# Read off the one family table (bertforge.config.FAMILIES).
INT8_WEIGHTS = "model.int8.safetensors"  # `bertforge quantize`'s int8 weights (bertforge.model.int8)
FAMILY_PREFIX = {name: fam.weight_prefix for name, fam in FAMILIES.items()}
BASE_ARCHITECTURE = {name: fam.base_architecture for name, fam in FAMILIES.items()}

# (canonical pattern, family replacement); the first match wins. Names with no match keep their canonical name.
_LAYER = r"bert\.encoder\.layer\.(\d+)\."
_RULES: dict[str, list[tuple[str, str]]] = {
    "bert": [],
    "roberta": [
        (r"^cls\.predictions\.transform\.dense\.", "lm_head.dense."),
        (r"^cls\.predictions\.transform\.LayerNorm\.", "lm_head.layer_norm."),
        (r"^cls\.predictions\.bias$", "lm_head.bias"),
        (r"^cls\.predictions\.decoder\.", "lm_head.decoder."),
        (r"^bert\.", "roberta."),
    ],
    "electra": [
        (r"^bert\.embeddings_project\.", "electra.embeddings_project."),
        (r"^cls\.predictions\.transform\.dense\.", "generator_predictions.dense."),
        (r"^cls\.predictions\.transform\.LayerNorm\.", "generator_predictions.LayerNorm."),
        (r"^cls\.predictions\.bias$", "generator_lm_head.bias"),
        (r"^cls\.predictions\.decoder\.weight$", "generator_lm_head.weight"),
        (r"^bert\.", "electra."),
    ],
    "albert": [
        (r"^bert\.embeddings_project\.", "albert.encoder.embedding_hidden_mapping_in."),
        (_LAYER + r"attention\.self\.(query|key|value)\.", r"albert.encoder.albert_layer_groups.\1.albert_layers.0.attention.\2."),
        (_LAYER + r"attention\.output\.dense\.", r"albert.encoder.albert_layer_groups.\1.albert_layers.0.attention.dense."),
        (_LAYER + r"attention\.output\.LayerNorm\.", r"albert.encoder.albert_layer_groups.\1.albert_layers.0.attention.LayerNorm."),
        (_LAYER + r"intermediate\.dense\.", r"albert.encoder.albert_layer_groups.\1.albert_layers.0.ffn."),
        (_LAYER + r"output\.dense\.", r"albert.encoder.albert_layer_groups.\1.albert_layers.0.ffn_output."),
        (_LAYER + r"output\.LayerNorm\.", r"albert.encoder.albert_layer_groups.\1.albert_layers.0.full_layer_layer_norm."),
        (r"^bert\.pooler\.dense\.", "albert.pooler."),
        (r"^cls\.predictions\.transform\.dense\.", "predictions.dense."),
        (r"^cls\.predictions\.transform\.LayerNorm\.", "predictions.LayerNorm."),
        (r"^cls\.predictions\.", "predictions."),
        (r"^cls\.seq_relationship\.", "sop_classifier.classifier."),
        (r"^bert\.", "albert."),
    ],
    "distilbert": [
        (_LAYER + r"attention\.self\.query\.", r"distilbert.transformer.layer.\1.attention.q_lin."),
        (_LAYER + r"attention\.self\.key\.", r"distilbert.transformer.layer.\1.attention.k_lin."),
        (_LAYER + r"attention\.self\.value\.", r"distilbert.transformer.layer.\1.attention.v_lin."),
        (_LAYER + r"attention\.output\.dense\.", r"distilbert.transformer.layer.\1.attention.out_lin."),
        (_LAYER + r"attention\.output\.LayerNorm\.", r"distilbert.transformer.layer.\1.sa_layer_norm."),
        (_LAYER + r"intermediate\.dense\.", r"distilbert.transformer.layer.\1.ffn.lin1."),
        (_LAYER + r"output\.dense\.", r"distilbert.transformer.layer.\1.ffn.lin2."),
        (_LAYER + r"output\.LayerNorm\.", r"distilbert.transformer.layer.\1.output_layer_norm."),
        (r"^cls\.predictions\.transform\.dense\.", "vocab_transform."),
        (r"^cls\.predictions\.transform\.LayerNorm\.", "vocab_layer_norm."),
        (r"^cls\.predictions\.bias$", "vocab_projector.bias"),
        (r"^cls\.predictions\.decoder\.weight$", "vocab_projector.weight"),
        (r"^bert\.", "distilbert."),
    ],
    # Longformer: RoBERTa's names under `longformer.` (the global Q/K/V keep their names: query_global, ...).
    "longformer": [
        (r"^cls\.predictions\.transform\.dense\.", "lm_head.dense."),
        (r"^cls\.predictions\.transform\.LayerNorm\.", "lm_head.layer_norm."),
        (r"^cls\.predictions\.bias$", "lm_head.bias"),
        (r"^cls\.predictions\.decoder\.", "lm_head.decoder."),
        (r"^bert\.", "longformer."),
    ],
    # BigBird: BERT's names, but the pooler is a bare Linear (BigBirdModel.pooler + a separate tanh).
    "big_bird": [(r"^bert\.pooler\.dense\.", "bert.pooler.")],
    # XLNet's modules already carry transformers' names (bertforge.model.xlnet); its LM head is `lm_loss`.
    "xlnet": [(r"^bert\.", "transformer.")],
    "gpt2": [],  # bertforge's decoder has GPT2LMHeadModel's names
    "modernbert": [
        (r"^bert\.embeddings\.word_embeddings\.", "model.embeddings.tok_embeddings."),
        (r"^bert\.embeddings\.LayerNorm\.", "model.embeddings.norm."),
        (_LAYER + r"attn_norm\.", r"model.layers.\1.attn_norm."),
        (_LAYER + r"attention\.self\.(?:query|key|value)\.", r"model.layers.\1.attn.Wqkv."),  # see hf_part
        (_LAYER + r"attention\.output\.dense\.", r"model.layers.\1.attn.Wo."),
        (_LAYER + r"mlp_norm\.", r"model.layers.\1.mlp_norm."),
        (_LAYER + r"intermediate\.dense\.", r"model.layers.\1.mlp.Wi."),  # GeGLU [W_a; W_g] in both layouts
        (_LAYER + r"output\.dense\.", r"model.layers.\1.mlp.Wo."),
        (r"^bert\.final_norm\.", "model.final_norm."),
        (r"^cls\.predictions\.transform\.dense\.", "head.dense."),
        (r"^cls\.predictions\.transform\.LayerNorm\.", "head.norm."),
        (r"^cls\.predictions\.bias$", "decoder.bias"),
        (r"^bert\.", "model."),
    ],
}
# Canonical tensors stored as a slice of one fused HF tensor: family -> (pattern, group naming the part, parts).
_FUSED = {"modernbert": (re.compile(_LAYER + r"attention\.self\.(query|key|value)\."), 2, ("query", "key", "value"))}
_COMPILED = {fam: [(re.compile(p), r) for p, r in rules] for fam, rules in _RULES.items()}
# Weights every family ties to another tensor; checkpoints store them once (under the embedding / bias).
_TIED = re.compile(r"^(cls\.predictions\.decoder\.(weight|bias)|lm_head\.weight|lm_loss\.weight)$")
# GPT-2's Conv1D layers keep their weight as [in, out]; bertforge's nn.Linear as [out, in].
_TRANSPOSED = {"gpt2": re.compile(r"\.(c_attn|c_proj|c_fc)\.weight$")}


def _hf_layout(name: str, tensor: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """A tensor in the checkpoint's layout from bertforge's, or back (a transpose is its own inverse)."""
    pattern = _TRANSPOSED.get(cfg.model_type)
    return tensor.t() if pattern is not None and pattern.search(name) else tensor


def hf_name(canonical: str, cfg: ModelConfig) -> str:
    """Translate a canonical (BERT-named, `bert.`-prefixed) parameter name to cfg's family naming."""
    if cfg.model_type == "albert" and cfg.share_layers == "all":
        canonical = re.sub(_LAYER, "bert.encoder.layer.0.", canonical)  # every layer is group 0
    for pattern, repl in _COMPILED[cfg.model_type]:
        if pattern.search(canonical):
            return pattern.sub(repl, canonical, count=1)
    return canonical


def hf_part(canonical: str, cfg: ModelConfig) -> tuple[int, int] | None:
    """(index, number of parts) when `canonical` is a slice of a fused HF tensor (split along dim 0), else None."""
    fused = _FUSED.get(cfg.model_type)
    if fused is None:
        return None
    pattern, group, parts = fused
    m = pattern.search(canonical)
    return (parts.index(m.group(group)), len(parts)) if m else None


def is_bare_encoder(model: nn.Module) -> bool:
    """A `bertforge.model.Encoder` itself (parameters `embeddings.*`, `encoder.*`) or an `XLNetEncoder`
    (`word_embedding`, `layer.*`), not a wrapper holding one as `.bert`. Decided by its parts, not by isinstance:
    checkpoint must not import model (model imports checkpoint)."""
    bert = isinstance(getattr(model, "embeddings", None), nn.Module) and \
        isinstance(getattr(model, "encoder", None), nn.Module)
    xlnet = isinstance(getattr(model, "word_embedding", None), nn.Embedding) and \
        isinstance(getattr(model, "layer", None), nn.ModuleList)
    return bert or xlnet


def is_bare_decoder(model: nn.Module) -> bool:
    """A `bertforge.model.Decoder` itself (`wte`, `h`: GPT2Model), not the LM holding one as `.transformer`."""
    return isinstance(getattr(model, "wte", None), nn.Module) and isinstance(getattr(model, "h", None), nn.Module)


def _body_prefix(cfg: ModelConfig) -> str:
    """The canonical name of the body inside a model with heads: `bert.` (encoders), `transformer.` (decoder)."""
    return "transformer." if cfg.is_decoder else "bert."


def _bare(model: nn.Module) -> bool:
    return is_bare_encoder(model) or is_bare_decoder(model)


def _canonical_state(model: nn.Module, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The model's state under canonical names: a bare Encoder (Decoder) gets the `bert.` (`transformer.`) prefix
    a wrapper would give it."""
    prefix = _body_prefix(cfg) if _bare(model) else ""
    return {prefix + k: v for k, v in model.state_dict().items()}


# ---- saving ------------------------------------------------------------------------------------------------------
def hf_state_dict(model: nn.Module, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The tensors to save, under the family's HF names; tied weights once; shared layers as HF expects them."""
    strip = FAMILY_PREFIX[cfg.model_type] + "." if _bare(model) else None
    out: dict[str, torch.Tensor] = {}
    parts: dict[str, list[torch.Tensor | None]] = {}
    seen: set[int] = set()
    for name, tensor in _canonical_state(model, cfg).items():
        if _TIED.match(name):
            continue
        key = hf_name(name, cfg)
        if strip and key.startswith(strip):  # a bare encoder saves as BertModel does: no prefix
            key = key[len(strip):]
        part = hf_part(name, cfg)
        if part is not None:  # a slice of a fused tensor: joined once every part is there
            slots = parts.setdefault(key, [None] * part[1])
            slots[part[0]] = tensor.detach().cpu()
            if all(t is not None for t in slots):
                out[key] = torch.cat(slots)  # type: ignore[arg-type]
            continue
        if key in out:  # ALBERT all-shared: layers 1..L-1 are group 0 again
            continue
        tensor = _hf_layout(name, tensor.detach().cpu(), cfg).contiguous()
        if tensor.data_ptr() in seen:  # partially shared layers: safetensors stores each tensor on its own
            tensor = tensor.clone()
        seen.add(tensor.data_ptr())
        out[key] = tensor
    return out


def save_pretrained(model: nn.Module, path: str | Path, cfg: ModelConfig, architecture: str | None = None,
                    tokenizer: Any = None, extra_config: dict[str, Any] | None = None) -> Path:
    """Write an HF-compatible directory; every file is written to a temporary name, then renamed."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = hf_state_dict(model, cfg)
    atomic_write(path / "model.safetensors", lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    config = cfg.to_hf_dict([architecture or BASE_ARCHITECTURE[cfg.model_type]])
    config.update(extra_config or {})
    atomic_write_text(path / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


# ---- loading -----------------------------------------------------------------------------------------------------
def read_state_dict(path: str | Path) -> tuple[dict[str, torch.Tensor], Path]:
    """Tensors of a checkpoint directory (model.safetensors, else pytorch_model.bin read with weights_only)."""
    path = Path(path)
    st, pt = path / "model.safetensors", path / "pytorch_model.bin"
    if st.is_file():
        try:
            state = load_file(str(st))
        except (SafetensorError, OSError, ValueError) as err:
            raise BertforgeError(f"{st}: not a readable safetensors file ({err})") from None
        source = st
    elif pt.is_file():
        try:
            state = torch.load(pt, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - any unpickling failure is a bad file for the user
            raise BertforgeError(f"{pt}: cannot be read safely with weights_only=True ({err})") from None
        source = pt
    elif (path / INT8_WEIGHTS).is_file() or any(path.glob("*.onnx")):
        raise BertforgeError(f"{path}: holds an inference-only model (int8 weights or an ONNX graph), which cannot "
                             "be trained or converted; use the fp32 model it was made from")
    else:
        raise BertforgeError(f"{path}: no model.safetensors or pytorch_model.bin")
    # Legacy TF-converted checkpoints name LayerNorm parameters gamma / beta.
    fixed = {}
    for k, v in state.items():
        k = re.sub(r"\.gamma$", ".weight", k) if "LayerNorm" in k or "layer_norm" in k else k
        k = re.sub(r"\.beta$", ".bias", k) if "LayerNorm" in k or "layer_norm" in k else k
        fixed[k] = v
    return fixed, source


def load_pretrained(model: nn.Module, path: str | Path, require: Iterable[str] = ()) -> list[str]:
    """Load a checkpoint directory into `model` (an Encoder or a wrapper whose encoder is `.bert`).

    Encoder tensors must all be present (the pooler may be absent: it stays freshly initialised, as in HF);
    head tensors that are absent stay initialised and are returned, unless their prefix is in `require`.
    Shapes must match the config. Returns the canonical names that were not found in the file.
    """
    state, source = read_state_dict(path)
    cfg: ModelConfig = getattr(model, "config", None) or ModelConfig.from_file(path)
    family = FAMILY_PREFIX[cfg.model_type] + "."
    own = _canonical_state(model, cfg)
    loaded: dict[str, torch.Tensor] = {}
    missing: list[str] = []
    for name, param in own.items():
        if _TIED.match(name):
            continue
        key = hf_name(name, cfg)
        if key not in state and key.startswith(family) and key[len(family):] in state:
            key = key[len(family):]  # a bare BertModel-style file (no family prefix)
        if key not in state:
            missing.append(name)
            continue
        tensor = _hf_layout(name, state[key], cfg)
        part = hf_part(name, cfg)
        if part is not None:
            if tensor.shape[0] % part[1]:
                raise BertforgeError(f"{source}: tensor {key!r} of shape {tuple(tensor.shape)} does not split into "
                                     f"{part[1]} equal parts")
            tensor = tensor.chunk(part[1])[part[0]]
        if tuple(tensor.shape) != tuple(param.shape):
            raise BertforgeError(f"{source}: tensor {key!r} has shape {tuple(tensor.shape)}, "
                                 f"the config expects {tuple(param.shape)}")
        loaded[name] = tensor
    body = _body_prefix(cfg)
    for name in missing:
        if name.startswith(body) and not name.startswith("bert.pooler."):
            raise BertforgeError(f"{source}: tensor {hf_name(name, cfg)!r} is missing (needed by the "
                                 f"{'decoder' if cfg.is_decoder else 'encoder'})")
        for prefix in require:
            if name.startswith(prefix):
                raise BertforgeError(f"{source}: tensor {hf_name(name, cfg)!r} is missing "
                                     f"(this command needs the {prefix.rstrip('.')} head)")
    if missing:
        log.info("%s: not in the checkpoint, left initialised: %s", source, ", ".join(missing))
    strip = _body_prefix(cfg) if _bare(model) else ""
    with torch.no_grad():
        params = dict(model.state_dict(keep_vars=True))
        for name, tensor in loaded.items():
            params[name[len(strip):]].copy_(tensor.to(params[name[len(strip):]].dtype))
    return missing
