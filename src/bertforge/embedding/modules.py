"""Sentence-transformers-style composable modules: Transformer -> Pooling -> [Dense] -> [Normalize].

Each module maps a `features` dict to a `features` dict, as in sentence-transformers, so a `SentenceEncoder` is a
plain pipeline. Directories are read and written in sentence-transformers' layout (modules.json,
sentence_bert_config.json, 1_Pooling/config.json, 2_Dense/{config.json,model.safetensors}), so
`sentence_transformers.SentenceTransformer(dir)` loads what `SentenceEncoder.save_pretrained` writes and vice versa.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertforge.io.write import write_json
from bertforge.model.checkpoint import load_pretrained, read_tensors, save_pretrained, write_tensors
from bertforge.embedding.encode import encode as encode_texts
from bertforge.errors import BertforgeError
from bertforge.io.read import read_json
from bertforge.model.heads import mean_pool
from bertforge.config.positions import check_length, fit_length
from bertforge.families import ENCODER
from bertforge.families.family import PROJECTION
from bertforge.model import Encoder
from bertforge.model.folder import ModelFolder
from bertforge.model.onnx import OnnxModel
from bertforge.tokenization import Tokenizer

Features = dict[str, torch.Tensor]

# sentence-transformers' type names (the classic ones every ST version since 2.0 still resolves).
ST_TRANSFORMER = "sentence_transformers.models.Transformer"
ST_POOLING = "sentence_transformers.models.Pooling"
ST_DENSE = "sentence_transformers.models.Dense"
ST_NORMALIZE = "sentence_transformers.models.Normalize"

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len")  # ST's concatenation order
_LEGACY_KEYS = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens",
                "mean": "pooling_mode_mean_tokens", "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens"}
_NEW_NAMES = {"cls": "cls", "max": "max", "mean": "mean", "mean_sqrt_len_tokens": "mean_sqrt_len"}


class Transformer(nn.Module):
    """Encoder + tokenizer: texts -> token embeddings (`token_embeddings`, `attention_mask`)."""

    def __init__(self, encoder: Encoder, tokenizer: Tokenizer, max_seq_length: int = 256,
                 do_lower_case: bool = False):
        super().__init__()
        self.bert = encoder
        self.tokenizer = tokenizer
        self.max_seq_length = fit_length(int(max_seq_length), encoder.config)
        self.do_lower_case = do_lower_case

    @property
    def dim(self) -> int:
        return self.bert.config.hidden_size

    def _prepare(self, texts: Sequence[str]) -> list[str]:
        return [t.strip().lower() if self.do_lower_case else t.strip() for t in texts]  # ST strips too

    def tokenize(self, texts: Sequence[str], pairs: Sequence[str] | None = None) -> Features:
        """Batch-encode with padding to the longest text and truncation to max_seq_length."""
        return self.tokenizer(self._prepare(texts), pairs=pairs, max_length=self.max_seq_length, padding="longest",
                              truncation=True, return_tensors="pt")

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Unpadded id lists, truncated to max_seq_length (fast encoding pads per length-sorted batch)."""
        return self.tokenizer(self._prepare(texts), max_length=self.max_seq_length, padding=False,
                              truncation=True, return_tensors=None)["input_ids"]

    def forward(self, features: Features) -> Features:
        out = self.bert(features["input_ids"], attention_mask=features.get("attention_mask"),
                        token_type_ids=features.get("token_type_ids"))
        features["token_embeddings"] = out.last_hidden_state
        return features

    @classmethod
    def load(cls, folder: ModelFolder, onnx: Path | None = None) -> "Transformer":
        """The encoder in the opened model folder (a quantised folder loads int8), or the exported graph `onnx` in
        onnxruntime."""
        path = folder.path
        cfg = read_json(path / "sentence_bert_config.json") if (path / "sentence_bert_config.json").is_file() else {}
        max_len = cfg.get("max_seq_length")
        if max_len is not None:  # recorded: the positions rule (a default is fitted to the positions instead)
            source = f"{path / 'sentence_bert_config.json'}: max_seq_length"
            if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 1:
                raise BertforgeError(f"{source} must be a whole number >= 1 (got {max_len!r})")
            check_length(max_len, folder.config_for(ENCODER, verb="an encoder"), path, source)
        tok = folder.tokenizer()
        max_len = max_len or _tokenizer_max_length(path) or 512
        if onnx is None:
            encoder = Encoder.from_pretrained(folder)
        else:
            encoder = OnnxModel(onnx)
            if "last_hidden_state" not in encoder.output_names:
                raise BertforgeError(f"{onnx}: the graph has no last_hidden_state output (exported by an older "
                                     "bertforge?); export the model again")
            encoder.config = folder.config_for(ENCODER, verb="an encoder")  # the sizes Transformer and pooling read
        return cls(encoder, tok, max_len, bool(cfg.get("do_lower_case", False)))

    def save(self, path: Path) -> None:
        if isinstance(self.bert, OnnxModel):
            raise BertforgeError(f"{self.bert.file}: an ONNX graph runs in onnxruntime only; it cannot be trained or "
                                 "saved (use the PyTorch model it was exported from)")
        save_pretrained(self.bert, path, self.bert.config, tokenizer=self.tokenizer)
        write_json(path / "sentence_bert_config.json",
                    {"max_seq_length": self.max_seq_length, "do_lower_case": self.do_lower_case})


