"""Hugging Face-compatible checkpoint directories: config.json + model.safetensors (+ tokenizer files), for every
model bertforge builds: the encoders, the decoder and the encoder-decoders go through this one engine.

Inside bertforge every encoder uses BERT's names (`bert.embeddings...`, `bert.encoder.layer.N...`, `cls.predictions...`,
task heads such as `classifier`); `hf_name` translates one canonical name into a family's Hugging Face name. Loading
walks the model's own parameters and looks each one up in the file under its HF name, so there is a single map,
used in both directions; each family's rules are in its file in `bertforge.families`. The decoder (GPT-2's layout)
already uses GPT2LMHeadModel's names (`transformer.h.N.attn.c_attn`, `lm_head`); its only translation is the layout
of GPT-2's Conv1D weights, stored [in, out] (transposed here). The encoder-decoders share one module tree (`shared`,
`encoder.layers.N.self_attn.q`, ...) that the family's rules rename (T5: the first matching rule; BART: every rule
in turn). Where a family fuses tensors that bertforge keeps apart (ModernBERT's `Wqkv` holds Q, K and V), `hf_part`
says which slice of the fused tensor a canonical one is: saving concatenates the parts in order, loading slices
them out.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Iterable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.families import DECODER, ENCODER, ENCODER_DECODER, FAMILIES
from bertforge.families.family import CANONICAL_ENCODER, LAYER
from bertforge.io.write import atomic_write, write_json

log = logging.getLogger(__name__)

INT8_WEIGHTS = "model.int8.safetensors"  # `bertforge quantize`'s int8 weights (bertforge.model.int8)
# Read off the families (each family file holds its tensor-name rules: `Family.weight_rules`).
_COMPILED = {name: [(re.compile(p), r) for p, r in fam.weight_rules] for name, fam in FAMILIES.items()}
_ALTERNATIVE = {name: [(re.compile(p), r) for p, r in fam.alternative_weight_rules]
                for name, fam in FAMILIES.items() if fam.alternative_weight_rules}
_FUSED = {name: (re.compile(fam.fused_weights[0]), *fam.fused_weights[1:])
          for name, fam in FAMILIES.items() if fam.fused_weights}
_TRANSPOSED = {name: re.compile(fam.transposed_weights) for name, fam in FAMILIES.items() if fam.transposed_weights}
# Output projections tied to the word embeddings; checkpoints store them once (under the embedding) while they are
# tied (a T5 v1.1 output matrix of its own is saved and read under its name).
_TIED = re.compile(r"^(cls\.predictions\.decoder\.(weight|bias)|lm_head\.weight|lm_loss\.weight)$")
# Tensors transformers initialises when a file lacks them: the pooler, BART's final_logits_bias buffer.
_OPTIONAL = re.compile(r"^(bert\.pooler\.|final_logits_bias$)")
# Any config with a `family` and `model_type` (ModelConfig, Seq2SeqConfig): checkpoint reads nothing else of it but
# `share_layers` (absent from the encoder-decoders' configs) and writes `to_hf_dict`.
Config = Any


def _tied(name: str, state: dict[str, torch.Tensor]) -> bool:
    """Whether `name` is an output projection that shares its tensor with another entry of `state`."""
    if not _TIED.match(name):
        return False
    ptr = state[name].data_ptr()
    return any(other != name and t.data_ptr() == ptr for other, t in state.items())


def _hf_layout(name: str, tensor: torch.Tensor, cfg: Config) -> torch.Tensor:
    """A tensor in the checkpoint's layout from bertforge's, or back (a transpose is its own inverse)."""
    pattern = _TRANSPOSED.get(cfg.model_type)
    return tensor.t() if pattern is not None and pattern.search(name) else tensor


def hf_name(canonical: str, cfg: Config, alternative: bool = False) -> str:
    """Translate a canonical parameter name (an encoder's BERT names, `bert.`-prefixed; the decoder's and the
    encoder-decoders' own) to cfg's family naming (`alternative`: to the other layout the family's files may use,
    `Family.alternative_weight_rules`, where it has one)."""
    fam = cfg.family
    if fam.shared_layers_as_one and getattr(cfg, "share_layers", "none") == "all":
        canonical = re.sub(LAYER, f"{CANONICAL_ENCODER}.encoder.layer.0.", canonical)  # every layer is layer 0
    rules = _ALTERNATIVE.get(cfg.model_type) if alternative else None
    for pattern, repl in rules or _COMPILED[cfg.model_type]:
        if not fam.first_rule_only:
            canonical = pattern.sub(repl, canonical, count=1)
        elif pattern.search(canonical):
            return pattern.sub(repl, canonical, count=1)
    return canonical


def hf_part(canonical: str, cfg: Config) -> tuple[int, int] | None:
    """(index, number of parts) when `canonical` is a slice of a fused HF tensor (split along dim 0), else None."""
    fused = _FUSED.get(cfg.model_type)
    if fused is None:
        return None
    pattern, group, parts = fused
    m = pattern.search(canonical)
    return (parts.index(m.group(group)), len(parts)) if m else None


# The modules a bare encoder of each layout holds (`Family.bare_parts`): `embeddings` + `encoder` for
# `bertforge.model.Encoder`, `word_embedding` + `layer` for XLNet's two-stream one.
_BARE_ENCODER_PARTS = tuple(dict.fromkeys(fam.bare_parts for fam in FAMILIES.values() if fam.stack == ENCODER))


def is_bare_encoder(model: nn.Module) -> bool:
    """An encoder itself (one of the families' `bare_parts`), not a wrapper holding one as `.bert`. Decided by its
    parts, not by isinstance: checkpoint must not import model (model imports checkpoint)."""
    return any(all(isinstance(getattr(model, part, None), nn.Module) for part in parts)
               for parts in _BARE_ENCODER_PARTS)


def is_bare_decoder(model: nn.Module) -> bool:
    """A `bertforge.model.Decoder` itself (`wte`, `h`: GPT2Model), not the LM holding one as `.transformer`."""
    return isinstance(getattr(model, "wte", None), nn.Module) and isinstance(getattr(model, "h", None), nn.Module)


def _body_prefix(cfg: Config) -> str:
    """The canonical name of the body inside a model with heads: `bert.` (encoders), `transformer.` (decoder); an
    encoder-decoder is all body."""
    return {DECODER: "transformer.", ENCODER_DECODER: ""}.get(cfg.family.stack, f"{CANONICAL_ENCODER}.")


def _bare(model: nn.Module) -> bool:
    return is_bare_encoder(model) or is_bare_decoder(model)


def _canonical_state(model: nn.Module, cfg: Config) -> dict[str, torch.Tensor]:
    """The model's state under canonical names: a bare Encoder (Decoder) gets the `bert.` (`transformer.`) prefix
    a wrapper would give it."""
    prefix = _body_prefix(cfg) if _bare(model) else ""
    return {prefix + k: v for k, v in model.state_dict().items()}


# ---- saving ------------------------------------------------------------------------------------------------------
def hf_state_dict(model: nn.Module, cfg: Config, alternative: bool = False) -> dict[str, torch.Tensor]:
    """The tensors to save, under the family's HF names (`alternative`: its other layout's,
    `Family.alternative_architecture`); tied weights once; shared layers as HF expects them."""
    strip = cfg.family.weight_prefix + "." if _bare(model) else None
    out: dict[str, torch.Tensor] = {}
    parts: dict[str, list[torch.Tensor | None]] = {}
    seen: set[int] = set()
    state = _canonical_state(model, cfg)
    for name, tensor in state.items():
        if _tied(name, state):
            continue
        key = hf_name(name, cfg, alternative)
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


def save_pretrained(model: nn.Module, path: str | Path, cfg: Config, architecture: str | None = None,
                    tokenizer: Any = None, extra_config: dict[str, Any] | None = None,
                    alternative: bool = False) -> Path:
    """Write an HF-compatible directory; every file is written to a temporary name, then renamed. `alternative`:
    in the family's other layout (DPR's context encoder), as its `alternative_architecture`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if alternative and cfg.family.alternative_architecture is None:
        raise BertforgeError(f"a {cfg.model_type} model has one checkpoint layout")
    write_tensors(path / "model.safetensors", hf_state_dict(model, cfg, alternative))
    default = cfg.family.alternative_architecture if alternative else cfg.family.base_architecture
    config = cfg.to_hf_dict([architecture or default])
    config.update(extra_config or {})
    write_json(path / "config.json", config, sort_keys=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


# ---- safetensors files, for every writer of model weights ------------------------------------------------------
def write_tensors(path: str | Path, tensors: dict[str, torch.Tensor], **metadata: str) -> None:
    """`tensors` as a safetensors file at `path`, written atomically; its metadata says "format": "pt", as
    transformers' files do (plus `metadata`)."""
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt", **metadata}))


def read_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; one line for a file that is not one."""
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise BertforgeError(f"{path}: not a readable safetensors file ({err})") from None


# ---- loading -----------------------------------------------------------------------------------------------------
def read_state_dict(path: str | Path) -> tuple[dict[str, torch.Tensor], Path]:
    """Tensors of a checkpoint directory (model.safetensors, else pytorch_model.bin read with weights_only)."""
    path = Path(path)
    st, pt = path / "model.safetensors", path / "pytorch_model.bin"
    if st.is_file():
        state, source = read_tensors(st), st
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


def _stored_name(state: dict[str, torch.Tensor], canonical: str, cfg: Config, family: str) -> str | None:
    """The name `canonical` has in `state`: the family's, else its other layout's, each also without the family
    prefix (a bare BertModel-style file); None when the file does not hold it."""
    for key in dict.fromkeys((hf_name(canonical, cfg), hf_name(canonical, cfg, alternative=True))):
        if key in state:
            return key
        if key.startswith(family) and key[len(family):] in state:
            return key[len(family):]
    return None


# Tensors every encoder family stores, canonically named: the names a file gives them tell the families apart.
_FAMILY_MARKERS = (f"{CANONICAL_ENCODER}.embeddings.word_embeddings.weight",
                   f"{CANONICAL_ENCODER}.encoder.layer.0.attention.self.query.weight")


def weight_families(names: Iterable[str]) -> list[str]:
    """The encoder families (model_type) under whose naming a file of tensors `names` (a safetensors header's) holds
    the word embeddings and the first layer's query: several where families name tensors alike (a bare BERT,
    RoBERTa or XLM-RoBERTa file), none for a file of no encoder family."""
    from types import SimpleNamespace

    state = dict.fromkeys(names)
    found = []
    for model_type, fam in FAMILIES.items():
        if fam.stack != ENCODER:
            continue
        cfg = SimpleNamespace(family=fam, model_type=model_type, share_layers="none")
        if all(_stored_name(state, marker, cfg, fam.weight_prefix + ".") for marker in _FAMILY_MARKERS):
            found.append(model_type)
    return found


def load_pretrained(model: nn.Module, path: str | Path, require: Iterable[str] = (),
                    tensors: tuple[dict[str, torch.Tensor], Path] | None = None) -> list[str]:
    """Load a checkpoint directory into `model` (its `config` says the family): an Encoder or a wrapper whose
    encoder is `.bert`, the decoder, an encoder-decoder. `tensors`: `read_state_dict(path)` when the caller has read
    the file already.

    Body tensors must all be present (the pooler and BART's final_logits_bias may be absent: they stay
    initialised, as in HF); head tensors that are absent stay initialised and are returned, unless their prefix is
    in `require`. Shapes must match the config. Returns the canonical names that were not found in the file.
    """
    state, source = read_state_dict(path) if tensors is None else tensors
    cfg = model.config
    family = cfg.family.weight_prefix + "."
    own = _canonical_state(model, cfg)
    loaded: dict[str, torch.Tensor] = {}
    missing: list[str] = []
    for name, param in own.items():
        if _tied(name, own):
            continue
        key = _stored_name(state, name, cfg, family)
        if key is None:
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
        if name.startswith(body) and not _OPTIONAL.match(name):
            raise BertforgeError(f"{source}: tensor {hf_name(name, cfg)!r} is missing (needed by the "
                                 f"{cfg.family.stack})")
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
