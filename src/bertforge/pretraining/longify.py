"""Making a long model from a short one: Longformer's recipe (Beltagy et al. 2020, sec. 5 and their
`convert_model_to_long.ipynb`), for a BERT or RoBERTa checkpoint.

1. The position table grows from L to N rows by copying the L learned rows over and over (row L + i starts as row
   i): attention already knows what "nearby" means, so continued pretraining starts from a low loss rather than
   from random positions (the paper's Table 5: copying cuts the starting BPC from 10.3 to 1.96).
2. Every layer gets Longformer's global projections `query_global` / `key_global` / `value_global`, initialised
   from the layer's `query` / `key` / `value`, and a sliding window (`attention_window`, 512 by default).
3. The result is written as a `longformer` checkpoint (`LongformerForMaskedLM` when the source has an MLM head, else
   `LongformerModel`) with the tokenizer's `model_max_length` set to N; transformers loads it unchanged.

A BERT source counts positions from 0 and Longformer from pad + 1 (RoBERTa's convention), so the copy maps BERT's
row i to Longformer's row pad + 1 + i; the rows up to pad (never used by a real token) keep the source's.
Then `bertforge pretrain --init-from OUT --seq-len N` continues MLM on long sequences ([CLS] attends globally).
"""
from __future__ import annotations

from pathlib import Path

import torch

from bertforge.model.checkpoint import load_pretrained, read_state_dict
from bertforge.errors import BertforgeError
from bertforge.families import ENCODER, FAMILIES
from bertforge.model.heads import MaskedLM
from bertforge.model import Encoder, ModelFolder

# the families whose layers a long-attention family's are (`Family.long_variant`)
SOURCES = tuple(name for name, fam in FAMILIES.items() if fam.long_variant)


def tiled_positions(old: torch.Tensor, old_offset: int, new_offset: int, length: int) -> torch.Tensor:
    """The new position table [new_offset + length, E]: rows below `new_offset` from `old` (or its first row),
    then the source's learned rows `old[old_offset:]` repeated until `length` rows are filled."""
    learned = old[old_offset:]
    reps = -(-length // learned.shape[0])
    head = torch.stack([old[min(i, old.shape[0] - 1)] for i in range(new_offset)]) if new_offset else old[:0]
    return torch.cat([head, learned.repeat(reps, 1)[:length]])


def longify(model: "str | Path | ModelFolder", max_length: int, out: str | Path, attention_window: int = 512) -> dict:
    """Write a Longformer checkpoint for sequences of up to `max_length` tokens made from the bert / roberta
    checkpoint `model` (see the module docstring). Returns a summary (for the CLI)."""
    folder = ModelFolder.open(model)
    model, cfg = folder.path, folder.config_for(ENCODER, verb="an encoder")
    if cfg.model_type not in SOURCES:
        raise BertforgeError(f"{model}: a {cfg.model_type} checkpoint cannot be longified (longify reads "
                             f"{', '.join(SOURCES)} checkpoints, whose layers Longformer's are)")
    if cfg.causal:
        raise BertforgeError(f"{model}: a left-to-right (is_decoder) encoder cannot be longified")
    if max_length < 2:
        raise BertforgeError(f"--max-length {max_length} must be at least 2 tokens")
    held = cfg.max_position_embeddings - cfg.position_offset
    if max_length < held:  # longify lengthens; a shorter table would throw learned positions away
        raise BertforgeError(f"--max-length {max_length} is shorter than the {held} positions {model} already has; "
                             f"longify makes a model for longer inputs (use --max-length {held} or more)")
    tok = folder.tokenizer()
    tensors = read_state_dict(model)
    has_head = any(k.startswith(("cls.predictions.", "lm_head.")) for k in tensors[0])
    old = MaskedLM(cfg) if has_head else Encoder(cfg)
    load_pretrained(old, model, tensors=tensors)
    enc_old = old.bert if has_head else old
    new_offset = cfg.pad_token_id + 1  # Longformer counts positions as RoBERTa does
    long_family = FAMILIES[cfg.family.long_variant]
    extra = {k: v for k, v in cfg.extra.items() if k not in ("architectures",)}
    extra.update(long_family.token_ids(tok))
    new_cfg = cfg.replace(model_type=long_family.model_type, max_position_embeddings=new_offset + max_length,
                          attention_window=attention_window, extra=extra)
    new = MaskedLM(new_cfg) if has_head else Encoder(new_cfg)
    enc_new = new.bert if has_head else new
    with torch.no_grad():
        own = dict(new.state_dict())
        for name, tensor in old.state_dict().items():
            if name in own and own[name].shape == tensor.shape:
                own[name].copy_(tensor)
        table = enc_old.embeddings.position_embeddings.weight
        enc_new.embeddings.position_embeddings.weight.copy_(
            tiled_positions(table, cfg.position_offset, new_offset, max_length))
        for layer in enc_new.encoder.layer:
            attn = layer.attention.self
            for local in ("query", "key", "value"):
                getattr(attn, local + "_global").load_state_dict(getattr(attn, local).state_dict())
    tok.model_max_length = max_length
    new.save_pretrained(out, tokenizer=tok)
    return {"out": str(out), "source": cfg.model_type, "architecture": long_family.head_classes["mlm"] if has_head
            else long_family.base_architecture, "max_length": max_length, "attention_window": attention_window,
            "positions": f"{cfg.max_position_embeddings - cfg.position_offset} -> {max_length}"}
