"""A retriever's question and passage towers (DPR's bi-encoder): each a `SentenceEncoder` (encoder -> pooling
([CLS], DPR's, or mean) -> the projection a checkpoint may carry), one shared by both sides or two of their own, scored
by the dot product of their vectors.

A retriever folder (what `bertforge retriever train` and `pretrain --recipe ict` write):

    OUT/retriever.json     {"format", "shared", "pooling", "question": "question", "passage": "passage"}
    OUT/question/          the question tower, a sentence-transformers folder (the same weights as passage/ when shared)
    OUT/passage/           the passage tower, a sentence-transformers folder
    OUT/transformers/question_encoder/, OUT/transformers/ctx_encoder/
                           transformers' DPRQuestionEncoder / DPRContextEncoder layout (CLS pooling, BERT towers)

`load_towers` opens any of: a retriever folder, a DPR checkpoint (its [CLS] + projection), a sentence-transformers
folder or a plain encoder; `export_dpr` writes the DPR layout of a retriever's towers.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge.embedding.modules import Dense, Normalize, Pooling, SentenceEncoder
from bertforge.errors import BertforgeError
from bertforge.families import FAMILIES
from bertforge.families.family import PROJECTION
from bertforge.io.read import read_json
from bertforge.io.write import write_json
from bertforge.model.checkpoint import hf_state_dict, write_tensors

RETRIEVER_FILE = "retriever.json"
FORMAT = "bertforge-retriever"
QUESTION_DIR, PASSAGE_DIR, HF_DIR = "question", "passage", "transformers"  # HF_DIR: the DPR layout
POOLINGS = ("cls", "mean")


class BiEncoder(nn.Module):
    """Question and passage towers; `forward(**batch)` embeds the batch's questions and passages and returns
    {"loss", "accuracy"} (`retrieval.dpr.dpr_loss`)."""

    def __init__(self, question: SentenceEncoder, passage: SentenceEncoder | None = None):
        super().__init__()
        self.question = question
        self.passage = passage  # None: the question tower encodes passages too (shared)

    @property
    def shared(self) -> bool:
        return self.passage is None

    @property
    def passage_tower(self) -> SentenceEncoder:
        return self.question if self.passage is None else self.passage

    def forward(self, q_input_ids: torch.Tensor, q_attention_mask: torch.Tensor, q_token_type_ids: torch.Tensor,
                p_input_ids: torch.Tensor, p_attention_mask: torch.Tensor, p_token_type_ids: torch.Tensor,
                targets: torch.Tensor, same: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        from bertforge.retrieval.dpr import dpr_loss

        q = self.question.embed_features({"input_ids": q_input_ids, "attention_mask": q_attention_mask,
                                          "token_type_ids": q_token_type_ids})
        p = self.passage_tower.embed_features({"input_ids": p_input_ids, "attention_mask": p_attention_mask,
                                               "token_type_ids": p_token_type_ids})
        loss, accuracy = dpr_loss(q, p, targets, same)
        return {"loss": loss, "accuracy": accuracy.detach()}


# ---- opening towers ------------------------------------------------------------------------------------------------
def is_retriever(path: Any) -> bool:
    return isinstance(path, (str, Path)) and (Path(path) / RETRIEVER_FILE).is_file()


def _trainable(encoder: SentenceEncoder, pooling: str | None) -> SentenceEncoder:
    """A tower as it trains: the network as the family it wraps (a DPR checkpoint's BertModel), `pooling` in place
    of its own, no final Normalize (DPR scores raw dot products)."""
    modules = list(encoder)
    bert = modules[0].bert
    wraps = bert.config.family.wraps
    if wraps is not None:
        bert.config = bert.config.replace(model_type=wraps, extra={})
    if pooling is not None:
        idx = next((i for i, m in enumerate(modules) if isinstance(m, Pooling)), None)
        new = Pooling(modules[0].dim, [pooling])
        if idx is None:
            modules.insert(1, new)
        elif new.out_dim != modules[idx].out_dim and any(isinstance(m, Dense) for m in modules):
            raise BertforgeError(f"pooling {pooling!r} changes the vector size, which the model's Dense layer forbids")
        else:
            modules[idx] = new
    if isinstance(modules[-1], Normalize):
        modules.pop()
    tower = SentenceEncoder(*modules)
    tower.source = encoder.source
    return tower


def load_towers(model: Any, passage_model: Any = None, separate: bool = False, pooling: str | None = None,
                revision: str | None = None) -> BiEncoder:
    """The towers to train from `model`: a retriever folder (its towers, shared or not as saved unless `separate`),
    or any encoder folder / Hub id, shared or (`separate`, or a `passage_model` of its own) copied into two towers.
    `pooling`: cls or mean (None: a retriever's own, else cls as DPR)."""
    if pooling is not None and pooling not in POOLINGS:
        raise BertforgeError(f"pooling: expected one of {', '.join(POOLINGS)}, got {pooling!r}")
    if is_retriever(model):
        info = read_retriever(model)
        root = Path(model)
        question = _trainable(SentenceEncoder.from_pretrained(root / info["question"]), pooling)
        passage = None
        if not info["shared"] or separate or passage_model is not None:
            source = passage_model if passage_model is not None else root / info["passage"]
            passage = _trainable(SentenceEncoder.from_pretrained(source, revision=revision), pooling)
        return BiEncoder(question, passage)
    pooling = pooling or "cls"
    question = _trainable(SentenceEncoder.from_pretrained(model, revision=revision), pooling)
    if passage_model is not None:
        passage = _trainable(SentenceEncoder.from_pretrained(passage_model, revision=revision), pooling)
    elif separate:
        passage = _trainable(SentenceEncoder.from_pretrained(model, revision=revision), pooling)
    else:
        passage = None
    return BiEncoder(question, passage)


def read_retriever(path: str | Path) -> dict[str, Any]:
    """A retriever folder's retriever.json, checked."""
    file = Path(path) / RETRIEVER_FILE
    info = read_json(file)
    if info.get("format") != FORMAT or not isinstance(info.get("shared"), bool):
        raise BertforgeError(f"{file}: not a bertforge retriever description")
    for key in ("question", "passage"):
        if not isinstance(info.get(key), str) or not (Path(path) / info[key] / "modules.json").is_file():
            raise BertforgeError(f"{file}: {key} names no sentence-transformers folder in {path}")
    return info


def load_retriever(path: str | Path) -> tuple[SentenceEncoder, SentenceEncoder]:
    """(question tower, passage tower) of a retriever folder, for encoding (the same object when shared)."""
    info = read_retriever(path)
    question = SentenceEncoder.from_pretrained(Path(path) / info["question"])
    passage = question if info["shared"] else SentenceEncoder.from_pretrained(Path(path) / info["passage"])
    return question, passage


# ---- saving --------------------------------------------------------------------------------------------------------
def _pooling_of(tower: SentenceEncoder) -> str:
    pool = tower.pooling
    return "+".join(pool.modes) if pool is not None else "none"


def save_retriever(model: BiEncoder, out: str | Path, dpr: bool = True) -> Path:
    """Write a retriever folder (the module's layout); `dpr`: the DPR layout too, where the towers have one."""
    out = Path(out)
    towers = ((QUESTION_DIR, model.question), (PASSAGE_DIR, model.passage_tower))
    for sub, tower in towers:
        tower.save_pretrained(out / sub)
        _dot_similarity(out / sub)
    write_json(out / RETRIEVER_FILE, {"format": FORMAT, "shared": model.shared, "pooling": _pooling_of(model.question),
                                      "similarity": "dot", "question": QUESTION_DIR, "passage": PASSAGE_DIR})
    if dpr and dpr_layout_problem(model.question) is None and dpr_layout_problem(model.passage_tower) is None:
        export_dpr_towers(model.question, model.passage_tower, out / HF_DIR)
    return out


def _dot_similarity(folder: Path) -> None:
    """sentence-transformers scores a retriever's vectors by their dot product, as it was trained."""
    file = folder / "config_sentence_transformers.json"
    config = read_json(file)
    config["similarity_fn_name"] = "dot"
    write_json(file, config)


# ---- transformers' DPR layout --------------------------------------------------------------------------------------
def _dpr_family(model_type: str):
    """The family whose checkpoints hold towers of `model_type` in two layouts (DPR's, for BERT)."""
    return next((fam for fam in FAMILIES.values() if fam.wraps == model_type and fam.alternative_architecture), None)


def dpr_layout_problem(tower: SentenceEncoder) -> str | None:
    """Why `tower` has no DPR layout (None: it has one): DPR's towers are BERT encoders read at [CLS], optionally
    projected by a linear layer."""
    cfg = tower.transformer.bert.config
    if _dpr_family(cfg.model_type) is None:
        return f"a {cfg.model_type} encoder has no DPR layout (DPR's towers are BERT encoders)"
    modules = list(tower)[1:]
    if not modules or not isinstance(modules[0], Pooling) or modules[0].modes != ["cls"]:
        return "DPR's towers are read at [CLS]; this one pools otherwise (train with pooling cls)"
    rest = modules[1:]
    if len(rest) > 1 or (rest and not (isinstance(rest[0], Dense) and rest[0].activation_name == "Identity")):
        return "DPR's towers end with at most one linear projection; this one has more after its pooling"
    return None


class _DPRTower(nn.Module):
    """An encoder and its projection under the canonical names the DPR family's rules map."""

    def __init__(self, tower: SentenceEncoder):
        super().__init__()
        self.bert = tower.transformer.bert
        dense = next((m for m in tower if isinstance(m, Dense)), None)
        if dense is not None:
            setattr(self, PROJECTION, dense.linear)


def export_dpr_towers(question: SentenceEncoder, passage: SentenceEncoder, out: str | Path) -> dict[str, Path]:
    """Write the towers as transformers' DPRQuestionEncoder (out/question_encoder) and DPRContextEncoder
    (out/ctx_encoder) folders, each with its tokenizer; one line when a tower has no DPR layout."""
    out = Path(out)
    written = {}
    for name, tower, alternative in (("question_encoder", question, False), ("ctx_encoder", passage, True)):
        problem = dpr_layout_problem(tower)
        if problem is not None:
            raise BertforgeError(f"{name}: {problem}")
        cfg = tower.transformer.bert.config
        dense = next((m for m in tower if isinstance(m, Dense)), None)
        fam = _dpr_family(cfg.model_type)
        dpr_cfg = cfg.replace(model_type=fam.model_type, use_pooler=False,
                              extra={fam.projection_field: dense.out_dim if dense is not None else 0})
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {k: v for k, v in hf_state_dict(_DPRTower(tower), dpr_cfg, alternative).items()
                   if ".pooler." not in k}  # DPR's BertModel has no pooler
        write_tensors(folder / "model.safetensors", tensors)
        arch = fam.alternative_architecture if alternative else fam.base_architecture
        write_json(folder / "config.json", dpr_cfg.to_hf_dict([arch]), sort_keys=True)
        tower.tokenizer.save_pretrained(folder)
        written[name] = folder
    return written


def export_dpr(retriever: str | Path, out: str | Path) -> dict[str, Path]:
    """A retriever folder's towers in transformers' DPR layout (see `export_dpr_towers`)."""
    question, passage = load_retriever(retriever)
    return export_dpr_towers(question, passage, out)

