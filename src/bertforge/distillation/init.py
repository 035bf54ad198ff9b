"""DistilBERT's student initialisation: keep the teacher's embeddings and one layer out of two.

Sanh et al. (2019): the student has the teacher's width, half its depth, no token-type embeddings and no pooler,
and starts from the teacher's weights "by taking one layer out of two". The MLM head is copied too when the
teacher has one, so the student starts as a working masked LM.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from bertforge.config import ModelConfig
from bertforge.errors import BertforgeError
from bertforge.families import FAMILIES
from bertforge.model.heads import MaskedLM
from bertforge.model import Encoder, ModelFolder
from bertforge.tokenization import Tokenizer


def student_from_teacher(teacher: nn.Module, layers: Sequence[int] | None = None) -> MaskedLM:
    """A DistilBERT-shaped MaskedLM initialised from `teacher` (an Encoder or a wrapper with `.bert`).

    `layers` picks the teacher layers to keep (default: every other one, 0, 2, 4, ...).
    """
    t_enc: Encoder = teacher if isinstance(teacher, Encoder) else teacher.bert
    t_cfg = t_enc.config
    if t_cfg.family.distils_to is None:
        # DistilBERT counts positions from 0 and has no token types: a RoBERTa teacher's offset positions
        # (or an ALBERT / ELECTRA layout) would be copied into the wrong rows.
        teachers = [name for name, fam in FAMILIES.items() if fam.distils_to]
        raise BertforgeError(f"a DistilBERT student needs a {' or '.join(teachers)} teacher, not {t_cfg.model_type}")
    if t_cfg.embedding_size != t_cfg.hidden_size or t_cfg.share_layers != "none":
        raise BertforgeError("a DistilBERT student needs a teacher with unfactorised embeddings and unshared layers")
    keep = list(layers) if layers is not None else list(range(0, t_cfg.num_hidden_layers, 2))
    if not keep or any(not 0 <= i < t_cfg.num_hidden_layers for i in keep):
        raise BertforgeError(f"layers {keep} are not all within the teacher's {t_cfg.num_hidden_layers} layers")
    cfg = ModelConfig(model_type=t_cfg.family.distils_to, vocab_size=t_cfg.vocab_size, hidden_size=t_cfg.hidden_size,
                      num_hidden_layers=len(keep), num_attention_heads=t_cfg.num_attention_heads,
                      intermediate_size=t_cfg.intermediate_size, hidden_act=t_cfg.hidden_act,
                      hidden_dropout_prob=t_cfg.hidden_dropout_prob,
                      attention_probs_dropout_prob=t_cfg.attention_probs_dropout_prob,
                      max_position_embeddings=t_cfg.max_position_embeddings, type_vocab_size=0,
                      initializer_range=t_cfg.initializer_range, layer_norm_eps=t_cfg.layer_norm_eps,
                      pad_token_id=t_cfg.pad_token_id, use_pooler=False)
    # built where the teacher's weights are (device and dtype), like everything made from existing weights
    student = MaskedLM(cfg).to(device=t_enc.embeddings.word_embeddings.weight.device,
                               dtype=t_enc.embeddings.word_embeddings.weight.dtype)
    s_enc = student.bert
    with torch.no_grad():
        emb_t, emb_s = t_enc.embeddings, s_enc.embeddings
        emb_s.word_embeddings.weight.copy_(emb_t.word_embeddings.weight)
        emb_s.position_embeddings.weight.copy_(emb_t.position_embeddings.weight)
        emb_s.LayerNorm.load_state_dict(emb_t.LayerNorm.state_dict())
        for s_layer, t_index in zip(s_enc.encoder.layer, keep):
            s_layer.load_state_dict(t_enc.encoder.layer[t_index].state_dict())
        head = getattr(getattr(teacher, "cls", None), "predictions", None)
        if head is not None:
            student.cls.predictions.transform.load_state_dict(head.transform.state_dict())
            student.cls.predictions.bias.copy_(head.bias)
    return student


def check_same_vocab(teacher: Tokenizer, teacher_dir: Path, student: ModelFolder) -> None:
    """Refuse a student whose tokenizer maps pieces to other ids than the teacher's (one line, before training):
    soft targets over another vocabulary, or teacher logits for other ids, would be silently meaningless."""
    s = student.tokenizer()
    if teacher.vocab_size != s.vocab_size or teacher.backend.get_vocab() != s.backend.get_vocab():
        raise BertforgeError(f"--student {student.path}: its vocabulary ({s.vocab_size} pieces) differs from the "
                             f"teacher's ({teacher.vocab_size} pieces, {teacher_dir}); distillation needs the same "
                             "tokenizer")