def _tokenizer_max_length(path: Path) -> int | None:
    """model_max_length from tokenizer_config.json when sensible (HF writes 1e30 for 'unlimited')."""
    cfg_path = path / "tokenizer_config.json"
    if not cfg_path.is_file():
        return None
    value = read_json(cfg_path).get("model_max_length")
    return int(value) if isinstance(value, (int, float)) and 0 < value <= 100_000 else None


class Pooling(nn.Module):
    """Token embeddings -> one vector per text; several modes are concatenated in ST's order."""

    def __init__(self, dim: int, modes: Sequence[str] = ("mean",)):
        super().__init__()
        modes = [m.replace("-", "_") for m in modes]
        bad = [m for m in modes if m not in POOLING_MODES]
        if bad or not modes:
            raise BertforgeError(f"unknown pooling mode {bad or modes!r} (expected {', '.join(POOLING_MODES)})")
        self.dim = dim
        self.modes = [m for m in POOLING_MODES if m in modes]

    @property
    def out_dim(self) -> int:
        return self.dim * len(self.modes)

    def forward(self, features: Features) -> Features:
        tokens = features["token_embeddings"]
        mask = features.get("attention_mask")
        if mask is None:
            mask = torch.ones(tokens.shape[:2], dtype=torch.long, device=tokens.device)
        m = mask.unsqueeze(-1).to(tokens.dtype)
        parts = []
        for mode in self.modes:
            if mode == "cls":
                parts.append(tokens[:, 0])
            elif mode == "max":
                parts.append(tokens.masked_fill(m == 0, -1e9).max(dim=1).values)
            elif mode == "mean":
                parts.append(mean_pool(tokens, mask))
            else:  # mean_sqrt_len: the sum over real tokens divided by the square root of their count
                parts.append((tokens * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9).sqrt())
        features["sentence_embedding"] = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        return features

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {"word_embedding_dimension": self.dim}
        for mode, key in _LEGACY_KEYS.items():
            cfg[key] = mode in self.modes
        cfg.update(pooling_mode_weightedmean_tokens=False, pooling_mode_lasttoken=False, include_prompt=True)
        return cfg

    @classmethod
    def load(cls, path: Path) -> "Pooling":
        cfg = read_json(path / "config.json")
        if "pooling_mode" in cfg:  # sentence-transformers >= 6 layout: {"embedding_dimension", "pooling_mode"}
            raw = cfg["pooling_mode"]
            raw = [raw] if isinstance(raw, str) else list(raw)
            modes = [_NEW_NAMES.get(m, m) for m in raw]
            dim = cfg.get("embedding_dimension", cfg.get("word_embedding_dimension"))
        else:
            for key in ("pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken"):
                if cfg.get(key):
                    raise BertforgeError(f"{path / 'config.json'}: {key} is not supported")
            modes = [mode for mode, key in _LEGACY_KEYS.items() if cfg.get(key)]
            dim = cfg.get("word_embedding_dimension")
        if not isinstance(dim, int):
            raise BertforgeError(f"{path / 'config.json'}: missing word_embedding_dimension")
        return cls(dim, modes)

    def save(self, path: Path) -> None:
        write_json(path / "config.json", self.config())


