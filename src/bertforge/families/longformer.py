"""Longformer (Beltagy et al. 2020; allenai/longformer-base-4096): RoBERTa's body and vocabulary, 4,096 positions
(+2: pad and the offset), a 512-token window per layer (`attention_window`), global attention on tokens of the
caller's choice with their own Q/K/V (`query_global`, ..., which keep their names). Tensor names: RoBERTa's under
`longformer.`."""
from typing import Any

from bertforge.families.family import (FIRST_TOKEN, SLIDING_WINDOW, CheckpointLayout, ConfigSchema, Defaults, Family,
                                       Heads, StackTraits, VerbDefaults, bert_read_config, bert_write_config)
from bertforge.families.record.schema import BERT_CHECKS, MAX_POSITIONS, Field, checks
from bertforge.families.roberta import LM_HEAD_RULES

WINDOW = 512  # allenai/longformer-base-4096


def write_config(cfg: Any) -> dict[str, Any]:
    return {**bert_write_config(cfg), "attention_window": list(cfg.attention_window), "bos_token_id": 0,
            "eos_token_id": 2, "sep_token_id": 2, "onnx_export": False}


def read_config(fam: Family, d: dict[str, Any], source: str, ours: dict[str, Any]) -> dict[str, Any]:
    return {**bert_read_config(fam, d, source, ours), "attention_window": d.get("attention_window", WINDOW)}


FAMILY = Family(
    "longformer", "Longformer", "longformer",
    head_classes={"mlm": "LongformerForMaskedLM"},
    checkpoint=CheckpointLayout(
        weight_rules=(*LM_HEAD_RULES, (r"^bert\.", "longformer."))),
    schema=ConfigSchema(
        checks=checks((("attention_window",), Field("window", 2, MAX_POSITIONS)), base=BERT_CHECKS),
        write_config=write_config,
        read_config=read_config,
        keeps_token_ids=True,
        token_ids_from_tokenizer={"bos_token_id": "cls", "eos_token_id": "sep", "sep_token_id": "sep"}),
    defaults=Defaults(
        vocab_size=50265,
        pad_token_id=1,
        max_position_embeddings=4098,
        type_vocab_size=1,
        layer_norm_eps=1e-5),
    structure=StackTraits(
        positions_after_padding=True,
        sparse_attention=SLIDING_WINDOW),
    heads=Heads(
        mlm_head_act="gelu",
        sequence_head=FIRST_TOKEN,
        single_segment=True),
    verbs=VerbDefaults(
        long_variant="longformer"))
