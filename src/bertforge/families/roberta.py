"""RoBERTa (Liu et al. 2019): BERT's encoder with a byte-level BPE of 50k, <pad> = 1, positions counted from 2
(514 = 512 + pad + 1) and one segment; its MLM head is `lm_head`."""
from typing import Any

from bertforge.families.family import Family, Rules, bert_config_json

# RoBERTa's MLM head names (Longformer keeps them).
LM_HEAD_RULES: Rules = (
    (r"^cls\.predictions\.transform\.dense\.", "lm_head.dense."),
    (r"^cls\.predictions\.transform\.LayerNorm\.", "lm_head.layer_norm."),
    (r"^cls\.predictions\.bias$", "lm_head.bias"),
    (r"^cls\.predictions\.decoder\.", "lm_head.decoder."),
)


def config_json(cfg: Any) -> dict[str, Any]:
    return {**bert_config_json(cfg), "bos_token_id": 0, "eos_token_id": 2}


FAMILY = Family("roberta", "Roberta", "roberta", write_config=config_json,
                weight_rules=(*LM_HEAD_RULES, (r"^bert\.", "roberta.")), presets={"roberta-base": ("base", {})},
                vocab_size=50265, pad_token_id=1, max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5,
                positions_after_padding=True, causal_encoder=True, lm_head_activation="gelu",
                classifier_head="first_token_mlp", one_segment=True)
