"""Longformer (Beltagy et al. 2020; allenai/longformer-base-4096): RoBERTa's body and vocabulary, 4,096 positions
(+2: pad and the offset), a 512-token window per layer (`attention_window`), global attention on tokens of the
caller's choice with their own Q/K/V (`query_global`, ..., which keep their names). Tensor names: RoBERTa's under
`longformer.`."""
from typing import Any

from bertforge.families.family import Family, bert_config_json, bert_settings
from bertforge.families.roberta import LM_HEAD_RULES

WINDOW = 512  # allenai/longformer-base-4096


def config_json(cfg: Any) -> dict[str, Any]:
    return {**bert_config_json(cfg), "attention_window": list(cfg.attention_window), "bos_token_id": 0,
            "eos_token_id": 2, "sep_token_id": 2, "onnx_export": False}


def settings(fam: Family, d: dict[str, Any], source: str, ours: dict[str, Any]) -> dict[str, Any]:
    return {**bert_settings(fam, d, source, ours), "attention_window": d.get("attention_window", WINDOW)}


FAMILY = Family("longformer", "Longformer", "longformer", write_config=config_json, read_config=settings,
                weight_rules=(*LM_HEAD_RULES, (r"^bert\.", "longformer.")),
                vocab_size=50265, pad_token_id=1, max_position_embeddings=4098, type_vocab_size=1, layer_norm_eps=1e-5,
                positions_after_padding=True, keeps_token_ids=True, sparse="longformer", lm_head_activation="gelu",
                classifier_head="first_token_mlp", one_segment=True)