_ACTIVATIONS = {"Tanh": nn.Tanh, "Identity": nn.Identity, "ReLU": nn.ReLU, "GELU": nn.GELU, "Sigmoid": nn.Sigmoid}


class Dense(nn.Module):
    """A linear layer (+ activation, Tanh by default) on the sentence embedding: ST's `Dense`."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: str = "Tanh"):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise BertforgeError(f"unsupported Dense activation {activation!r} (expected {', '.join(_ACTIVATIONS)})")
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.activation_name = activation
        self.activation = _ACTIVATIONS[activation]()

    @property
    def out_dim(self) -> int:
        return self.linear.out_features

    def forward(self, features: Features) -> Features:
        features["sentence_embedding"] = self.activation(self.linear(features["sentence_embedding"]))
        return features

    @classmethod
    def load(cls, path: Path) -> "Dense":
        cfg = read_json(path / "config.json")
        act = str(cfg.get("activation_function", "torch.nn.modules.activation.Tanh")).rsplit(".", 1)[-1]
        dense = cls(int(cfg["in_features"]), int(cfg["out_features"]), bool(cfg.get("bias", True)), act)
        weights = path / "model.safetensors"
        if not weights.is_file():
            raise BertforgeError(f"{weights}: missing (only safetensors Dense weights are read)")
        state = read_tensors(weights)
        try:
            dense.load_state_dict({k: v for k, v in state.items() if k.startswith("linear.")})
        except RuntimeError as err:
            raise BertforgeError(f"{weights}: does not match config.json ({err})") from None
        return dense

    def save(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        act = "torch.nn.modules.linear.Identity" if self.activation_name == "Identity" else \
            f"torch.nn.modules.activation.{self.activation_name}"
        write_json(path / "config.json", {"in_features": self.linear.in_features,
                                           "out_features": self.linear.out_features,
                                           "bias": self.linear.bias is not None, "activation_function": act})
        write_tensors(path / "model.safetensors",
                      {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()})


class Normalize(nn.Module):
    """L2-normalise the sentence embedding (cosine similarity becomes a dot product)."""

    def forward(self, features: Features) -> Features:
        features["sentence_embedding"] = F.normalize(features["sentence_embedding"], p=2, dim=1)
        return features

    @classmethod
    def load(cls, path: Path) -> "Normalize":
        return cls()

    def save(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)


_MODULE_TYPES = {"Transformer": Transformer, "Pooling": Pooling, "Dense": Dense, "Normalize": Normalize}
_TYPE_NAMES = {Transformer: ST_TRANSFORMER, Pooling: ST_POOLING, Dense: ST_DENSE, Normalize: ST_NORMALIZE}
_FOLDERS = {Pooling: "Pooling", Dense: "Dense", Normalize: "Normalize"}


class SentenceEncoder(nn.Sequential):
    """A bi-encoder: texts -> fixed-size vectors. `model(features)` runs the pipeline on tokenized features."""

    source: Path | None = None
    compile_inference = False  # encode() with a torch.compile'd copy (`--compile`)
    # An exported folder's graph already holds the pooling (and a final Normalize): its `sentence_embedding`
    # output is this pipeline's vector when the folder's modules were loaded as saved. None: it is not (no such
    # output, or pooling was replaced at load); True / False: it is, L2-normalised or not.
    graph_normalized: bool | None = None

    def __init__(self, *modules: nn.Module):
        super().__init__(*modules)
        if not modules or not isinstance(modules[0], Transformer):
            raise BertforgeError("a SentenceEncoder starts with a Transformer module")

    # ---- structure ---------------------------------------------------------------------------------------------
    @property
    def transformer(self) -> Transformer:
        return self[0]

    @property
    def tokenizer(self) -> Tokenizer:
        return self.transformer.tokenizer

    @property
    def max_seq_length(self) -> int:
        return self.transformer.max_seq_length

    @property
    def pooling(self) -> Pooling | None:
        return next((m for m in self if isinstance(m, Pooling)), None)

    @property
    def normalizes(self) -> bool:
        return isinstance(self[-1], Normalize)

    @property
    def dim(self) -> int:
        dim = self.transformer.dim
        for m in self:
            dim = getattr(m, "out_dim", dim) if not isinstance(m, Transformer) else dim
        return dim

    def tokenize(self, texts: Sequence[str]) -> Features:
        return self.transformer.tokenize(texts)

    def embed_features(self, features: Features) -> torch.Tensor:
        """Sentence embeddings for tokenized features (with gradients: the training path)."""
        return self(dict(features))["sentence_embedding"]

    def encode(self, texts: Sequence[str], batch_size: int = 32, precision: str = "fp32",
               normalize: bool | None = None, progress: bool = True, precision_checked: bool = False) -> np.ndarray:
        """Texts -> [N, dim] float32 array in input order (fast path: see `bertforge.embedding.encode`).

        precision: "fp32" (matches sentence-transformers to ~1e-6), "bf16", "fp16" (GPU) or "int8" (CPU).
        normalize: None keeps the model's own choice (its final Normalize module), True/False forces L2
        normalisation on/off. Runs on the model's device (`model.to("cuda")`).
        """
        head = nn.Sequential(*[m for m in list(self)[1:] if not isinstance(m, Normalize)])  # Pooling, Dense
        normalize = self.normalizes if normalize is None else normalize
        # the graph's own pooled output saves a pooling pass in PyTorch between onnxruntime calls (whose threads
        # and torch's would contend for the same cores); not when it is normalised and raw vectors are asked for
        graph_pools = self.graph_normalized is not None and (normalize or not self.graph_normalized)
        return encode_texts(self.transformer.bert, self.transformer.token_ids, self.tokenizer.pad_token_id,
                            None if graph_pools else lambda features: head(features)["sentence_embedding"],
                            texts, self.dim, batch_size=batch_size, precision=precision, normalize=normalize,
                            progress=progress, compile=self.compile_inference, precision_checked=precision_checked)

    # ---- construction ------------------------------------------------------------------------------------------
    @classmethod
    def from_encoder(cls, encoder: Encoder, tokenizer: Tokenizer, pooling: str | Sequence[str] = "mean",
                     normalize: bool = False, max_seq_length: int = 256, dense_dim: int | None = None
                     ) -> "SentenceEncoder":
        transformer = Transformer(encoder, tokenizer, max_seq_length)
        pool = Pooling(transformer.dim, [pooling] if isinstance(pooling, str) else pooling)
        modules: list[nn.Module] = [transformer, pool]
        if dense_dim:
            modules.append(Dense(pool.out_dim, dense_dim))
        if normalize:
            modules.append(Normalize())
        return cls(*modules)

    @classmethod
    def from_pretrained(cls, path: "str | Path | ModelFolder", pooling: str | Sequence[str] | None = None,
                        normalize: bool | None = None, revision: str | None = None) -> "SentenceEncoder":
        """Load a sentence-transformers folder (modules.json) or a plain HF encoder dir (mean pooling, or its family's
        own: a DPR tower's [CLS] + projection); `path` may
        be an opened model folder, or a Hugging Face Hub id (at `revision`; from the cache when offline).

        `pooling` replaces the folder's pooling modes; `normalize` adds or removes a final Normalize.
        """
        folder = ModelFolder.open(path, revision=revision)
        onnx, path = folder.graph, folder.path  # an exported folder (or one of its .onnx files) runs in onnxruntime
        if (path / "modules.json").is_file():
            modules = []
            entries = read_json(path / "modules.json", expect=list)
            for entry in sorted(entries, key=lambda e: e.get("idx", 0)):
                kind = str(entry.get("type", "")).rsplit(".", 1)[-1]
                if kind not in _MODULE_TYPES:
                    raise BertforgeError(f"{path / 'modules.json'}: unsupported module type {entry.get('type')!r}")
                sub = path / entry.get("path", "")
                if kind == "Transformer":
                    modules.append(Transformer.load(folder if sub == path else ModelFolder.open(sub), onnx))
                else:
                    modules.append(_MODULE_TYPES[kind].load(sub))
            if not isinstance(modules[0], Transformer):
                raise BertforgeError(f"{path / 'modules.json'}: the first module must be a Transformer")
        else:
            modules = [Transformer.load(folder, onnx)]
            modules.extend(_family_head(folder, modules[0].dim))
        if pooling is not None:
            new = Pooling(modules[0].dim, [pooling] if isinstance(pooling, str) else pooling)
            idx = next((i for i, m in enumerate(modules) if isinstance(m, Pooling)), None)
            if idx is None:
                modules.insert(1, new)
            else:
                if new.out_dim != modules[idx].out_dim and any(isinstance(m, Dense) for m in modules):
                    raise BertforgeError(f"{path}: --pooling changes the vector size, which its Dense layer forbids")
                modules[idx] = new
        saved_normalizes = isinstance(modules[-1], Normalize)
        if normalize is True and not isinstance(modules[-1], Normalize):
            modules.append(Normalize())
        elif normalize is False and isinstance(modules[-1], Normalize):
            modules.pop()
        model = cls(*modules).eval()
        model.source = path
        graph = model.transformer.bert
        if isinstance(graph, OnnxModel) and "sentence_embedding" in graph.output_names and pooling is None:
            model.graph_normalized = saved_normalizes
        return model

    def save_pretrained(self, path: str | Path) -> Path:
        """Write sentence-transformers' layout: encoder files at the top level, one sub-folder per later module."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        entries = []
        for idx, module in enumerate(self):
            if isinstance(module, Transformer):
                sub = ""
            else:
                sub = f"{idx}_{_FOLDERS[type(module)]}"
            (path / sub).mkdir(parents=True, exist_ok=True)
            module.save(path / sub)
            entries.append({"idx": idx, "name": str(idx), "path": sub, "type": _TYPE_NAMES[type(module)]})
        write_json(path / "modules.json", entries)
        write_json(path / "config_sentence_transformers.json",
                    {"__version__": {"pytorch": torch.__version__, "bertforge": _version()},
                     "prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"})
        return path

    # ---- identity ----------------------------------------------------------------------------------------------
    def fingerprint(self) -> str:
        """sha256 over every weight tensor in memory, the vocabulary and the pooling/head config.

        Two models whose vectors point in different directions for the same text get different fingerprints, so
        an index built with one refuses queries from the other. The tensors in memory are hashed (not a file on
        disk), so a model changed after loading is a different model; the same weights hash the same wherever
        they came from. A final Normalize is left out: indexes always store unit vectors, so it cannot change a
        ranking. Cached until a parameter changes (every in-place update bumps its version counter).
        """
        stamp = tuple((id(p), p._version) for p in self.parameters())
        cached = getattr(self, "_fingerprint_cache", None)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        h = hashlib.sha256()
        for name, tensor in sorted(self.state_dict().items()):
            if not torch.is_floating_point(tensor) and tensor.dtype != torch.long:
                continue
            h.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
            h.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        if isinstance(self.transformer.bert, OnnxModel):  # its weights live in the graph file
            h.update(self.transformer.bert.digest.encode())
        h.update(self.transformer.tokenizer.backend.to_str().encode())
        layout = []
        for module in self:
            if isinstance(module, Transformer):
                layout.append({"max_seq_length": module.max_seq_length, "lower": module.do_lower_case})
            elif isinstance(module, Pooling):
                layout.append(module.config())
            elif isinstance(module, Dense):
                layout.append({"act": module.activation_name})  # its weights are in the state_dict above
        h.update(json.dumps(layout, sort_keys=True).encode())
        self._fingerprint_cache = (stamp, h.hexdigest())
        return self._fingerprint_cache[1]


class _Projection(nn.Module):
    """A family's linear map of the sentence vector under its canonical name, for `load_pretrained`."""

    def __init__(self, config: Any, linear: nn.Linear):
        super().__init__()
        self.config = config
        setattr(self, PROJECTION, linear)


def _family_head(folder: ModelFolder, dim: int) -> list[nn.Module]:
    """The modules after the encoder of a plain encoder folder: mean pooling, or the sentence vector its family
    defines (DPR's [CLS] vector, projected by the checkpoint's own linear layer when its config says so)."""
    cfg = folder.model_config
    fam = cfg.family if cfg is not None else None
    pool = Pooling(dim, [fam.sentence_pooling or "mean"] if fam is not None else ["mean"])
    width = cfg.extra.get(fam.projection_field) if fam is not None and fam.projection_field else None
    if not width or folder.graph is not None:
        return [pool]
    dense = Dense(dim, int(width), activation="Identity")
    load_pretrained(_Projection(cfg, dense.linear), folder.path, require=(PROJECTION + ".",))
    return [pool, dense]


def _version() -> str:
    try:
        return importlib.metadata.version("bertforge")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "0"

